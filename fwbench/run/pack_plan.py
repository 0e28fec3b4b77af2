"""Which runs of a grid train together as one pack (see :mod:`fwbench.run.packing`), and where
packing pays.

Runs pack when they differ only in their seed and their stopping rule (:data:`PER_RUN_KEYS`), train
the retrieval task, have a variant whose attention holds no per-run state (not FAVOR+) and a config
without checkpoints, schedules or gradient clipping, and when packing pays on the device
(:func:`packing_pays`) or is forced (``FWBENCH_PACK=N``, :func:`pack_policy`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec, import_modules_of
from fwbench.tasks.retrieval import RetrievalConfig
from fwbench.variants import build_attention, d_dot_of, parse_spec

#: Largest number of runs trained as one pack unless ``FWBENCH_PACK`` says otherwise.
DEFAULT_PACK_SIZE = 8
#: Config keys in which the runs of one pack may differ (each run applies its own).
PER_RUN_KEYS = ("target_loss", "patience", "max_steps")
#: Largest per-run attention tensor (elements: batch × sequence length × d_dot) packed on CPU by default.
CPU_PACK_ELEMENTS = 500_000
#: Optional config fields that make a run train alone (their state is not per run in a pack).
SOLO_FIELDS = ("checkpoint_every", "schedule", "grad_clip")


@dataclass(frozen=True)
class PackPolicy:
    """Which runs pack: at most ``max_runs`` per pack (1: none), and whether packing is ``forced``
    where it does not pay (see :func:`packing_pays`)."""

    max_runs: int = DEFAULT_PACK_SIZE
    forced: bool = False


def pack_policy(enabled: bool = True) -> PackPolicy:
    """The packing asked for: none when not ``enabled`` (``--no-pack``); else ``FWBENCH_PACK``:
    unset or ``auto``, packs of up to :data:`DEFAULT_PACK_SIZE` runs where packing pays; ``0`` or
    ``1``, none; N ≥ 2, packs of up to N runs wherever runs can be packed.

    Raises:
        FwbenchError: ``FWBENCH_PACK`` is neither ``auto`` nor a non-negative integer.
    """
    value = os.environ.get("FWBENCH_PACK", "").strip()
    if not enabled:
        return PackPolicy(max_runs=1)
    if value in ("", "auto"):
        return PackPolicy()
    if not (value.isascii() and value.isdigit()):  # str.isdigit() admits '²', which int() refuses (a traceback)
        raise FwbenchError(f"$FWBENCH_PACK: got {value!r}; expected auto or a non-negative integer (0 or 1: no packing)")
    return PackPolicy(max_runs=max(int(value), 1), forced=True)


def packing_pays(config: dict, variant: str, device: torch.device) -> bool:
    """Whether a pack trains faster than its runs one after another. On CUDA, always: a small
    model's step is bound by kernel launches, which a pack shares (not yet measured on a GPU). On
    CPU, when a run's attention tensors of B · L · d_dot elements (d_key for softmax) are at most
    :data:`CPU_PACK_ELEMENTS`: measured with benchmarks/packed_training.py (3 runs, batch 32, one
    thread, the allocator tuned), a pack gains 2.2× at 82 k elements (dpfp ν=1, Setting 1, S=20),
    1.15-1.25× between 160 k and 490 k (dpfp-delta ν=1, Setting 2, S=20 and S=60), and loses from
    600 k on (softmax at S=300: 0.84×; dpfp-delta at S=120: 0.75×), where a step is bound by
    memory traffic, which packing does not share, and the pack's larger tensors leave the cache."""
    if device.type == "cuda":
        return True
    task_config = RetrievalConfig(**config)
    width = d_dot_of(parse_spec(variant), task_config.d_key) or task_config.d_key
    return task_config.batch_size * task_config.sequence_length * width <= CPU_PACK_ELEMENTS


def _stateless_attention(variant: str, d_key: int) -> bool:
    with torch.random.fork_rng(devices=[]):  # building FAVOR+ draws Ω from the global RNG
        attention = build_attention(variant, d_key)
    return next(attention.parameters(), None) is None and next(attention.buffers(), None) is None


def pack_key(spec: RunSpec) -> str | None:
    """The key shared by runs that can train in one pack, ``None`` for a run that trains alone."""
    if spec.task != "retrieval" or any(key in spec.config for key in SOLO_FIELDS):
        return None
    import_modules_of(spec)
    if not _stateless_attention(spec.variant, spec.task_config().d_key):
        return None
    shared = {k: v for k, v in spec.config.items() if k not in PER_RUN_KEYS}
    return json.dumps([spec.task, spec.variant, list(spec.variant_modules), shared], sort_keys=True)


def plan_packs(specs: list[RunSpec], policy: PackPolicy, device: torch.device) -> list[list[RunSpec]]:
    """Split ``specs`` into packs of at most ``policy.max_runs`` runs with one :func:`pack_key`, in
    the order of their first run; runs that cannot be packed, or whose packing does not pay on
    ``device`` (:func:`packing_pays`, unless ``policy.forced``), are packs of one."""
    if policy.max_runs <= 1:
        return [[spec] for spec in specs]
    groups: dict[str, list[RunSpec]] = {}
    packs: list[list[RunSpec]] = []
    for spec in specs:
        try:
            key = pack_key(spec)
            packs_here = key is not None and (policy.forced or packing_pays(spec.config, spec.variant, device))
        except Exception:  # packing decides speed only: a run whose variant cannot even be built trains
            packs_here = False  # alone, and fails there with its own record
        if not packs_here:
            packs.append([spec])
            continue
        if key not in groups or len(groups[key]) >= policy.max_runs:
            groups[key] = []
            packs.append(groups[key])
        groups[key].append(spec)
    return packs
