"""Data-parallel training under ``torchrun``: one process per device, DistributedDataParallel.

``torchrun --nproc_per_node=N -m fwbench run GRID ...`` starts N copies of ``fwbench run``. Each
reads its rank from the environment torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``), joins
a process group (NCCL on GPUs, gloo on CPU) and trains the same runs in lockstep:

- **Global batch.** ``config.batch_size`` is the global batch of one optimiser step, as in a
  single-process run. Every rank draws that whole batch from the same seeded generator and keeps
  its own contiguous slice of ``batch_size / N`` rows (:meth:`DistributedContext.shard`): a
  distributed sampler in which the ranks read disjoint parts of one global batch. The mean loss
  over equal slices, with DDP averaging gradients, is the gradient of the global batch's mean loss,
  so a run on N processes follows the same trajectory as on one (up to floating-point summation
  order); ``batch_size`` must be a multiple of N. Not with dropout: each rank draws its own masks
  (:func:`fwbench.run.training.rank_stream_seed`), so the trajectories then agree in distribution only.
- **Learning-rate schedule.** One scheduler step per optimiser step, as on one process: warm-up and
  decay are counted in global steps and need no rescaling.
- **Rank 0 only** writes records, checkpoints and the progress bar; the other ranks train silently.
  Evaluation runs on every rank (the parameters are identical, so the results agree and every
  rank makes the same early-stopping decision); the final evaluation (long-context stream, sample)
  runs on rank 0 alone.
- **Provenance.** Each record of a distributed run holds ``distributed``: the world size, the
  backend and a SHA-256 digest of each rank's parameters after training, which must all be equal.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fwbench.errors import FwbenchError
from fwbench.tasks.base import map_tensors

#: Environment variables ``torchrun`` sets for each worker process.
RANK_ENV, LOCAL_RANK_ENV, WORLD_SIZE_ENV = "RANK", "LOCAL_RANK", "WORLD_SIZE"


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in a data-parallel group.

    Attributes:
        rank: global rank, 0 … world_size − 1; rank 0 writes records and checkpoints.
        local_rank: rank on this node; picks ``cuda:local_rank`` on a multi-GPU machine.
        world_size: number of processes training each run together.
        backend: ``nccl`` (CUDA) or ``gloo`` (CPU).
    """

    rank: int
    local_rank: int
    world_size: int
    backend: str

    @property
    def is_main(self) -> bool:
        """Whether this process writes records, checkpoints and progress (rank 0)."""
        return self.rank == 0

    def check_batch_size(self, batch_size: int) -> None:
        """Raise FwbenchError unless ``batch_size`` splits evenly across the ranks."""
        if batch_size % self.world_size:
            raise FwbenchError(
                f"batch_size: got {batch_size} with {self.world_size} processes; the global batch must be a "
                f"multiple of --nproc_per_node (e.g. {batch_size - batch_size % self.world_size or self.world_size})"
            )

    def shard(self, batch: Any) -> Any:
        """This rank's slice (along dim 0) of every tensor of a global batch (tensor, tuple or dict).

        A (B, ...) tensor becomes (B / world_size, ...): rows ``rank·B/N`` to ``(rank+1)·B/N − 1``.
        """
        return map_tensors(batch, lambda x: x.tensor_split(self.world_size)[self.rank])

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        """``model`` inside DistributedDataParallel, which averages gradients over the ranks in backward."""
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        # static_graph: every step builds the same graph, and some models own parameters a variant
        # never uses (the retrieval model's β projection beside a sum rule or softmax); DDP learns
        # that set in the first step instead of searching the graph for it every step.
        return DistributedDataParallel(model, device_ids=device_ids, static_graph=True)

    def any_rank(self, flag: bool, value: float, device: torch.device) -> tuple[bool, float]:
        """(whether ``flag`` holds on any rank, the mean of ``value`` over the ranks).

        Every rank calls it once per step, so that a failure on one rank (a NaN in its slice) stops
        all of them at the same step instead of leaving the others waiting in the next all-reduce.
        """
        import torch.distributed as dist

        both = torch.tensor([float(flag), value if not flag else 0.0], dtype=torch.float64, device=device)
        # a non-finite value on one rank would poison the mean: count it as that rank's flag instead
        if not flag and not torch.isfinite(both[1]):
            both = torch.tensor([1.0, 0.0], dtype=torch.float64, device=device)
        dist.all_reduce(both)
        return bool(both[0].item() > 0), both[1].item() / self.world_size

    def gather(self, value: Any) -> list[Any]:
        """``value`` from every rank, in rank order (a picklable object)."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a picklable object)."""
        import torch.distributed as dist

        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def context_from_environment(environ: dict[str, str] | None = None) -> DistributedContext | None:
    """The data-parallel context ``torchrun`` describes in the environment, or ``None`` outside it.

    ``None`` also when ``WORLD_SIZE`` is 1: a single process trains as usual.

    Raises:
        FwbenchError: ``WORLD_SIZE``, ``RANK`` or ``LOCAL_RANK`` is not a non-negative integer, or
            ``RANK`` is not below ``WORLD_SIZE``.
    """
    environ = os.environ if environ is None else environ
    if WORLD_SIZE_ENV not in environ:
        return None
    values = {}
    for name in (WORLD_SIZE_ENV, RANK_ENV, LOCAL_RANK_ENV):
        raw = environ.get(name, "0")
        if not (raw.isascii() and raw.isdigit()):
            raise FwbenchError(f"${name}: got {raw!r}; expected a non-negative integer (torchrun sets it)")
        values[name] = int(raw)
    if values[WORLD_SIZE_ENV] <= 1:
        return None
    if values[RANK_ENV] >= values[WORLD_SIZE_ENV]:
        raise FwbenchError(f"$RANK: got {values[RANK_ENV]} with $WORLD_SIZE {values[WORLD_SIZE_ENV]}; expected a rank "
                           "below the world size (torchrun sets both)")
    return DistributedContext(rank=values[RANK_ENV], local_rank=values[LOCAL_RANK_ENV],
                              world_size=values[WORLD_SIZE_ENV], backend="gloo")


def start(context: DistributedContext, device: torch.device) -> tuple[DistributedContext, torch.device]:
    """Join the process group; return the context with its backend and this rank's device.

    On CUDA each process takes ``cuda:LOCAL_RANK`` and NCCL; on CPU, gloo.

    Raises:
        FwbenchError: CUDA asked for with fewer visible GPUs than processes on this node, or the
            process group cannot be joined (``WORLD_SIZE`` set without torchrun's other variables).
    """
    import torch.distributed as dist

    if device.type == "cuda":
        if context.local_rank >= torch.cuda.device_count():
            raise FwbenchError(
                f"--nproc_per_node: local rank {context.local_rank} has no GPU ({torch.cuda.device_count()} "
                "visible); start at most one process per GPU"
            )
        device = torch.device("cuda", context.local_rank)
        torch.cuda.set_device(device)
        context = DistributedContext(context.rank, context.local_rank, context.world_size, "nccl")
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend=context.backend)
        except (ValueError, RuntimeError) as exc:  # e.g. WORLD_SIZE set by hand, without MASTER_ADDR
            raise FwbenchError(
                f"$WORLD_SIZE: got {context.world_size}, but joining the {context.backend} process group failed "
                f"({str(exc).splitlines()[0]}); start data-parallel runs with 'torchrun --nproc_per_node=N "
                "-m fwbench run GRID', or unset WORLD_SIZE"
            ) from None
    return context, device


def stop() -> None:
    """Leave the process group (a no-op when none was joined)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def parameter_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter's bytes, in ``named_parameters`` order: equal digests, equal models."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
