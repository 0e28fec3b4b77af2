"""The sum update rule of linear attention, in three forms that agree (paper Section 3, Eq. 16–18).

Recurrence, for φ-mapped queries q_t and keys k_t (already through the feature map) and values v_t:

    W_t = W_{t−1} + v_t k_tᵀ                      (fast weight, d_v × d_dot)
    z_t = z_{t−1} + k_t                           (normaliser, d_dot)
    y_t = W_t q_t / max(z_tᵀ q_t, floor)          (``normalize=True``; else y_t = W_t q_t)

Shapes: q, k (B, H, T, d_dot); v (B, H, T, d_v); W (B, H, d_v, d_dot); z (B, H, d_dot).
Computed in the wider of the inputs' dtype and fp32 (:func:`~.precision.compute_dtype`: fp16,
bf16 and fp32 in fp32, float64 in float64); outputs come back in the dtype of ``v`` and the state
in the compute dtype. Every function takes the state before the first token (``W0``, ``z0``;
zeros when ``None``) and returns the state after the last one.

The normaliser is guarded by a floor, not by an added eps: z_tᵀ q_t is the query's total
attention mass, which can be far below any fixed eps (FAVOR+ features of N(0, 1) inputs at
d_key 32 give ≈ 1e-9), and an added 1e-6 would then shrink every output towards 0. With a floor
a row stays normalised for any mass above it, and an empty mass (φ(q) = 0, or no key written;
the numerator is then 0 too for non-negative features) reads as 0 rather than NaN. The floor
follows the compute dtype (``floor=None``, :mod:`.limits`): 1e-30 in fp32 (fp16 and bf16 too),
1e-300 in float64, so float64 rows stay normalised for masses fp32 cannot hold.

With NaN or ±inf among the inputs, the masked products inside a chunk go through
:func:`~.precision.causal_matmul`, so a non-finite token never reaches the outputs before it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .chunking import DEFAULT_CHUNK_SIZE, split_chunks
from .limits import FP32_LIMITS, floor_for
from .precision import all_finite, causal_matmul, compute_dtype

#: fp32's smallest value of the normaliser zᵀq that the output is divided by (see the module
#: docstring); every kernel's ``floor=None`` takes its compute dtype's (:mod:`.limits`: 1e-30 in fp32,
#: 1e-300 in float64). Far below any mass the feature maps produce (FAVOR+ guarantees ≥ e^-60 per key
#: in fp32, see :class:`~variants.feature_maps.Favor`), far above the dtype's smallest normal number,
#: so that 1 / floor and the gradients through it stay finite. The paper's official code adds 1e-6.
NORMALIZER_FLOOR = FP32_LIMITS.floor


def _initial_state(q: Tensor, v: Tensor, W0: Tensor | None, z0: Tensor | None, dtype: torch.dtype):
    B, H, _, d_dot = q.shape
    d_v = v.shape[-1]
    W = q.new_zeros(B, H, d_v, d_dot, dtype=dtype) if W0 is None else W0.to(dtype)
    z = q.new_zeros(B, H, d_dot, dtype=dtype) if z0 is None else z0.to(dtype)
    return W, z


def _masked_product(finite: bool):
    """``tril(A) @ X`` as a plain matmul, or causally when the inputs hold NaN/inf."""
    return torch.matmul if finite else causal_matmul


def sum_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, floor: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One token at a time: O(1) memory per token; the reference the other forms must match.

    Returns (y (B, H, T, d_v), W_T, z_T).
    """
    dtype = compute_dtype(q, k, v, W0, z0)
    floor = floor_for(dtype, floor)
    W, z = _initial_state(q, v, W0, z0, dtype)
    outputs = []
    # unbind, not q[:, :, t]: its backward is one stack instead of a full-size zero gradient per
    # token, which would make the backward quadratic in T.
    for q_t, k_t, v_t in zip(q.to(dtype).unbind(2), k.to(dtype).unbind(2), v.to(dtype).unbind(2), strict=True):
        W = W + v_t[..., None] * k_t[:, :, None, :]
        z = z + k_t
        y = (W @ q_t[..., None]).squeeze(-1)
        if normalize:
            y = y / (z * q_t).sum(-1, keepdim=True).clamp(min=floor)
        outputs.append(y)
    y = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape, dtype=dtype)
    return y.to(v.dtype), W, z


def sum_rule_parallel(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, floor: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The masked quadratic form: y = (tril(QKᵀ) V + Q W0ᵀ) / max(tril(QKᵀ) 1 + Q z0, floor).

    O(T²) memory; for short sequences and tests. Returns (y, W_T, z_T).
    """
    dtype = compute_dtype(q, k, v, W0, z0)
    floor = floor_for(dtype, floor)
    W, z = _initial_state(q, v, W0, z0, dtype)
    q32, k32, v32 = q.to(dtype), k.to(dtype), v.to(dtype)
    scores = (q32 @ k32.mT).tril()
    numerator = _masked_product(all_finite(q, k, v))(scores, v32) + q32 @ W.mT
    y = numerator
    if normalize:
        y = numerator / (scores.sum(-1, keepdim=True) + q32 @ z[..., None]).clamp(min=floor)
    W = W + v32.mT @ k32
    z = z + k32.sum(dim=2)
    return y.to(v.dtype), W, z


def sum_rule_chunk(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, floor: float | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor, Tensor]:
    """Chunkwise-parallel form: masked matmuls inside each chunk, the state carried across.

    For chunk n with rows Q_n, K_n, V_n and state S = Wᵀ, z before it:

        y_n = (tril(Q_n K_nᵀ) V_n + Q_n S) / max(tril(Q_n K_nᵀ) 1 + Q_n z, floor)
        S ← S + K_nᵀ V_n,   z ← z + K_nᵀ 1.

    The intra-chunk scores are computed for all chunks at once; the loop over chunks carries
    one state, so without autograd no per-chunk state is kept (memory O(T·d + d_dot·d_v)).
    Each chunk's state is built from earlier chunks only, never as a cumulative sum minus its
    own write (whose cancellation would let later tokens leak into earlier outputs).

    Any T works: C is capped at T and a shorter tail is zero-padded (zero keys write nothing).
    Shapes as in the module docstring; returns (y (B, H, T, d_v) in v's dtype, W_T, z_T) fp32.
    """
    dtype = compute_dtype(q, k, v, W0, z0)
    floor = floor_for(dtype, floor)
    W, z = _initial_state(q, v, W0, z0, dtype)
    B, H, T, d_dot = q.shape
    if T == 0:
        return v.new_zeros(v.shape), W, z
    d_v = v.shape[-1]
    qc, kc, vc = split_chunks([q, k, v], chunk_size, dtype)
    masked_product = _masked_product(all_finite(q, k, v))
    n_chunks, C = qc.shape[2], qc.shape[3]
    scores = (qc @ kc.mT).tril_()                       # tril(QKᵀ) for every chunk at once
    S = W.mT.reshape(B * H, d_dot, d_v)                 # Wᵀ
    z = z.reshape(B * H, d_dot, 1)

    def per_chunk(x: Tensor) -> tuple[Tensor, ...]:
        return x.flatten(0, 1).unbind(1)  # n_chunks tensors of (B·H, C, ·): 3-D for baddbmm

    outputs = []
    chunks = zip(per_chunk(qc), per_chunk(kc), per_chunk(vc), per_chunk(scores), strict=True)
    for q_n, k_n, v_n, scores_n in chunks:
        y_n = torch.baddbmm(masked_product(scores_n, v_n), q_n, S)      # tril(QKᵀ) V + Q Wᵀ
        if normalize:
            # divided chunk by chunk, while y_n is small and in cache
            y_n = y_n / torch.baddbmm(scores_n.sum(-1, keepdim=True), q_n, z).clamp_(min=floor)
        outputs.append(y_n)
        S = torch.baddbmm(S, k_n.mT, v_n)                               # Wᵀ + KᵀV
        z = z + k_n.sum(1)[..., None]                                   # z + Kᵀ1
    y = torch.stack(outputs, dim=1).view(B, H, n_chunks * C, d_v)[:, :, :T]
    return y.to(v.dtype), S.view(B, H, d_dot, d_v).mT, z.view(B, H, d_dot)


def sum_rule_write(
    k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Write every (k_t, v_t) into the memory without reading: W ← W + Vᵀ K, z ← z + Σ K."""
    dtype = compute_dtype(k, v, W0, z0)
    W, z = _initial_state(k, v, W0, z0, dtype)
    k32 = k.to(dtype)
    return W + v.to(dtype).mT @ k32, z + k32.sum(dim=2)


def sum_rule_write_read(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, floor: float | None = None,
) -> Tensor:
    """Read with queries q after writing all of (k, v), without forming W: y = W_T q / (z_Tᵀ q).

    W_T q = W_0 q + Vᵀ (K q) and z_Tᵀ q = z_0ᵀ q + 1ᵀ (K q): O(T·T_q·d) instead of the
    O(T·d_dot·d_v) write. Shapes as :func:`sum_rule_read` plus k (B, H, T, d_dot), v (B, H, T, d_v).
    """
    dtype = compute_dtype(q, k, v, W0, z0)
    floor = floor_for(dtype, floor)
    q32 = q.to(dtype)
    keys_q = k.to(dtype) @ q32.mT                                          # K q, (B, H, T, T_q)
    y = keys_q.mT @ v.to(dtype)
    if W0 is not None:
        y = y + q32 @ W0.to(dtype).mT
    if normalize:
        denominator = keys_q.sum(dim=2)[..., None]
        if z0 is not None:
            denominator = denominator + q32 @ z0.to(dtype)[..., None]
        y = y / denominator.clamp(min=floor)
    return y


def sum_rule_read(
    q: Tensor, W: Tensor, z: Tensor, normalize: bool = True, floor: float | None = None
) -> Tensor:
    """Read the memory with φ-mapped queries q (B, H, T_q, d_dot) without writing: W q / max(zᵀq, floor),
    in the compute dtype of q and the state."""
    dtype = compute_dtype(q, W, z)
    floor = floor_for(dtype, floor)
    q32 = q.to(dtype)
    y = q32 @ W.to(dtype).mT
    if normalize:
        y = y / (q32 @ z.to(dtype)[..., None]).clamp(min=floor)
    return y
