"""The Fast Weight Memory (FWM) update rule, recurrent form only.

Schlag, Munkhdalai & Schmidhuber, "Learning Associative Inference Using Fast Weight Memory",
ICLR 2021; the rule the paper (Schlag, Irie & Schmidhuber 2021, Section 6.1, Setting 2) compares
its delta rule with. For φ-mapped keys k_t and queries q_t (*not* sum-normalised), values v_t and
write strengths β_t:

    v̄_t = W_{t−1} k_t                                  (value currently stored under k_t)
    W'_t = W_{t−1} + β_t (v_t − v̄_t) k_tᵀ             (the delta rule's replacement)
    W_t = W'_t / max(1, ‖W'_t‖_F)                     (rescale: keeps the memory bounded)
    y_t = LayerNorm(W_t q_t)                          (over d_v, no affine parameters)

Shapes: q, k (B, H, T, d_dot); v (B, H, T, d_v); β (B, H, T); W (B, H, d_v, d_dot), one Frobenius
norm per (batch, head) matrix. Computed in fp32, or float64 for float64 inputs; outputs come back
in the dtype of ``v``; the state stays in that compute dtype. ``W0`` is the state before the first token (zeros if None).

Why there is no parallel or chunk form: the rescaling divides by a norm of the running state, a
non-linear function of every earlier write, so the writes do not compose into a product of
matrices that a chunked scan or a triangular solve could evaluate. The modules in
:mod:`variants.attention` therefore only offer ``form="recurrent"`` (and ``"auto"``) for it.

Differences from the official synthetic-task code (``synthetic/linearAttention.py`` of the paper's
repository), facts only: it skips the rescaling after the very first write (W_1 = β_1 v_1 k_1ᵀ);
here every write is followed by the rescaling, as the rule is stated. Its layer norm uses torch's
default eps (1e-5), as here: when ‖W q‖ is small, eps dominates the variance and the layer norm
acts as a fixed gain of about 1/√eps, which is how a trained FWM can reach a small ½‖v − y‖².
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .precision import compute_dtype

#: Layer-norm eps of the read-out, torch's default (the official code's value).
FWM_LAYER_NORM_EPS = 1e-5


def _initial_state(k: Tensor, v: Tensor, W0: Tensor | None) -> Tensor:
    B, H, _, d_dot = k.shape
    if W0 is None:
        return k.new_zeros(B, H, v.shape[-1], d_dot, dtype=compute_dtype(k, v))
    return W0.to(compute_dtype(k, v, W0))


def _write_one(W: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor) -> Tensor:
    """One FWM write: the delta-rule replacement, then the rescaling by max(1, ‖W‖_F)."""
    v_bar = (W @ k_t[..., None]).squeeze(-1)
    W = W + (beta_t[..., None] * (v_t - v_bar))[..., None] * k_t[:, :, None, :]
    # sqrt(max(1, ‖W‖²)) rather than max(1, ‖W‖): equal values, but finite gradients at W = 0.
    squared_norm = W.pow(2).sum(dim=(-2, -1), keepdim=True)
    return W / squared_norm.clamp(min=1.0).sqrt()


def fwm_rule_read(q: Tensor, W: Tensor, eps: float = FWM_LAYER_NORM_EPS) -> Tensor:
    """Read the memory with φ-mapped queries (B, H, T_q, d_dot): y = LayerNorm(W q), fp32."""
    y = q.to(W.dtype) @ W.mT
    return F.layer_norm(y, (y.shape[-1],), eps=eps)


def fwm_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None,
    eps: float = FWM_LAYER_NORM_EPS,
) -> tuple[Tensor, Tensor]:
    """One token at a time (write, then read). Returns (y (B, H, T, d_v), W_T)."""
    W = _initial_state(k, v, W0)
    q32, k32, v32, b32 = (x.to(W.dtype) for x in (q, k, v, beta))
    outputs = []
    for t in range(k.shape[2]):
        W = _write_one(W, k32[:, :, t], v32[:, :, t], b32[:, :, t])
        outputs.append((W @ q32[:, :, t, :, None]).squeeze(-1))
    if not outputs:
        return v.new_zeros(v.shape), W
    y = torch.stack(outputs, dim=2)
    return F.layer_norm(y, (y.shape[-1],), eps=eps).to(v.dtype), W


def fwm_rule_write(k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None) -> Tensor:
    """Store every (k_t, v_t) without reading; returns W_T (B, H, d_v, d_dot)."""
    W = _initial_state(k, v, W0)
    k32, v32, b32 = (x.to(W.dtype) for x in (k, v, beta))
    for t in range(k.shape[2]):
        W = _write_one(W, k32[:, :, t], v32[:, :, t], b32[:, :, t])
    return W
