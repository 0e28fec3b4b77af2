"""The sum update rule of linear attention, in three forms that agree (paper Section 3, Eq. 16–18).

Recurrence, for φ-mapped queries q_t and keys k_t (already through the feature map) and values v_t:

    W_t = W_{t−1} + v_t k_tᵀ                      (fast weight, d_v × d_dot)
    z_t = z_{t−1} + k_t                           (normaliser, d_dot)
    y_t = W_t q_t / (z_tᵀ q_t + eps)              (``normalize=True``; else y_t = W_t q_t)

Shapes: q, k (B, H, T, d_dot); v (B, H, T, d_v); W (B, H, d_v, d_dot); z (B, H, d_dot).
Inputs of any float dtype are computed in fp32; outputs come back in the dtype of ``v`` and the
state stays fp32. Every function takes the state before the first token (``W0``, ``z0``; zeros
when ``None``) and returns the state after the last one.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Added to the normaliser zᵀq, as in the paper's official code.
NORMALIZER_EPS = 1e-6


def _initial_state(q: Tensor, v: Tensor, W0: Tensor | None, z0: Tensor | None):
    B, H, _, d_dot = q.shape
    d_v = v.shape[-1]
    W = q.new_zeros(B, H, d_v, d_dot, dtype=torch.float32) if W0 is None else W0.float()
    z = q.new_zeros(B, H, d_dot, dtype=torch.float32) if z0 is None else z0.float()
    return W, z


def _exclusive_cumsum(x: Tensor, start: Tensor) -> Tensor:
    """``start`` + Σ_{m < n} x[:, :, m] for every chunk n of x (B, H, n_chunks, ...)."""
    shifted = torch.cat([start[:, :, None], x[:, :, :-1]], dim=2)
    return torch.cumsum(shifted, dim=2)


def sum_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, eps: float = NORMALIZER_EPS,
) -> tuple[Tensor, Tensor, Tensor]:
    """One token at a time: O(1) memory per token; the reference the other forms must match.

    Returns (y (B, H, T, d_v), W_T, z_T).
    """
    W, z = _initial_state(q, v, W0, z0)
    q32, k32, v32 = q.float(), k.float(), v.float()
    outputs = []
    for t in range(q.shape[2]):
        W = W + v32[:, :, t, :, None] * k32[:, :, t, None, :]
        z = z + k32[:, :, t]
        y = (W @ q32[:, :, t, :, None]).squeeze(-1)
        if normalize:
            y = y / ((z * q32[:, :, t]).sum(-1, keepdim=True) + eps)
        outputs.append(y)
    y = torch.stack(outputs, dim=2) if outputs else v32.new_zeros(v.shape)
    return y.to(v.dtype), W, z


def sum_rule_parallel(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, eps: float = NORMALIZER_EPS,
) -> tuple[Tensor, Tensor, Tensor]:
    """The masked quadratic form: y = (tril(QKᵀ) V + Q W0ᵀ) / (tril(QKᵀ) 1 + Q z0 + eps).

    O(T²) memory; for short sequences and tests. Returns (y, W_T, z_T).
    """
    W, z = _initial_state(q, v, W0, z0)
    q32, k32, v32 = q.float(), k.float(), v.float()
    scores = (q32 @ k32.mT).tril()
    numerator = scores @ v32 + q32 @ W.mT
    y = numerator
    if normalize:
        y = numerator / (scores.sum(-1, keepdim=True) + q32 @ z[..., None] + eps)
    W = W + v32.mT @ k32
    z = z + k32.sum(dim=2)
    return y.to(v.dtype), W, z


def sum_rule_chunk(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, eps: float = NORMALIZER_EPS, chunk_size: int = 64,
) -> tuple[Tensor, Tensor, Tensor]:
    """Chunkwise-parallel form: masked matmuls inside each chunk, the state W carried across.

    For chunk n with rows Q_n, K_n, V_n and state (W, z) before it:
    y_n = (tril(Q_n K_nᵀ) V_n + Q_n Wᵀ) / (tril(Q_n K_nᵀ) 1 + Q_n z + eps);
    W ← W + V_nᵀ K_n, z ← z + Σ K_n. A tail shorter than ``chunk_size`` is zero-padded; zero
    keys write nothing, so the padding is exact. Returns (y, W_T, z_T).
    """
    W, z = _initial_state(q, v, W0, z0)
    B, H, T, d_dot = q.shape
    d_v = v.shape[-1]
    if T == 0:
        return v.new_zeros(v.shape), W, z
    C = chunk_size
    n_chunks = -(-T // C)
    pad = n_chunks * C - T
    q32, k32, v32 = (torch.nn.functional.pad(x.float(), (0, 0, 0, pad)) for x in (q, k, v))
    qc = q32.view(B, H, n_chunks, C, d_dot)
    kc = k32.view(B, H, n_chunks, C, d_dot)
    vc = v32.view(B, H, n_chunks, C, d_v)

    # State before each chunk: exclusive prefix sum of the per-chunk writes Vₙᵀ Kₙ. Computed
    # from the earlier chunks only (not as cumsum − own write, whose rounding and cancellation
    # would let a chunk's later tokens leak into its earlier outputs).
    writes = vc.mT @ kc
    W_before = _exclusive_cumsum(writes, W)
    scores = (qc @ kc.mT).tril()
    y = scores @ vc + qc @ W_before.mT
    if normalize:
        key_sums = kc.sum(dim=3)
        z_before = _exclusive_cumsum(key_sums, z)
        y = y / (scores.sum(-1, keepdim=True) + qc @ z_before[..., None] + eps)
        z = z_before[:, :, -1] + key_sums[:, :, -1]
    else:
        z = z + kc.sum(dim=(2, 3))
    W = W_before[:, :, -1] + writes[:, :, -1]
    y = y.reshape(B, H, n_chunks * C, d_v)[:, :, :T]
    return y.to(v.dtype), W, z


def sum_rule_write(
    k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Write every (k_t, v_t) into the memory without reading: W ← W + Vᵀ K, z ← z + Σ K."""
    W, z = _initial_state(k, v, W0, z0)
    return W + v.float().mT @ k.float(), z + k.float().sum(dim=2)


def sum_rule_read(
    q: Tensor, W: Tensor, z: Tensor, normalize: bool = True, eps: float = NORMALIZER_EPS
) -> Tensor:
    """Read the memory with φ-mapped queries q (B, H, T_q, d_dot) without writing: W q / (zᵀq)."""
    q32 = q.float()
    y = q32 @ W.mT
    if normalize:
        y = y / (q32 @ z[..., None] + eps)
    return y
