"""The generic training loop: seeded, evaluation every ``eval_every`` steps, early stopping.

Stops at the first of: evaluation loss ≤ ``target_loss`` (converged), ``patience`` evaluations
without a new best (plateau), ``max_steps`` (budget), or divergence: a non-finite training loss,
gradient or evaluation loss, or (with ``check_finite``, on by default) a NaN/inf reaching an
attention layer. A diverged run is recorded with the step it happened at and the reason, never
dropped; the optimiser never applies a non-finite gradient.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tasks import TASKS
from tasks.base import to_device
from variants import FeatureMap, NonFiniteError, set_check_finite

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


def redraw_random_features(model: torch.nn.Module) -> None:
    """Draw new random features (FAVOR+) in every feature map of ``model``: once per training step."""
    for module in model.modules():
        if isinstance(module, FeatureMap):
            module.redraw_features()


def _gradients_finite(model: torch.nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return not grads or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


def fit(task_name: str, variant: str, config, seed: int, device: torch.device,
        on_progress: Callable[[int, float], None] | None = None, check_finite: bool = True) -> FitResult:
    """Train ``variant`` on a task from ``seed`` and return the curve and metrics.

    The same (task, variant, config, seed) on the same machine gives the same numbers: the model
    is built after ``torch.manual_seed(seed)`` and data come from generators seeded from ``seed``.

    ``check_finite`` (default on) switches on the NaN/inf check of every attention module of the
    model (:func:`variants.set_check_finite`): a non-finite tensor reaching attention ends the run
    as diverged, with the step and the tensor named in ``diverged_reason``.
    """
    task = TASKS[task_name]
    torch.manual_seed(seed)
    model = task.build_model(config, variant).to(device)
    set_check_finite(model, check_finite)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    train_data = torch.Generator().manual_seed(seed)
    eval_data = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)

    start = time.perf_counter()
    train_time = 0.0
    curve: list[dict[str, float]] = []
    best_eval: dict[str, float] = {"loss": math.inf}
    best_step, since_best, step = 0, 0, 0
    status = "max_steps"
    diverged_at = diverged_reason = None
    last_eval: dict[str, float] = {}
    while step < config.max_steps:
        model.train()
        redraw_random_features(model)
        t0 = time.perf_counter()
        batch = to_device(task.train_batch(config, train_data), device)
        step += 1
        try:
            loss = task.loss(model, batch, config)
        except NonFiniteError as exc:
            status, diverged_at, diverged_reason = "diverged", step, f"training: {exc}"
            break
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            status, diverged_at, diverged_reason = "diverged", step, f"training loss is {loss_value}"
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not _gradients_finite(model):
            status, diverged_at, diverged_reason = "diverged", step, "non-finite gradient (not applied)"
            break
        optimizer.step()
        train_time += time.perf_counter() - t0
        if on_progress is not None:
            on_progress(step, loss_value)
        if step % config.eval_every:
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
    if not last_eval and status != "diverged":
        model.eval()
        last_eval = task.evaluate(model, config, eval_data, device)
        curve.append({"step": step, **{f"eval_{k}": v for k, v in last_eval.items()}})
        best_eval, best_step = dict(last_eval), step
    return FitResult(
        status=status, steps=step, best_eval=best_eval, final_eval=last_eval, best_step=best_step,
        curve=curve, diverged_at=diverged_at, diverged_reason=diverged_reason,
        wall_s=time.perf_counter() - start, train_s=train_time,
    )
