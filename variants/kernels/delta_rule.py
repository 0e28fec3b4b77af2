"""The delta update rule, in three forms that agree (paper Section 4.2, Eq. 23–26).

Recurrence, for sum-normalised φ-mapped keys k_t and queries q_t, values v_t, write strengths β_t:

    v̄_t = W_{t−1} k_t                              (value currently stored under k_t)
    W_t = W_{t−1} + β_t (v_t − v̄_t) k_tᵀ           (replace it by a β_t-mix of old and new)
    y_t = W_t q_t                                  (read after the write)

Shapes: q, k (B, H, T, d_dot); v (B, H, T, d_v); β (B, H, T); W (B, H, d_v, d_dot).
Computed in fp32 whatever the input dtype; outputs come back in the dtype of ``v``; the state
stays fp32. ``W0`` is the state before the first token (zeros when ``None``).

The chunkwise form uses the WY representation / UT transform of Yang et al. 2024
(arXiv:2406.06484): inside a chunk with rows K, V, β and state S = Wᵀ before it, the corrected
values U (row t is β_t (v_t − W_{t−1} k_t)) solve the unit lower-triangular system

    (I + tril(diag(β) K Kᵀ, −1)) U = diag(β) (V − K S),

so that O = Q S + tril(Q Kᵀ) U and S ← S + Kᵀ U.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _initial_state(k: Tensor, v: Tensor, W0: Tensor | None) -> Tensor:
    B, H, _, d_dot = k.shape
    if W0 is None:
        return k.new_zeros(B, H, v.shape[-1], d_dot, dtype=torch.float32)
    return W0.float()


def delta_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One token at a time: O(1) memory per token; the reference. Returns (y, W_T)."""
    W = _initial_state(k, v, W0)
    q32, k32, v32, b32 = q.float(), k.float(), v.float(), beta.float()
    outputs = []
    for t in range(k.shape[2]):
        k_t = k32[:, :, t]
        v_bar = (W @ k_t[..., None]).squeeze(-1)
        correction = b32[:, :, t, None] * (v32[:, :, t] - v_bar)
        W = W + correction[..., None] * k_t[:, :, None, :]
        outputs.append((W @ q32[:, :, t, :, None]).squeeze(-1))
    y = torch.stack(outputs, dim=2) if outputs else v32.new_zeros(v.shape)
    return y.to(v.dtype), W


def delta_rule_chunk(
    q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor | None, Tensor]:
    """Chunkwise-parallel form via the UT transform (one triangular solve per chunk).

    A tail shorter than ``chunk_size`` is zero-padded with k = 0 and β = 0, which writes nothing,
    so the padding is exact. With ``q=None`` only the final state is computed (a pure write).
    Returns (y or None, W_T).
    """
    W = _initial_state(k, v, W0)
    B, H, T, d_dot = k.shape
    d_v = v.shape[-1]
    if T == 0:
        return (None if q is None else v.new_zeros(v.shape)), W
    C = min(chunk_size, T)
    n_chunks = -(-T // C)
    pad = n_chunks * C - T

    def chunked(x: Tensor) -> Tensor:
        x = torch.nn.functional.pad(x.float(), (0, 0, 0, pad))
        return x.view(B, H, n_chunks, C, x.shape[-1])

    kc, vc = chunked(k), chunked(v)
    bc = chunked(beta[..., None])
    # Solve (I + tril(diag(β) K Kᵀ, −1)) [W_y | U] = diag(β) [K | V] for all chunks at once.
    lower = (bc * (kc @ kc.mT)).tril(-1) + torch.eye(C, device=k.device, dtype=torch.float32)
    rhs = bc * torch.cat([kc, vc], dim=-1)
    solved = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    w_y, u = solved[..., :d_dot], solved[..., d_dot:]

    S = W.mT  # (B, H, d_dot, d_v): the orientation in which the chunk algebra reads naturally
    if q is None:
        for n in range(n_chunks):
            S = S + kc[:, :, n].mT @ (u[:, :, n] - w_y[:, :, n] @ S)
        return None, S.mT

    qc = chunked(q)
    scores = (qc @ kc.mT).tril()
    outputs = []
    for n in range(n_chunks):
        u_n = u[:, :, n] - w_y[:, :, n] @ S
        outputs.append(qc[:, :, n] @ S + scores[:, :, n] @ u_n)
        S = S + kc[:, :, n].mT @ u_n
    y = torch.stack(outputs, dim=2).reshape(B, H, n_chunks * C, d_v)[:, :, :T]
    return y.to(v.dtype), S.mT


def delta_rule_parallel(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The masked quadratic form: the UT transform over the whole sequence as one chunk.

    O(T²) memory and an O(T²·d) triangular solve; for short sequences and tests.
    """
    y, W = delta_rule_chunk(q, k, v, beta, W0, chunk_size=max(k.shape[2], 1))
    return y, W


def delta_rule_read(q: Tensor, W: Tensor) -> Tensor:
    """Read the memory with sum-normalised φ-mapped queries (B, H, T_q, d_dot): y = W q."""
    return q.float() @ W.mT
