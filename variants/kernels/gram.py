"""The Gram matrix K Kᵀ of a batch of key blocks, with a backward that uses its symmetry."""

from __future__ import annotations

import torch
from torch import Tensor


class _SymmetricGram(torch.autograd.Function):
    """G = K Kᵀ; ∂L/∂K = (Ḡ + Ḡᵀ) K: one matmul in the backward where autograd would run two."""

    @staticmethod
    def forward(ctx, k: Tensor) -> Tensor:
        ctx.save_for_backward(k)
        return k @ k.mT

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (k,) = ctx.saved_tensors
        # under autocast the forward's product came back in bf16/fp16 beside an fp32 k (or an fp32 grad beside
        # a bf16 k), and a backward run outside autocast, as torch recommends, raised 'expected scalar type
        # BFloat16 but found Float': one dtype for both, a no-op where they agree
        dtype = torch.promote_types(grad.dtype, k.dtype)
        return (grad + grad.mT).to(dtype) @ k.to(dtype)


def gram(k: Tensor) -> Tensor:
    """K Kᵀ for k of shape (..., n, d) → (..., n, n); differentiable (symmetric backward)."""
    return _SymmetricGram.apply(k)
