"""DPFP features (paper Section 5.3, Eq. 27–28), optionally sum-normalised, as one autograd op.

    r(x) = [relu(x), relu(−x)] ∈ R^{2d},   φ_{(i−1)·2d + j}(x) = r_j · r_{(j − i) mod 2d},  i = 1..ν
    φ̂(x) = φ(x) / max(Σ_j φ_j(x), floor)                             (delta rule, Eq. 23)

Written with ``out=`` and in-place updates so that the forward allocates two (…, 2d·ν)-sized
tensors and the backward three, where the composition of torch ops allocates about a dozen: the
feature map runs on every key and query, and on CPU each large temporary costs page faults and
memory traffic comparable to the attention kernel itself. Computed in the wider of the input's
dtype and fp32 (float64 stays float64, so that gradcheck sees the true backward); the gradient
comes back in the input's dtype. Under ``create_graph=True`` the backward differentiates
:func:`dpfp_composed` instead (:mod:`.double_backward`), so second derivatives are exact.

The sum normalisation divides by max(Σ_j φ_j, floor) rather than by Σ_j φ_j + eps: an added eps
would dominate the sum of small inputs (Σφ ≈ ‖x‖², 1e-6 at ‖x‖ = 1e-3) and shrink φ̂ far below
a unit sum, while the floor leaves φ̂ summing to 1 at every scale where Σφ exceeds it, and still
maps x = 0 (φ = 0) to φ̂ = 0. The floor follows the compute dtype (:mod:`.limits`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .double_backward import apply_unrecorded_in_inference_mode, grad_by_recomputation
from .limits import floor_for
from .precision import compute_dtype


def _products(r: Tensor, nu: int) -> Tensor:
    """φ from r (…, n): block i holds r_j · r_{(j − i) mod n}."""
    n = r.shape[-1]
    phi = r.new_empty(*r.shape[:-1], n * nu)
    for i in range(1, nu + 1):
        block = phi[..., (i - 1) * n : i * n]
        torch.mul(r[..., i:], r[..., : n - i], out=block[..., i:])
        torch.mul(r[..., :i], r[..., n - i :], out=block[..., :i])
    return phi


class _DPFP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, nu: int, normalize: bool, floor: float | None) -> Tensor:
        x32 = x.to(compute_dtype(x))
        floor = floor_for(x32.dtype, floor)
        d = x.shape[-1]
        r = x32.new_empty(*x.shape[:-1], 2 * d)
        torch.clamp(x32, min=0, out=r[..., :d])
        torch.neg(x32, out=r[..., d:]).clamp_(min=0)
        phi = _products(r, nu)
        inv = floored = None
        if normalize:
            total = phi.sum(dim=-1, keepdim=True)
            floored = total < floor  # rows divided by the floor: φ̂ = φ / floor, no longer scale-free
            inv = total.clamp_(min=floor).reciprocal_()
            phi.mul_(inv)
        ctx.nu, ctx.normalize, ctx.floor, ctx.input_dtype = nu, normalize, floor, x.dtype
        ctx.save_for_backward(x, r, phi if normalize else None, inv, floored)
        return phi

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, r, phi, inv, floored = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: r, φ̂ and inv would be constants below
            (grad_x,) = grad_by_recomputation(
                lambda x: (dpfp_composed(x, ctx.nu, ctx.normalize, ctx.floor),), (x,), (grad,))
            return grad_x, None, None, None
        n = r.shape[-1]
        d = n // 2
        grad = grad.to(r.dtype)
        if ctx.normalize:
            # ∂φ̂_j/∂φ_i = inv (δ_ij − φ̂_j)  ⇒  ḡφ = inv (ḡ − Σ_j ḡ_j φ̂_j), written into the buffer
            # of ḡ ⊙ φ̂ while it is still in cache: on CPU a fresh buffer per op costs more than the op.
            # Rows below the floor were divided by a constant: ḡφ = inv ḡ there.
            scratch = grad * phi
            projection = scratch.sum(dim=-1, keepdim=True).masked_fill_(floored, 0.0)
            grad = torch.sub(grad, projection, out=scratch).mul_(inv)
        grad_r = torch.empty_like(r)
        for i in range(1, ctx.nu + 1):
            g = grad[..., (i - 1) * n : i * n]
            # φ_j = r_j r_{j−i} for j ≥ i, and r_j r_{j−i+n} for j < i: each φ_j sends ḡ_j r_{j−i} to
            # r_j and ḡ_j r_j to r_{j−i}. The first block writes (no zero fill), the others add.
            if i == 1:
                torch.mul(g[..., i:], r[..., : n - i], out=grad_r[..., i:])
                torch.mul(g[..., :i], r[..., n - i :], out=grad_r[..., :i])
            else:
                grad_r[..., i:].addcmul_(g[..., i:], r[..., : n - i])
                grad_r[..., :i].addcmul_(g[..., :i], r[..., n - i :])
            grad_r[..., : n - i].addcmul_(g[..., i:], r[..., i:])
            grad_r[..., n - i :].addcmul_(g[..., :i], r[..., :i])
        # relu'(0) = 0, as torch's: only coordinates where r > 0 pass a gradient (relu's own backward,
        # in place: one pass, where a mask would take two).
        torch.ops.aten.threshold_backward.grad_input(grad_r, r, 0, grad_input=grad_r)
        return (grad_r[..., :d] - grad_r[..., d:]).to(ctx.input_dtype), None, None, None


def dpfp_composed(x: Tensor, nu: int, normalize: bool = False, floor: float | None = None) -> Tensor:
    """:func:`dpfp` written with plain differentiable torch ops (no ``out=``, nothing in place): the
    same values, for second-order gradients (:mod:`.double_backward`) and as a reference. The same
    conventions as the op's backward: relu'(0) = 0, rows below the floor divided by a constant."""
    x = x.to(compute_dtype(x))
    r = torch.cat([torch.relu(x), torch.relu(-x)], dim=-1)
    # block i: r_j · r_{(j − i) mod 2d}, and torch.roll(r, i)[j] = r[(j − i) mod 2d]
    phi = torch.cat([r * torch.roll(r, shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)
    if normalize:
        phi = phi / phi.sum(dim=-1, keepdim=True).clamp(min=floor_for(x.dtype, floor))
    return phi


def dpfp(x: Tensor, nu: int, normalize: bool = False, floor: float | None = None) -> Tensor:
    """DPFP features of x (…, d) → (…, 2·d·ν) in fp32 (float64 for float64 x), divided by
    max(Σφ, ``floor``) if ``normalize``; ``floor=None`` takes the compute dtype's (1e-30 in fp32,
    1e-300 in float64, :mod:`.limits`)."""
    return apply_unrecorded_in_inference_mode(_DPFP, x, nu, normalize, floor)
