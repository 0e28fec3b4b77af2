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
        return (grad + grad.mT) @ k


def gram(k: Tensor) -> Tensor:
    """K Kᵀ for k of shape (..., n, d) → (..., n, n); differentiable (symmetric backward)."""
    return _SymmetricGram.apply(k)
