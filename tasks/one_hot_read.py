"""The memory's answer when every stored value is a one-hot code, without forming the codes.

The retrieval tasks store v_t = onehot(value_t) ∈ R^S. For softmax attention and the sum rule the
answer to a query is linear in the values, y = Σ_t a_t v_t with read weights a_t that depend only
on the keys and the query, so y is the weights a_t added into the columns value_t:
O(B·T·T_q) work instead of the O(B·T·T_q·S) product with a dense (B, T, S) table of codes (and
the O(B·T·S) gather that builds it), which at S=600 dominated a training step. What is computed
is the variant's own read (same scores, same normaliser and floor); only the sum's order changes.
The delta and FWM rules' read weights depend on the values through the write, so they keep the
dense codes (:func:`one_hot_codes`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fwbench.variants import Attention, FastWeightAttention, SoftmaxAttention
from fwbench.variants.checks import check_finite
from fwbench.variants.feature_maps import DPFP
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores
from fwbench.variants.kernels.limits import floor_for
from fwbench.variants.kernels.precision import compute_dtype


def reads_one_hot(attention: Attention) -> bool:
    """Whether :func:`one_hot_write_read` has a code-free path for ``attention``: softmax without a
    window, or a fast-weight variant with the sum rule."""
    if isinstance(attention, SoftmaxAttention):
        return attention.window is None
    return isinstance(attention, FastWeightAttention) and attention.update_rule.carries_normalizer


def one_hot_write_read(attention: Attention, k: Tensor, values: Tensor, q: Tensor, S: int) -> Tensor:
    """``attention.write_read(k, onehot(values), q)`` without the one-hot codes.

    k: (B, H, T, d_key) keys; values: (B, T) int64 value ids in [0, S) (the same for every head);
    q: (B, H, T_q, d_key) queries. Returns (B, H, T_q, S) in fp32 (float64 for float64 inputs).

    Softmax: weights softmax(q·k/√d_key) over the T keys (paper Eq. 1–2). Sum rule: weights
    φ(q)·φ(k_t) / max(Σ_t φ(q)·φ(k_t), floor) (paper Eq. 16–18, the sum rule's normaliser and its
    floor for the compute dtype, :func:`~variants.kernels.limits.floor_for`).

    Raises:
        ValueError: ``attention`` has no code-free path (see :func:`reads_one_hot`).
        NonFiniteError: q or k holds a NaN or ±inf while ``attention.check_finite`` is on.
    """
    if not reads_one_hot(attention):
        raise ValueError(f"attention: got {attention!r}; expected softmax without a window or a sum-rule variant")
    if attention.check_finite:
        check_finite(q=q, k=k)
    dtype = compute_dtype(q, k)
    if isinstance(attention, SoftmaxAttention):
        # K qᵀ (B, H, T, T_q), as the sum rule below: with one query per sequence the backward's key
        # gradient comes out as (T, d_key) rows, where q kᵀ's came out transposed and was copied
        scores = (k.to(dtype) @ q.to(dtype).mT) / math.sqrt(k.shape[-1])
        weights = torch.softmax(scores, dim=-2).mT  # (B, H, T_q, T)
    else:
        # K φ(q) (B, H, T, T_q) as the sum rule's kernel forms it: a matrix-vector product over
        # contiguous rows of φ(k) for one query, faster than φ(q) φ(k)ᵀ on CPU
        keys_q = _key_query_scores(attention, k, q).to(dtype)
        weights = (keys_q / keys_q.sum(dim=2, keepdim=True).clamp(min=floor_for(dtype))).mT
    columns = values[:, None, None, :].expand(weights.shape)
    return weights.new_zeros(*weights.shape[:-1], S).scatter_add_(-1, columns, weights)


def _key_query_scores(attention: FastWeightAttention, k: Tensor, q: Tensor) -> Tensor:
    """φ(k) φ(q)ᵀ (B, H, T, T_q) of a sum-rule read. DPFP with one query per sequence (Setting 1's
    training batches) takes :func:`dpfp_query_scores`, whose backward never forms the T × d_dot
    features or their gradient; other maps, and many queries, the product of the features."""
    feature_map = attention.feature_map
    phi_q = attention.phi(q, query=True)
    if (isinstance(feature_map, DPFP) and not attention.sum_normalize and q.shape[-2] == 1
            and feature_map.nu <= k.shape[-1]):
        return dpfp_query_scores(k, phi_q, feature_map.nu)
    dtype = compute_dtype(q, k)
    return attention.phi(k).to(dtype) @ phi_q.to(dtype).mT


def one_hot_codes(values: Tensor, S: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The one-hot codes (B, T, S) of value ids (B, T) in ``dtype``, written by a scatter into zeros
    (cheaper than gathering rows of an (S × S) identity)."""
    return torch.zeros(*values.shape, S, device=values.device, dtype=dtype).scatter_(-1, values[..., None], 1.0)
