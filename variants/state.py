"""States carried across calls: the fast weight W of linear attention, the KV cache of softmax.

Passing the state returned by one call into the next makes two calls on a split sequence equal
one call on the whole sequence (streaming, generation, long-context evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class FastWeightState:
    """Fast-weight memory after the tokens seen so far (paper Eq. 16–17, 20–22).

    Attributes:
        W: fast weight, (B, H, d_v, d_dot), in the paper's orientation: y = W φ(q).
            Kept in the dtype the kernels compute in: fp32 for fp16, bf16 and fp32 inputs,
            float64 for float64 inputs.
        z: attention normaliser Σ_t φ(k_t), (B, H, d_dot), in W's dtype, for the sum rule; ``None`` for the
            delta rule, whose keys and queries are sum-normalised instead.
        position: number of tokens written so far (int).
    """

    W: Tensor
    z: Tensor | None
    position: int = 0

    @property
    def nbytes(self) -> int:
        """Memory the state occupies, in bytes (constant in the sequence length)."""
        total = self.W.numel() * self.W.element_size()
        if self.z is not None:
            total += self.z.numel() * self.z.element_size()
        return total

    def detach(self) -> FastWeightState:
        """The same state cut from the autograd graph (truncated backpropagation)."""
        return FastWeightState(
            self.W.detach(), None if self.z is None else self.z.detach(), self.position
        )


@dataclass
class KVCacheState:
    """Softmax attention's state: every key and value seen so far (or the last ``window``).

    Attributes:
        k: cached keys, (B, H, T_cache, d_key).
        v: cached values, (B, H, T_cache, d_v).
        position: number of tokens seen so far, including any dropped from a windowed cache.
    """

    k: Tensor
    v: Tensor
    position: int = 0

    @property
    def nbytes(self) -> int:
        """Memory the cache occupies, in bytes (grows linearly with the tokens kept)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def detach(self) -> KVCacheState:
        """The same cache cut from the autograd graph."""
        return KVCacheState(self.k.detach(), self.v.detach(), self.position)
