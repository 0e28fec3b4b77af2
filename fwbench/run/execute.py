"""Train one run and turn its outcome into a record (see DESIGN.md, "A run record").

The one place where a :class:`~fwbench.run.grid.RunSpec` becomes a trained model and a JSON-ready
record; the launchers call it in whatever process a run lands, the runner stores what it returns.
"""

from __future__ import annotations

import resource
from datetime import datetime, timezone
from pathlib import Path

import torch

from fwbench.run.distributed import DistributedContext
from fwbench.run.environment import describe_environment
from fwbench.run.grid import RunSpec, import_modules_of, stored_config
from fwbench.run.training import FitResult, fit
from fwbench.variants import d_dot_of, parse_spec


def utc_now() -> str:
    """The current UTC time as an ISO 8601 string (seconds): a record's ``started_at`` / ``ended_at``."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _peak_memory_bytes(device: torch.device) -> dict[str, int]:
    if device.type == "cuda":
        return {"peak_mem_bytes": int(torch.cuda.max_memory_allocated(device))}
    # ru_maxrss is the whole process's peak resident set, in KiB on Linux: an upper bound.
    return {"max_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


def execute(spec: RunSpec, device: torch.device, on_progress=None, checkpoint: Path | None = None,
            distributed: DistributedContext | None = None) -> dict:
    """Train one run and build its record (see DESIGN.md, "A run record").

    ``checkpoint``: file to resume from and save to, for configs with ``checkpoint_every``.
    ``distributed``: this process's rank under ``torchrun``; every rank returns the record, rank 0
    stores it. ``tokens_per_s`` is then the throughput of all ranks together (global batch).
    """
    import_modules_of(spec)  # a worker process (Ray, torchrun) learns the user's variants here
    config = spec.task_config()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = utc_now()
    result = fit(spec.task, spec.variant, config, spec.seed, device, on_progress, checkpoint,
                 distributed=distributed)
    return build_record(spec, result, device, started)


def build_record(spec: RunSpec, result: FitResult, device: torch.device, started: str) -> dict:
    """The record of ``spec`` from its training outcome (``started``: ISO time it began); shared
    by solo and packed runs (:mod:`fwbench.run.packing`), so their records have one format."""
    config = spec.task_config()
    variant = parse_spec(spec.variant)
    sequence_length = getattr(config, "sequence_length", 0)
    tokens = result.steps * config.batch_size * sequence_length
    metrics = {
        "best_eval_loss": result.best_eval.get("loss"),
        "final_eval_loss": result.final_eval.get("loss"),
        # null where no evaluation finished (a run diverged before its first): 0 read as "best at step 0"
        "best_step": result.best_step if result.best_eval else None,
        **{f"best_eval_{k}": v for k, v in result.best_eval.items() if k != "loss"},
        **{f"final_eval_{k}": v for k, v in result.final_eval.items() if k != "loss"},
        "parameters": result.parameters,
    }
    final_evaluation = dict(result.final_evaluation)
    metrics.update(final_evaluation.pop("metrics", {}))
    return {
        "run_id": spec.run_id,
        "grid": spec.grid,
        "task": spec.task,
        "variant": {
            "spec": spec.variant, "name": variant.name, "params": variant.params,
            "d_dot": d_dot_of(variant, getattr(config, "d_key", 64)),
        },
        "seed": spec.seed,
        "config": stored_config(spec),
        "status": result.status,
        "diverged_at": result.diverged_at,
        "diverged_reason": result.diverged_reason,
        "metrics": metrics,
        "curve": result.curve,
        "steps": result.steps,
        "wall_s": round(result.wall_s, 3),
        "steps_per_s": round(result.steps / result.train_s, 2) if result.train_s else None,
        "tokens_per_s": round(tokens / result.train_s, 1) if result.train_s else None,
        **_peak_memory_bytes(device),
        "resumed_at_step": result.resumed_at,
        **({"final_evaluation": final_evaluation} if final_evaluation else {}),
        **({"distributed": result.distributed} if result.distributed else {}),
        "environment": describe_environment(device),
        "started_at": started,
        "ended_at": utc_now(),
    }
