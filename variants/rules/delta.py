"""The delta rule: W += β (v − W φ(k)) φ(k)ᵀ on sum-normalised φ, y = W φ(q) (paper Eq. 23–26).

Kernels: :mod:`variants.kernels.delta_rule` (parallel, chunkwise WY form, recurrent; a fused
write-then-read). ``delta-unnorm`` is the same rule on φ that is not sum-normalised: the ablation of
paper Section 4.2, stable only while β ‖φ(k)‖² < 2. On CUDA the chunk form runs fla's Triton
``chunk_delta_rule`` where it can serve the call (:mod:`variants.kernels.fla_dispatch`).

Chunk sizes: the chunk form and the write use :data:`~variants.kernels.chunking.DEFAULT_CHUNK_SIZE`;
the fused write-then-read keeps its own measured best, :data:`WRITE_READ_CHUNK_SIZE` (24, measured
in the retrieval tasks' training step; see its comment in the kernel module). This table entry is
the one place that choice is made.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from ..kernels import delta_rule as kernels
from ..kernels.delta_rule import WRITE_READ_CHUNK_SIZE
from ..kernels.fla_dispatch import delta_rule_chunk_dispatch
from .base import UpdateRule


def _parallel(pq, pk, v, beta, W0, z0, chunk_size):
    return (*kernels.delta_rule_parallel(pq, pk, v, beta, W0), None)


def _chunk(pq, pk, v, beta, W0, z0, chunk_size):
    # fla's Triton kernel on CUDA where it can serve the call, else ours (variants.kernels.fla_dispatch)
    return (*delta_rule_chunk_dispatch(pq, pk, v, beta, W0, chunk_size=chunk_size), None)


def _recurrent(pq, pk, v, beta, W0, z0, chunk_size):
    return (*kernels.delta_rule_recurrent(pq, pk, v, beta, W0), None)


@dataclass(frozen=True)
class DeltaRule(UpdateRule):
    """The delta rule; its state is W alone (no normaliser: φ is sum-normalised instead)."""

    def write(self, pk: Tensor, v: Tensor, beta, W0, z0, chunk_size: int):
        _, W = kernels.delta_rule_chunk(None, pk, v, beta, W0, chunk_size=chunk_size)
        return W, None

    def read(self, pq: Tensor, W: Tensor, z: Tensor | None) -> Tensor:
        return kernels.delta_rule_read(pq, W)

    def write_read(self, pq, pk, v, beta, W0, z0, chunk_size: int) -> Tensor:
        return kernels.delta_rule_write_read(pq, pk, v, beta, W0, chunk_size=chunk_size)


DELTA = DeltaRule(
    name="delta", key="delta", description="delta rule", source="paper Eq. 23-26",
    kernels={"parallel": _parallel, "chunk": _chunk, "recurrent": _recurrent}, auto_form="chunk",
    uses_beta=True, carries_normalizer=False, sum_normalize=True,
    chunk_sizes={"write_read": WRITE_READ_CHUNK_SIZE}, chunked_paths=("chunk", "write", "write_read"),
)
#: The delta rule without sum normalisation of φ (ablation, paper Section 4.2).
DELTA_UNNORM = replace(DELTA, key="delta-unnorm", description="delta rule without sum normalisation (ablation)",
                       source="paper Section 4.2", sum_normalize=False)
