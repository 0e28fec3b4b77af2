"""The generic training loop: seeded, evaluation every ``eval_every`` steps and at the last step,
early stopping.

Stops at the first of: evaluation loss ≤ ``target_loss`` (converged), ``patience`` evaluations
without a new best (plateau), ``max_steps`` (budget), or divergence: a non-finite training loss,
gradient or evaluation loss, or (with ``check_finite``, on by default) a NaN/inf reaching an
attention layer. A diverged run is recorded with the step it happened at and the reason, never
dropped; the optimiser never applies a non-finite gradient. Whatever the schedule, the model a run
that did not diverge ends with is evaluated: a run stopped by its budget between two evaluations
(``max_steps`` not a multiple of ``eval_every``) gets one more evaluation at its last step. A
diverged run is not evaluated again: its final evaluation is the last one before the divergence
(the curve's last point, at a step before ``diverged_at``), or none; where the evaluation loss itself
went non-finite, that evaluation is the final one, at ``diverged_at`` (its loss recorded as null and
named in the record's ``non_finite``).

Random streams, all derived from the run seed: the model's initial weights (torch's global RNG
after ``torch.manual_seed(seed)``), the training and evaluation data, FAVOR+'s feature redraws
(a generator of their own, the same on every rank of a data-parallel group, so the ranks keep one
Ω) and dropout (torch's global RNG after the model is built: rank 0 continues the seed's stream,
rank r > 0 is reseeded with :func:`rank_stream_seed`, so each rank draws its own masks, also after
resuming from a checkpoint that holds no stream of that rank).

Optional config fields extend the loop without changing runs whose configs lack them:
``schedule`` / ``warmup_steps`` / ``grad_clip`` (see :mod:`fwbench.run.optimization`) and
``checkpoint_every`` (save a resumable checkpoint every that many steps, given a path; see
:mod:`fwbench.run.checkpoint`). A task may define ``final_evaluation(model, config, device, seed)``,
run once after training; its ``metrics`` join the run's metrics and the rest goes in the record.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from fwbench.run.checkpoint import (
    discard_unfinished_writes,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from fwbench.run.distributed import DistributedContext, parameter_digest
from fwbench.run.grid import check_task_config
from fwbench.run.optimization import build_optimizer, build_schedule, clip_gradients
from fwbench.tasks import TASKS
from fwbench.tasks.base import to_device
from fwbench.variants import FeatureMap, NonFiniteError, set_check_finite
from fwbench.variants.checks import all_finite
from fwbench.variants.kernels.precision import denormals_flushed

#: Generator seeds derived from the run seed; distinct streams for training and evaluation data and
#: FAVOR+'s feature redraws (each data-parallel rank's dropout: :func:`rank_stream_seed`).
EVAL_SEED_OFFSET = 1_000_003
FEATURE_SEED_OFFSET = 2_000_003
#: Bit 31, set in every rank stream's seed (see :func:`rank_stream_seed`).
RANK_SEED_BIT = 1 << 31


def rank_stream_seed(seed: int, rank: int, step: int = 0) -> int:
    """The seed of data-parallel rank ``rank``'s dropout stream (torch's global RNG) from ``step`` on,
    for the run seeded ``seed``: 64 bits of SHA-256 of the three numbers, with bit 31 set.

    Hashed, not offset: ``seed + rank · 3_000_017`` made rank 1 of seed s draw its masks from the very
    stream of seed s + 3_000_017 (its training data and initial weights), and rank 2 of seed s the
    masks of rank 1 of seed s + 3_000_017. torch's CPU generator reads only the low 32 bits of a seed
    (``manual_seed(1)`` and ``manual_seed(2**32 + 1)`` draw alike), so bit 31 is set: a run seeded
    below 2**31 − 2_000_003 (every bundled grid's seeds are 1 to 3) draws none of its streams (initial
    weights, data, evaluation, features: ``seed`` + up to 2_000_003) from a rank's. ``step``: the
    step a rank starts drawing at, 0 for a fresh run; a resumed run whose checkpoint holds no stream of
    this rank (saved by one process, or by a group of another size) starts a new one there, not the
    one it drew from step 0.

    Raises:
        ValueError: ``seed``, ``rank`` or ``step`` is negative.
    """
    if min(seed, rank, step) < 0:
        raise ValueError(f"seed, rank, step: got {seed}, {rank}, {step}; expected non-negative integers")
    digest = hashlib.sha256(f"fwbench rank dropout stream {seed} {rank} {step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") | RANK_SEED_BIT


@dataclass
class FitResult:
    """What one training run produced (the body of a record).

    ``best_eval`` and ``final_eval`` are empty when no evaluation finished (a run that diverged
    before its first one): never measured, so the record holds null there, not infinity. For a
    diverged run ``final_eval`` is its last evaluation before ``diverged_at``, not one of the model it
    stopped with, except where that evaluation's loss was what went non-finite: then it is that
    evaluation, at ``diverged_at``.
    """

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


@dataclass
class LoopState:
    """Where a run stands between two steps: what :func:`fit` carries along and a checkpoint keeps.

    ``state_dict()`` / ``from_state_dict()`` give the plain dict stored as a checkpoint's ``loop``
    (its ``step``, ``finished`` and ``status`` are read by ``fwbench sample``); ``resumed_at`` and
    the wall clock of this process are not saved. ``wall_s`` and ``train_s`` are seconds.
    """

    step: int = 0
    curve: list[dict[str, float]] = field(default_factory=list)
    best_eval: dict[str, float] = field(default_factory=dict)
    best_step: int = 0
    since_best: int = 0
    status: str = "max_steps"
    diverged_at: int | None = None
    diverged_reason: str | None = None
    last_eval: dict[str, float] = field(default_factory=dict)
    train_s: float = 0.0
    wall_s: float = 0.0  # spent by earlier processes (a resumed run)
    finished: bool = False
    resumed_at: int | None = None
    clock: float = field(default_factory=time.perf_counter)

    _UNSAVED = ("resumed_at", "clock")

    def state_dict(self) -> dict[str, Any]:
        """The saved fields, ``wall_s`` including this process's time so far."""
        state = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self._UNSAVED}
        return {**state, "wall_s": self.elapsed()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> LoopState:
        """The loop saved by :meth:`state_dict`, marked as resumed at its step."""
        return cls(**{k: v for k, v in state.items() if k not in cls._UNSAVED}, resumed_at=state["step"])

    def elapsed(self) -> float:
        """Wall-clock seconds of the whole run so far, earlier processes included."""
        return self.wall_s + time.perf_counter() - self.clock

    def diverge(self, reason: str) -> None:
        """End the run as diverged at the current step."""
        self.status, self.diverged_at, self.diverged_reason = "diverged", self.step, reason

    def evaluated_now(self) -> bool:
        """Whether the model at the current step has been evaluated."""
        return bool(self.curve) and self.curve[-1]["step"] == self.step

    def record_evaluation(self, metrics: dict[str, float], train_loss: float | None, config, last: bool) -> bool:
        """Add an evaluation at the current step to the curve and the early-stopping count.

        Returns whether the run stops here: the loss is non-finite (diverged), reaches
        ``config.target_loss`` (converged), or has not improved on the best for ``config.patience``
        evaluations in a row (plateau; not checked for the ``last`` evaluation, after the budget).
        """
        self.last_eval = dict(metrics)
        point = {"step": self.step} if train_loss is None else {"step": self.step, "train_loss": train_loss}
        self.curve.append({**point, **{f"eval_{k}": v for k, v in metrics.items()}})
        loss = metrics["loss"]
        if not math.isfinite(loss):
            self.diverge(f"evaluation loss is {loss}")
            return True
        if not self.best_eval or loss < self.best_eval["loss"]:
            self.best_eval, self.best_step, self.since_best = dict(metrics), self.step, 0
        else:
            self.since_best += 1
        if loss <= config.target_loss:
            self.status = "converged"
        elif self.since_best >= config.patience and not last:
            self.status = "plateau"
        return self.status != "max_steps"


def redraw_random_features(model: torch.nn.Module, stream: torch.Generator | None = None) -> None:
    """Draw new random features (FAVOR+) in every feature map of ``model``: once per training step.

    With ``stream``, the draws come from that generator (and advance it) instead of torch's global
    RNG, which is left as it was: every rank of a data-parallel group then draws the same Ω.
    """
    maps = [module for module in model.modules() if isinstance(module, FeatureMap)]
    if stream is None:
        for feature_map in maps:
            feature_map.redraw_features()
        return
    global_state = torch.get_rng_state()
    torch.set_rng_state(stream.get_state())
    try:
        for feature_map in maps:
            feature_map.redraw_features()
    finally:
        stream.set_state(torch.get_rng_state())
        torch.set_rng_state(global_state)


def _gradients_finite(model: torch.nn.Module) -> bool:
    """Whether every gradient element of ``model`` is finite (no NaN, no ±inf); runs every step."""
    return all_finite(p.grad for p in model.parameters() if p.grad is not None)


def _rank_rng(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's own global RNG states (dropout's stream), which differ between ranks."""
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


class _Training:
    """One run's model, optimiser, schedule and random streams, and the step, evaluation and
    checkpoint operations :func:`fit` composes."""

    def __init__(self, task_name: str, variant: str, config, seed: int, device: torch.device, check_finite: bool,
                 distributed: DistributedContext | None, checkpoint_path: str | Path | None):
        self.task, self.task_name, self.variant = TASKS[task_name], task_name, variant
        # a config built in code (not from a grid, which checks it) gets the same checks, before any step
        config = check_task_config(f"{task_name} config", self.task, config, run_id_types=False)
        self.config, self.seed, self.device, self.distributed = config, seed, device, distributed
        torch.manual_seed(seed)
        self.model = self.task.build_model(config, variant).to(device)
        set_check_finite(self.model, check_finite)
        if distributed is not None:
            distributed.check_batch_size(config.batch_size)
            if distributed.rank:  # the same initial weights on every rank, then each rank's own dropout
                torch.manual_seed(rank_stream_seed(seed, distributed.rank))
        # the module the loss runs through: DDP averages gradients across ranks in backward
        self.trained = self.model if distributed is None else distributed.wrap(self.model, device)
        self.is_main = distributed is None or distributed.is_main
        self.optimizer = build_optimizer(self.model, config)
        self.schedule = build_schedule(self.optimizer, config)
        self.generators = {"train": torch.Generator().manual_seed(seed),
                           "eval": torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET),
                           "features": torch.Generator().manual_seed(seed + FEATURE_SEED_OFFSET)}
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = getattr(config, "checkpoint_every", 0) if checkpoint_path is not None else 0

    def train_step(self, loop: LoopState) -> float | None:
        """One optimiser step (``loop.step`` advances); the training loss, or ``None`` once diverged."""
        self.model.train()
        redraw_random_features(self.model, self.generators["features"])
        started = time.perf_counter()
        batch = self.task.train_batch(self.config, self.generators["train"])
        batch = to_device(batch if self.distributed is None else self.distributed.shard(batch), self.device)
        loop.step += 1
        failure, loss = None, None
        try:
            loss = self.task.loss(self.trained, batch, self.config)
        except NonFiniteError as exc:
            failure = f"training: {exc}"
        loss_value = math.nan if failure else loss.item()
        if self.distributed is not None:  # every rank stops at the same step, or none does
            failed, loss_value = self.distributed.any_rank(failure is not None, loss_value, self.device)
            if failed and failure is None:
                failure = "training: a non-finite loss or tensor on one of the ranks"
        if failure is not None or not math.isfinite(loss_value):
            loop.diverge(failure or f"training loss is {loss_value}")
            return None
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not _gradients_finite(self.model):
            loop.diverge("non-finite gradient (not applied)")
            return None
        clip_gradients(self.model, self.config)
        self.optimizer.step()
        if self.schedule is not None:
            self.schedule.step()
        loop.train_s += time.perf_counter() - started
        return loss_value

    def evaluate(self, loop: LoopState, train_loss: float | None, last: bool = False) -> bool:
        """Evaluate the model at ``loop.step`` and record it; returns whether the run stops here."""
        self.model.eval()
        try:
            metrics = self.task.evaluate(self.model, self.config, self.generators["eval"], self.device)
        except NonFiniteError as exc:
            loop.diverge(f"evaluation: {exc}")
            return True
        return loop.record_evaluation(metrics, train_loss, self.config, last)

    def save(self, loop: LoopState, final: bool = False) -> None:
        """Write the checkpoint (rank 0; every rank contributes its own dropout stream)."""
        ranks = None if self.distributed is None else self.distributed.gather(_rank_rng(self.device))
        if not self.is_main:
            return
        save_checkpoint(self.checkpoint_path, {
            "task": self.task_name, "variant": self.variant, "seed": self.seed, "config": asdict(self.config),
            "loop": {**loop.state_dict(), "finished": final},
            "model": self.model.state_dict(),
            # a finished run keeps only what sampling and a re-evaluation need
            "optimizer": None if final else self.optimizer.state_dict(),
            "schedule": None if final or self.schedule is None else self.schedule.state_dict(),
            "rng": {**rng_states(self.generators, self.device), "ranks": ranks},
        })

    def save_if_due(self, loop: LoopState) -> None:
        if self.checkpoint_every and loop.step % self.checkpoint_every == 0:
            self.save(loop)

    def resume(self) -> LoopState:
        """The loop state of the checkpoint (model, optimiser and streams restored), or a fresh one."""
        if self.checkpoint_every and self.is_main:  # the one process that writes this run's checkpoint
            discard_unfinished_writes(self.checkpoint_path)
        saved = load_checkpoint(self.checkpoint_path, self.device) if self.checkpoint_every else None
        if saved is None:
            return LoopState()
        self.model.load_state_dict(saved["model"])
        if saved["optimizer"] is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
        if self.schedule is not None and saved["schedule"] is not None:
            self.schedule.load_state_dict(saved["schedule"])
        restore_rng_states(saved["rng"], self.generators, self.device)  # the global stream: rank 0's
        loop = LoopState.from_state_dict(saved["loop"])
        ranks = saved["rng"].get("ranks")
        if self.distributed is not None and ranks is not None and len(ranks) == self.distributed.world_size:
            restore_rng_states(ranks[self.distributed.rank], {}, self.device)
        elif self.distributed is not None and self.distributed.rank:
            # no stream of this rank in the file (a one-process run, another group size): rank 0's
            # restored above would give every rank the same dropout masks from here on
            torch.manual_seed(rank_stream_seed(self.seed, self.distributed.rank, loop.step))
        return loop

    def result(self, loop: LoopState) -> FitResult:
        """The run's :class:`FitResult`, after the task's final evaluation (rank 0, runs that did not diverge)."""
        summary = None
        if self.distributed is not None:
            summary = {"world_size": self.distributed.world_size, "backend": self.distributed.backend,
                       "parameter_sha256": self.distributed.gather(parameter_digest(self.model))}
        final_evaluation = {}
        if hasattr(self.task, "final_evaluation") and loop.status != "diverged" and self.is_main:
            self.model.eval()
            final_evaluation = self.task.final_evaluation(self.model, self.config, self.device, self.seed)
        return FitResult(
            status=loop.status, steps=loop.step, best_eval=loop.best_eval, final_eval=loop.last_eval,
            best_step=loop.best_step, curve=loop.curve, diverged_at=loop.diverged_at,
            diverged_reason=loop.diverged_reason, wall_s=loop.elapsed(), train_s=loop.train_s,
            parameters=sum(p.numel() for p in self.model.parameters()), resumed_at=loop.resumed_at,
            final_evaluation=final_evaluation, distributed=summary,
        )


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

    Training and evaluation run with denormal floats flushed to zero on the calling thread
    (:func:`variants.kernels.precision.denormals_flushed`): values below 1.2e-38 count as 0 (in all
    of the work with one torch thread; other intra-op threads keep their own mode).

    ``check_finite`` (default on) switches on the NaN/inf check of every attention module of the
    model (:func:`variants.set_check_finite`): a non-finite tensor reaching attention ends the run
    as diverged, with the step and the tensor named in ``diverged_reason``.

    ``distributed`` (under ``torchrun``): the model trains inside DistributedDataParallel, each rank
    on its slice of the global batch of ``config.batch_size`` rows; only rank 0 saves checkpoints
    and runs ``final_evaluation`` (see :mod:`fwbench.run.distributed`).

    Raises:
        FwbenchError: a config value out of range (the task's ``validate``: e.g. ``target_loss`` < 0),
            or, under ``torchrun``, ``config.batch_size`` is not a multiple of the world size.
    """
    run = _Training(task_name, variant, config, seed, device, check_finite, distributed, checkpoint_path)
    config = run.config  # as checked: each number the Python number it trains with
    with denormals_flushed():  # a model drifting into denormal numbers slows down 5x on x86 CPUs
        loop = run.resume()
        while not loop.finished and loop.step < config.max_steps:
            loss = run.train_step(loop)
            if loss is None:
                break
            if on_progress is not None:
                on_progress(loop.step, loss)
            if loop.step % config.eval_every == 0 and run.evaluate(loop, loss):
                break
            run.save_if_due(loop)
        if loop.status == "max_steps" and not loop.evaluated_now():  # the model the run ends with
            run.evaluate(loop, None, last=True)
        if run.checkpoint_every and not loop.finished:
            run.save(loop, final=True)
        return run.result(loop)
