"""The generic training loop: seeded, evaluation every ``eval_every`` steps, early stopping.

Stops at the first of: evaluation loss ≤ ``target_loss`` (converged), ``patience`` evaluations
without a new best (plateau), ``max_steps`` (budget), or divergence: a non-finite training loss,
gradient or evaluation loss, or (with ``check_finite``, on by default) a NaN/inf reaching an
attention layer. A diverged run is recorded with the step it happened at and the reason, never
dropped; the optimiser never applies a non-finite gradient.

Optional config fields extend the loop without changing runs whose configs lack them:
``schedule`` / ``warmup_steps`` / ``grad_clip`` (see :mod:`fwbench.run.optimization`) and
``checkpoint_every`` (save a resumable checkpoint every that many steps, given a path; see
:mod:`fwbench.run.checkpoint`). A task may define ``final_evaluation(model, config, device, seed)``,
run once after training; its ``metrics`` join the run's metrics and the rest goes in the record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from fwbench.run.checkpoint import load_checkpoint, restore_rng_states, rng_states, save_checkpoint
from fwbench.run.distributed import DistributedContext, parameter_digest
from fwbench.run.optimization import build_optimizer, build_schedule, clip_gradients
from fwbench.tasks import TASKS
from fwbench.tasks.base import to_device
from fwbench.variants import FeatureMap, NonFiniteError, set_check_finite
from fwbench.variants.checks import all_finite

#: Generator seeds derived from the run seed; distinct streams for training and evaluation data.
EVAL_SEED_OFFSET = 1_000_003


@dataclass
class FitResult:
    """What one training run produced (the body of a record)."""

    status: str  # converged | plateau | max_steps | diverged
    steps: int
    best_eval: dict[str, float]
    final_eval: dict[str, float]
    best_step: int
    curve: list[dict[str, float]] = field(default_factory=list)
    diverged_at: int | None = None
    diverged_reason: str | None = None
    wall_s: float = 0.0
    train_s: float = 0.0
    parameters: int = 0
    resumed_at: int | None = None  # step of the checkpoint this run continued from, if any
    final_evaluation: dict = field(default_factory=dict)
    #: data-parallel runs: world size, backend and each rank's parameter digest after training
    distributed: dict | None = None


def redraw_random_features(model: torch.nn.Module) -> None:
    """Draw new random features (FAVOR+) in every feature map of ``model``: once per training step."""
    for module in model.modules():
        if isinstance(module, FeatureMap):
            module.redraw_features()


def _gradients_finite(model: torch.nn.Module) -> bool:
    """Whether every gradient element of ``model`` is finite (no NaN, no ±inf); runs every step."""
    return all_finite(p.grad for p in model.parameters() if p.grad is not None)


def fit(task_name: str, variant: str, config, seed: int, device: torch.device,
        on_progress: Callable[[int, float], None] | None = None,
        checkpoint_path: str | Path | None = None, check_finite: bool = True,
        distributed: DistributedContext | None = None) -> FitResult:
    """Train ``variant`` on a task from ``seed`` and return the curve and metrics.

    The same (task, variant, config, seed) on the same machine gives the same numbers: the model
    is built after ``torch.manual_seed(seed)`` and data come from generators seeded from ``seed``.
    With ``checkpoint_path`` and a positive ``config.checkpoint_every``, the loop saves its whole
    state there every ``checkpoint_every`` steps and at the end, and starts from that file when it
    exists, so a killed run resumes where it stopped and ends with the same metrics.

    ``check_finite`` (default on) switches on the NaN/inf check of every attention module of the
    model (:func:`variants.set_check_finite`): a non-finite tensor reaching attention ends the run
    as diverged, with the step and the tensor named in ``diverged_reason``.

    ``distributed`` (under ``torchrun``): the model trains inside DistributedDataParallel, each rank
    on its slice of the global batch of ``config.batch_size`` rows; only rank 0 saves checkpoints
    and runs ``final_evaluation`` (see :mod:`fwbench.run.distributed`).

    Raises:
        FwbenchError: under ``torchrun``, ``config.batch_size`` is not a multiple of the world size.
    """
    task = TASKS[task_name]
    torch.manual_seed(seed)
    model = task.build_model(config, variant).to(device)
    set_check_finite(model, check_finite)
    if distributed is not None:
        distributed.check_batch_size(config.batch_size)
    # the module the loss runs through: DDP averages gradients across ranks in backward
    trained = model if distributed is None else distributed.wrap(model, device)
    is_main = distributed is None or distributed.is_main
    optimizer = build_optimizer(model, config)
    schedule = build_schedule(optimizer, config)
    train_data = torch.Generator().manual_seed(seed)
    eval_data = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    generators = {"train": train_data, "eval": eval_data}
    checkpoint_every = getattr(config, "checkpoint_every", 0) if checkpoint_path is not None else 0

    start = time.perf_counter()
    train_time, previous_wall = 0.0, 0.0
    curve: list[dict[str, float]] = []
    best_eval: dict[str, float] = {"loss": math.inf}
    best_step, since_best, step = 0, 0, 0
    status = "max_steps"
    diverged_at = diverged_reason = None
    last_eval: dict[str, float] = {}
    finished, resumed_at = False, None

    def save(final: bool = False) -> None:
        if not is_main:
            return
        loop = {"step": step, "curve": curve, "best_eval": best_eval, "best_step": best_step,
                "since_best": since_best, "status": status, "diverged_at": diverged_at,
                "diverged_reason": diverged_reason, "last_eval": last_eval,
                "train_s": train_time, "wall_s": previous_wall + time.perf_counter() - start, "finished": final}
        save_checkpoint(checkpoint_path, {
            "task": task_name, "variant": variant, "seed": seed, "config": asdict(config), "loop": loop,
            "model": model.state_dict(),
            # a finished run keeps only what sampling and a re-evaluation need
            "optimizer": None if final else optimizer.state_dict(),
            "schedule": None if final or schedule is None else schedule.state_dict(),
            "rng": rng_states(generators, device),
        })

    saved = load_checkpoint(checkpoint_path, device) if checkpoint_every else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        if saved["optimizer"] is not None:
            optimizer.load_state_dict(saved["optimizer"])
        if schedule is not None and saved["schedule"] is not None:
            schedule.load_state_dict(saved["schedule"])
        restore_rng_states(saved["rng"], generators, device)
        loop = saved["loop"]
        step, curve, best_eval, best_step = loop["step"], loop["curve"], loop["best_eval"], loop["best_step"]
        since_best, status, diverged_at = loop["since_best"], loop["status"], loop["diverged_at"]
        diverged_reason = loop.get("diverged_reason")
        last_eval = loop["last_eval"]
        train_time, previous_wall, finished, resumed_at = loop["train_s"], loop["wall_s"], loop["finished"], step

    def save_if_due() -> None:
        if checkpoint_every and step % checkpoint_every == 0:
            save()

    while not finished and step < config.max_steps:
        model.train()
        redraw_random_features(model)
        t0 = time.perf_counter()
        batch = task.train_batch(config, train_data)
        batch = to_device(batch if distributed is None else distributed.shard(batch), device)
        step += 1
        failure = None
        try:
            loss = task.loss(trained, batch, config)
        except NonFiniteError as exc:
            failure = f"training: {exc}"
        if distributed is not None:  # every rank stops at the same step, or none does
            failed, loss_value = distributed.any_rank(failure is not None, math.nan if failure else loss.item(), device)
            if failed and failure is None:
                failure = "training: a non-finite loss or tensor on one of the ranks"
        else:
            loss_value = math.nan if failure else loss.item()
        if failure is not None:
            status, diverged_at, diverged_reason = "diverged", step, failure
            break
        if not math.isfinite(loss_value):
            status, diverged_at, diverged_reason = "diverged", step, f"training loss is {loss_value}"
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not _gradients_finite(model):
            status, diverged_at, diverged_reason = "diverged", step, "non-finite gradient (not applied)"
            break
        clip_gradients(model, config)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        train_time += time.perf_counter() - t0
        if on_progress is not None:
            on_progress(step, loss_value)
        if step % config.eval_every:
            save_if_due()
            continue
        model.eval()
        try:
            last_eval = task.evaluate(model, config, eval_data, device)
        except NonFiniteError as exc:
            status, diverged_at, diverged_reason = "diverged", step, f"evaluation: {exc}"
            break
        curve.append({"step": step, "train_loss": loss_value, **{f"eval_{k}": v for k, v in last_eval.items()}})
        if not math.isfinite(last_eval["loss"]):
            status, diverged_at, diverged_reason = "diverged", step, f"evaluation loss is {last_eval['loss']}"
            break
        if last_eval["loss"] < best_eval["loss"]:
            best_eval, best_step, since_best = dict(last_eval), step, 0
        else:
            since_best += 1
        if last_eval["loss"] <= config.target_loss:
            status = "converged"
            break
        if since_best >= config.patience:
            status = "plateau"
            break
        save_if_due()
    if not last_eval and status != "diverged":
        model.eval()
        last_eval = task.evaluate(model, config, eval_data, device)
        curve.append({"step": step, **{f"eval_{k}": v for k, v in last_eval.items()}})
        best_eval, best_step = dict(last_eval), step
    if checkpoint_every and not finished:
        save(final=True)
    final_evaluation = {}
    distributed_summary = None
    if distributed is not None:
        distributed_summary = {"world_size": distributed.world_size, "backend": distributed.backend,
                               "parameter_sha256": distributed.gather(parameter_digest(model))}
    if hasattr(task, "final_evaluation") and status != "diverged" and is_main:
        model.eval()
        final_evaluation = task.final_evaluation(model, config, device, seed)
    return FitResult(
        status=status, steps=step, best_eval=best_eval, final_eval=last_eval, best_step=best_step,
        curve=curve, diverged_at=diverged_at, diverged_reason=diverged_reason, wall_s=previous_wall + time.perf_counter() - start,
        train_s=train_time, parameters=sum(p.numel() for p in model.parameters()), resumed_at=resumed_at,
        final_evaluation=final_evaluation, distributed=distributed_summary,
    )
