"""The paper's two official retrieval models, rebuilt for tests as the official code builds them.

The official repository (``synthetic/softmaxAttention.py``, ``synthetic/linearAttention.py``) has one
model for softmax attention and one for every linear-attention variant. Both are rebuilt here with
the same modules created in the same order and the same ``reset_parameters``, so that a seed gives
the official initial weights; :func:`dense_scores` is the official forward up to the attention
scores. Nothing here is imported from fwbench's retrieval model: it is the independent reference.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class OfficialRetrievalModel(nn.Module):
    """``SoftmaxAttentionModel`` (``softmax=True``) or ``PrefixSumLinearAttentionModel``.

    Vocabulary: S keys then S values (2S ids); tokens are [onehot(v); e(k)] of size S + e.
    """

    def __init__(self, softmax: bool, S: int, embedding_size: int, d_key: int):
        super().__init__()
        self.softmax, self.S, self.d_key = softmax, S, d_key
        self.embeddingV = nn.Embedding(S, S)
        self.embeddingK = nn.Embedding(2 * S, embedding_size)
        self.W_k = nn.Linear(embedding_size + S, d_key)
        self.W_v = nn.Linear(embedding_size + S, d_key)
        self.W_q = nn.Linear(embedding_size, d_key)
        if not softmax:
            self.W_f = nn.Linear(embedding_size + S, d_key)
            self.W_b = nn.Linear(embedding_size + S, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.embeddingV.weight = nn.Parameter(torch.eye(self.S), requires_grad=False)
        nn.init.normal_(self.embeddingK.weight, mean=0.0, std=1.0)
        nn.init.xavier_uniform_(self.W_v.weight)
        if self.softmax:
            nn.init.xavier_uniform_(self.W_k.weight)
            nn.init.xavier_uniform_(self.W_q.weight)
        else:
            u = 1 / math.sqrt(self.d_key)
            nn.init.uniform_(self.W_k.weight, a=-u, b=u)
            nn.init.uniform_(self.W_q.weight, a=-u, b=u)


def official_model(softmax: bool, S: int, embedding_size: int, d_key: int, seed: int) -> OfficialRetrievalModel:
    """The official model right after ``torch.manual_seed(seed)`` (as the official ``run`` does)."""
    torch.manual_seed(seed)
    return OfficialRetrievalModel(softmax, S, embedding_size, d_key)


@torch.no_grad()
def dense_scores(W_k: Tensor, b_k: Tensor, W_q: Tensor, b_q: Tensor, key_embedding: Tensor,
                 keys: Tensor, values: Tensor, queries: Tensor) -> Tensor:
    """Attention scores q·k/√d_key (B, Q, L) of the official forward, before any softmax or φ.

    Whole-token weights W_k (d_key, S + e), W_q (d_key, e); key embedding (≥S, e); keys, values
    (B, L) and queries (B, Q) as ids in [0, S).
    """
    S = W_k.shape[1] - key_embedding.shape[1]
    tokens = torch.cat([torch.eye(S)[values], key_embedding[keys]], dim=-1)
    k = tokens @ W_k.T + b_k
    q = key_embedding[queries] @ W_q.T + b_q
    return q @ k.mT / math.sqrt(W_k.shape[0])
