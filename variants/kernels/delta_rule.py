"""The delta update rule, in three forms that agree (paper Section 4.2, Eq. 23–26).

Recurrence, for sum-normalised φ-mapped keys k_t and queries q_t, values v_t, write strengths β_t:

    v̄_t = W_{t−1} k_t                              (value currently stored under k_t)
    W_t = W_{t−1} + β_t (v_t − v̄_t) k_tᵀ           (replace it by a β_t-mix of old and new)
    y_t = W_t q_t                                  (read after the write)

Shapes: q, k (B, H, T, d_dot); v (B, H, T, d_v); β (B, H, T); W (B, H, d_v, d_dot).
Computed in fp32 whatever the input dtype (fp16 and bf16 inputs accumulate the state in fp32);
outputs come back in the dtype of ``v``; the state stays fp32. ``W0`` is the state before the
first token (zeros when ``None``).

The chunkwise form uses the WY representation / UT transform of Yang et al. 2024
(arXiv:2406.06484, Section 3): inside a chunk with rows K, V, β and state S = Wᵀ (d_dot, d_v)
before it,

    T_c = (I + tril(diag(β) K Kᵀ, −1))⁻¹ diag(β)      (a unit lower-triangular solve)
    W_c = T_c K,  U = T_c V                            (the WY factors)
    O   = Q S + tril(Q Kᵀ) (U − W_c S)
    S  ← S + Kᵀ (U − W_c S).

T_c and the scores tril(Q Kᵀ) are computed for all chunks at once; the loop over chunks carries
S with five small matmuls per chunk, using U − W_c S = T_c (V − K S).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .chunking import split_chunks
from .gram import gram


def _initial_state(k: Tensor, v: Tensor, W0: Tensor | None) -> Tensor:
    B, H, _, d_dot = k.shape
    if W0 is None:
        return k.new_zeros(B, H, v.shape[-1], d_dot, dtype=torch.float32)
    return W0.float()


def delta_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One token at a time: O(1) memory per token without autograd; the reference.

    Returns (y (B, H, T, d_v), W_T (B, H, d_v, d_dot)).
    """
    W = _initial_state(k, v, W0)
    outputs = []
    # unbind, not k[:, :, t]: the backward of unbind is one stack, while indexing would build a
    # full-size zero gradient per token and make the backward quadratic in T.
    steps = zip(q.float().unbind(2), k.float().unbind(2), v.float().unbind(2), beta.float().unbind(2), strict=True)
    for q_t, k_t, v_t, b_t in steps:
        v_bar = (W @ k_t[..., None]).squeeze(-1)                 # v̄_t = W_{t−1} k_t
        correction = b_t[..., None] * (v_t - v_bar)              # β_t (v_t − v̄_t)
        W = W + correction[..., None] * k_t[:, :, None, :]       # W_t
        outputs.append((W @ q_t[..., None]).squeeze(-1))         # y_t = W_t q_t
    y = torch.stack(outputs, dim=2) if outputs else v.float().new_zeros(v.shape)
    return y.to(v.dtype), W


def delta_rule_chunk(
    q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor | None, Tensor]:
    """Chunkwise-parallel form via the UT transform (triangular solves, then one loop over chunks).

    Args:
        q, k: (B, H, T, d_dot) sum-normalised φ-mapped queries and keys (``q=None``: only the
            final state is computed, a pure write).
        v: (B, H, T, d_v); beta: (B, H, T) in [0, 1]; W0: (B, H, d_v, d_dot) or ``None``.
        chunk_size: tokens per chunk C; any T works (C is capped at T; a shorter tail is
            zero-padded with k = 0 and β = 0, which writes nothing, so the padding is exact).

    Returns (y (B, H, T, d_v) in v's dtype, or ``None``; W_T (B, H, d_v, d_dot) fp32).
    Cost O(T·C·d + T·d_dot·d_v) time; memory O(T·d) plus, with autograd, one state per chunk.
    """
    W = _initial_state(k, v, W0)
    B, H, T, d_dot = k.shape
    d_v = v.shape[-1]
    if T == 0:
        return (None if q is None else v.new_zeros(v.shape)), W
    kc, vc, bc = split_chunks([k, v, beta[..., None]], chunk_size)
    n_chunks, C = kc.shape[2], kc.shape[3]
    # T_c for every chunk: solve (I + tril(diag(β) K Kᵀ, −1)) T_c = diag(β). solve_triangular
    # reads only the strict lower triangle (unitriangular), so the Gram matrix needs no tril, no + I.
    lower = gram(kc) * bc                                                 # diag(β) K Kᵀ
    T_c = torch.linalg.solve_triangular(lower, torch.diag_embed(bc.squeeze(-1)), upper=False, unitriangular=True)
    S = W.mT.reshape(B * H, d_dot, d_v)  # Wᵀ, the orientation in which the chunk algebra reads naturally

    def per_chunk(x: Tensor) -> tuple[Tensor, ...]:
        return x.flatten(0, 1).unbind(1)  # n_chunks tensors of (B·H, C, ·): 3-D for baddbmm

    # U − W_c S = T_c (V − K S): applying T_c inside the loop means the WY factors W_c = T_c K and
    # U = T_c V are never materialised, saving two (B, H, T, ·) tensors and the 2·C²·d_dot FLOPs
    # per chunk of W_c.
    if q is None:
        for k_n, v_n, T_n in zip(per_chunk(kc), per_chunk(vc), per_chunk(T_c), strict=True):
            correction = T_n @ torch.baddbmm(v_n, k_n, S, alpha=-1)      # U − W_c S
            S = torch.baddbmm(S, k_n.mT, correction)                      # S + Kᵀ (U − W_c S)
        return None, S.view(B, H, d_dot, d_v).mT

    (qc,) = split_chunks([q], chunk_size)
    scores = (qc @ kc.mT).tril_()                                         # tril(Q Kᵀ)
    outputs = []
    for q_n, k_n, v_n, T_n, scores_n in zip(
        per_chunk(qc), per_chunk(kc), per_chunk(vc), per_chunk(T_c), per_chunk(scores), strict=True
    ):
        correction = T_n @ torch.baddbmm(v_n, k_n, S, alpha=-1)          # U − W_c S
        outputs.append(torch.baddbmm(scores_n @ correction, q_n, S))     # Q S + tril(QKᵀ)(U − W_c S)
        S = torch.baddbmm(S, k_n.mT, correction)                          # S + Kᵀ (U − W_c S)
    y = torch.stack(outputs, dim=1).view(B, H, n_chunks * C, d_v)[:, :, :T]
    return y.to(v.dtype), S.view(B, H, d_dot, d_v).mT


def delta_rule_write_read(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None, chunk_size: int = 32,
) -> Tensor:
    """Read the memory with queries q after writing all of (k, v, β), without forming W.

    Equal to ``delta_rule_read(q, W_T)`` with ``W_T`` from :func:`delta_rule_chunk`. Chunk n maps
    the state as S_{n+1} = (I − K_nᵀ T_n K_n) S_n + K_nᵀ T_n V_n (S = Wᵀ, T_n the UT transform),
    so the read qᵀ S_N unrolls backwards over the chunks with a query p instead of a state:

        p_N = q;   x_n = T_nᵀ K_n p_{n+1};   y += V_nᵀ x_n;   p_n = p_{n+1} − K_nᵀ x_n;   y += S_0ᵀ p_0.

    T_nᵀ x = diag(β) (I + tril(diag(β) K Kᵀ, −1))⁻ᵀ x is one triangular solve with T_q columns.
    The cost is O(T·(C + T_q)·d_dot + T·T_q·d_v), linear in T and with no d_dot × d_v state: far
    below a write when few queries follow a sequence, as in the retrieval tasks (Section 6.1).

    Shapes: q (B, H, T_q, d_dot); k (B, H, T, d_dot); v (B, H, T, d_v); β (B, H, T);
    W0 (B, H, d_v, d_dot) or ``None``. Returns y (B, H, T_q, d_v) fp32.
    """
    p = q.float()
    y = p.new_zeros(*q.shape[:3], v.shape[-1])
    if k.shape[2]:
        kc, vc, bc = split_chunks([k, v, beta[..., None]], chunk_size)
        lower = gram(kc) * bc                                               # diag(β) K Kᵀ per chunk
        chunks = zip(kc.unbind(2), vc.unbind(2), bc.unbind(2), lower.unbind(2), strict=True)
        for k_n, v_n, b_n, lower_n in reversed(list(chunks)):
            x = torch.linalg.solve_triangular(lower_n.mT, k_n @ p.mT, upper=True, unitriangular=True) * b_n
            y = y + x.mT @ v_n                                               # + V_nᵀ T_nᵀ K_n p
            p = p - x.mT @ k_n                                               # (I − K_nᵀ T_n K_n)ᵀ p
    if W0 is not None:
        y = y + p @ W0.float().mT
    return y


def delta_rule_parallel(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The masked quadratic form: the whole sequence as one chunk, solved directly.

        U' = (I + tril(diag(β) K Kᵀ, −1))⁻¹ diag(β) (V − K S_0)       (= U − W_c S_0)
        Y  = Q S_0 + tril(Q Kᵀ) U',   S_T = S_0 + Kᵀ U'

    O(T²) memory and an O(T²·(d_dot + d_v)) triangular solve; for short sequences and tests.
    """
    W = _initial_state(k, v, W0)
    if k.shape[2] == 0:
        return v.new_zeros(v.shape), W
    q32, k32, v32, b32 = q.float(), k.float(), v.float(), beta.float()[..., None]
    S0 = W.mT
    corrections = torch.linalg.solve_triangular(
        gram(k32) * b32, b32 * (v32 - k32 @ S0), upper=False, unitriangular=True
    )
    y = q32 @ S0 + (q32 @ k32.mT).tril() @ corrections
    return y.to(v.dtype), (S0 + k32.mT @ corrections).mT


def delta_rule_read(q: Tensor, W: Tensor) -> Tensor:
    """Read the memory with sum-normalised φ-mapped queries (B, H, T_q, d_dot): y = W q."""
    return q.float() @ W.mT
