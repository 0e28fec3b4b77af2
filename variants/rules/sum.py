"""The sum rule of linear attention: W += v φ(k)ᵀ, z += φ(k), y = W φ(q) / (zᵀφ(q)) (paper Eq. 16–18).

Kernels: :mod:`variants.kernels.sum_rule`, in parallel, chunk and recurrent forms that agree. Its
write and fused write-then-read have no chunks, so a chunk size acts only in the chunk form. On CUDA
the chunk form's numerator comes from fla's Triton kernel where it can serve the call
(:mod:`variants.kernels.fla_dispatch`; ``FWBENCH_FLA=0`` turns that off).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..kernels import sum_rule as kernels
from ..kernels.fla_dispatch import sum_rule_chunk_dispatch
from .base import UpdateRule


def _parallel(pq, pk, v, beta, W0, z0, chunk_size):
    return kernels.sum_rule_parallel(pq, pk, v, W0, z0)


def _chunk(pq, pk, v, beta, W0, z0, chunk_size):
    # fla's Triton kernel on CUDA where it can serve the call, else ours (variants.kernels.fla_dispatch)
    return sum_rule_chunk_dispatch(pq, pk, v, W0, z0, chunk_size=chunk_size)


def _recurrent(pq, pk, v, beta, W0, z0, chunk_size):
    return kernels.sum_rule_recurrent(pq, pk, v, W0, z0)


@dataclass(frozen=True)
class SumRule(UpdateRule):
    """The sum rule; its state carries the normaliser z (B, H, d_dot)."""

    def write(self, pk: Tensor, v: Tensor, beta, W0, z0, chunk_size: int):
        return kernels.sum_rule_write(pk, v, W0, z0)

    def read(self, pq: Tensor, W: Tensor, z: Tensor | None) -> Tensor:
        return kernels.sum_rule_read(pq, W, z)

    def write_read(self, pq, pk, v, beta, W0, z0, chunk_size: int) -> Tensor:
        return kernels.sum_rule_write_read(pq, pk, v, W0, z0)


SUM = SumRule(
    name="sum", key="sum", description="sum rule", source="paper Eq. 16-18",
    kernels={"parallel": _parallel, "chunk": _chunk, "recurrent": _recurrent}, auto_form="chunk",
    uses_beta=False, carries_normalizer=True, sum_normalize=False,
)
