"""``fwbench estimate GRID --profile P``: the predicted wall time and core-hours of a grid profile.

For every cell of the profile: steps per run × seconds per step on this machine.

- Steps per run: for a retrieval cell, the ``last_step`` of the official run of the same setting,
  variant and S (``analysis/reference_data/official_synthetic_results.csv``: the step at which the
  official code stopped, on the same stopping rule), capped by the cell's ``max_steps``, but only
  when the cell trains with the official run's setup (its lr and batch_size: 1e-3 and 32, tanh-fwm's
  1e-4 and 128, as :func:`fwbench.analysis.reference.official_records` gives them); another lr or
  batch converges after another number of steps, so such a cell, one the logs lack (and every
  language-model or MQAR cell) counts the cell's ``max_steps``, the most it can take. The
  ``source`` column says which, and why a logged cell was capped.
- Seconds per step: measured here, a few training steps of the real loop (:func:`fit`: batch,
  forward, backward, optimiser; 1 torch thread) per distinct step shape, i.e. per (task, variant,
  config without the keys that do not change a step's cost: lr, seeds, stopping and evaluation
  settings). The median of ``steps`` step intervals after one warm-up step, in CPU time of the
  training thread: the time a step needs a core for, which stays put while other processes share
  the machine (its wall time then grows with their number: ~4× with 8 runnable processes on 2 cores).

Core-hours = Σ over runs of steps × s/step (one core per run); wall hours with ``--jobs N`` on N free
cores ≈ core-hours / N; on a shared machine, wall time is longer by the sharing. Not counted:
evaluations (every ``eval_every`` steps, ``eval_sequences``
sequences without backward: about 1 % of the training time of the official setup) and process
start-up. An estimate: measured runs are the check (the README marks each figure as which).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from fwbench.analysis.reference import official_records
from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec
from fwbench.tasks.corpus import CorpusError
from fwbench.variants import parse_spec

#: Config keys that change how many steps a run takes or when it evaluates, not what one step costs.
STEP_COST_FREE_KEYS = frozenset({"lr", "max_steps", "target_loss", "patience", "eval_every", "eval_sequences",
                                 "checkpoint_every"})
#: Step source labels of the table: the official log's step count, the cap for a cell the logs lack,
#: the cap for a logged (variant, S) trained with another lr or batch size than the official run.
OFFICIAL, CAP = "official log", "cap (max_steps)"
CAP_OTHER_SETUP = "cap (max_steps; lr/batch ≠ official run)"


@dataclass(frozen=True)
class CellEstimate:
    """One (variant, config) cell: its runs (seeds), steps per run and where that figure comes from,
    seconds per step, and the cell's core-hours (runs × steps × s/step / 3600)."""

    variant: str
    config: dict
    runs: int
    steps: int
    source: str
    step_s: float
    #: why its step could not be timed (the model cannot be built, the task refuses the config),
    #: the message ``fwbench run`` would record for it as failed; ``None`` when it was timed
    error: str | None = None

    @property
    def core_hours(self) -> float:
        """0 for a failed cell: ``fwbench run`` spends no training on it."""
        return 0.0 if self.error is not None else self.runs * self.steps * self.step_s / 3600


def step_shape(spec: RunSpec) -> tuple:
    """The key under which one measured step time serves several runs: task, variant and the
    config keys that change a step's cost."""
    return (spec.task, spec.variant,
            tuple(sorted((k, v) for k, v in spec.config.items() if k not in STEP_COST_FREE_KEYS)))


def _canonical(spec: str) -> str:
    return str(parse_spec(spec))


@dataclass(frozen=True)
class OfficialRun:
    """The official seed-1 run of one (setting, variant, S): where it stopped and its setup."""

    last_step: int
    lr: float
    batch_size: int


def official_steps() -> dict[tuple[int, str, int], OfficialRun]:
    """(setting, canonical variant spec, S) → the official seed-1 run's last step, lr and batch size."""
    frame = official_records((1,))
    return {(int(row.setting), _canonical(row.variant), int(row.S)):
            OfficialRun(int(row.steps), float(row.lr), int(row.batch_size)) for row in frame.itertuples()}


def steps_needed(spec: RunSpec, official: dict[tuple[int, str, int], OfficialRun]) -> tuple[int, str]:
    """(steps, source) of one run: the official log's last step (capped by max_steps) when the run
    has the official run's setting, variant, S, lr and batch size; else max_steps, labelled
    :data:`CAP_OTHER_SETUP` when only lr or batch size differ."""
    config = spec.task_config()
    cap = int(config.max_steps)
    if spec.task == "retrieval":
        run = official.get((int(config.setting), _canonical(spec.variant), int(config.S)))
        if run is not None:
            if float(config.lr) == run.lr and int(config.batch_size) == run.batch_size:
                return min(run.last_step, cap), OFFICIAL
            return cap, CAP_OTHER_SETUP
    return cap, CAP


def measure_step_seconds(spec: RunSpec, steps: int = 3, device: torch.device | None = None) -> float:
    """Median CPU seconds (this thread's) of ``steps`` training steps of ``spec`` after one warm-up
    step, timed between consecutive steps of the training loop (:func:`fwbench.run.training.fit`,
    no evaluation). With one torch thread (the runs' default) the step's work runs on this thread.

    Raises:
        FwbenchError: ``steps`` < 1.
    """
    from fwbench.run.training import fit

    if steps < 1:
        raise FwbenchError(f"--steps: got {steps}; expected a positive integer")
    config = replace(spec.task_config(), max_steps=steps + 2, eval_every=10**9)
    ends: list[float] = []
    fit(spec.task, spec.variant, config, spec.seed, device or torch.device("cpu"),
        on_progress=lambda step, loss: ends.append(time.thread_time()))
    intervals = [b - a for a, b in zip(ends[1:], ends[2:])]
    if not intervals:  # the run ended (diverged) within two steps: time its steps outside the loop
        return _bare_step_seconds(spec, steps)
    return statistics.median(intervals)


def _bare_step_seconds(spec: RunSpec, steps: int) -> float:
    """Median CPU seconds of ``steps`` steps (batch, loss, backward, Adam) after one warm-up,
    outside the training loop, so that a run that goes non-finite at once still has a step cost
    (a diverging run costs as much per step until the loop stops it)."""
    from fwbench.tasks import TASKS

    task, config = TASKS[spec.task], spec.task_config()
    torch.manual_seed(spec.seed)
    model = task.build_model(config, spec.variant)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(spec.seed)
    times = []
    for _ in range(steps + 1):
        start = time.thread_time()
        loss = task.loss(model, task.train_batch(config, generator), config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.thread_time() - start)
    return statistics.median(times[1:])


def estimate(specs: list[RunSpec], step_timer: Callable[[RunSpec], float] = measure_step_seconds,
             on_cell: Callable[[CellEstimate], None] | None = None) -> list[CellEstimate]:
    """One :class:`CellEstimate` per (variant, config without seed) of ``specs``, in grid order;
    ``step_timer`` is called once per distinct :func:`step_shape`."""
    official = official_steps()
    step_seconds: dict[tuple, float | str] = {}  # seconds, or the error of a shape that failed
    cells: dict[tuple, CellEstimate] = {}
    for spec in specs:
        key = (spec.variant, tuple(sorted(spec.config.items())))
        if key in cells:
            cells[key] = replace(cells[key], runs=cells[key].runs + 1)
            continue
        shape = step_shape(spec)
        if shape not in step_seconds:
            step_seconds[shape] = _timed_or_error(step_timer, spec)
        steps, source = steps_needed(spec, official)
        timed = step_seconds[shape]
        error = timed if isinstance(timed, str) else None
        cells[key] = CellEstimate(spec.variant, dict(spec.config), 1, steps, source, 0.0 if error else timed, error)
        if on_cell is not None:
            on_cell(cells[key])
    return list(cells.values())


def _timed_or_error(step_timer: Callable[[RunSpec], float], spec: RunSpec) -> float | str:
    """``step_timer(spec)`` as a float, or the one-line error of a cell that fails as ``fwbench run``
    would record it (any exception but the user's setup: :class:`FwbenchError`, :class:`CorpusError`,
    which every cell would hit alike and which end the command in one line)."""
    try:
        return float(step_timer(spec))
    except (FwbenchError, CorpusError):
        raise
    except Exception as exc:  # a broken cell must not take the estimate down with it, as in fwbench run
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _duration(hours: float) -> str:
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.1f} h"


def format_estimate(cells: list[CellEstimate], title: str, jobs: int = 2) -> str:
    """A Markdown table (variant, S or shape, runs, steps/run, source, s/step, core-hours) and the
    totals: core-hours, and wall time on one core and with ``--jobs jobs`` on as many free cores."""
    lines = [f"### {title}", "",
             "| variant | cell | runs | steps/run | steps from | CPU s/step | core-h |", "|---|---|---|---|---|---|---|"]
    for cell in cells:
        shown = {k: v for k, v in cell.config.items() if k in ("setting", "S", "d_model", "n_layers", "context")}
        where = ", ".join(f"{k}={v}" for k, v in shown.items())
        step = f"failed: {cell.error}" if cell.error is not None else f"{cell.step_s:.4f}"
        lines.append(f"| {cell.variant} | {where} | {cell.runs} | {cell.steps} | {cell.source} | "
                     f"{step} | {cell.core_hours:.3f} |")
    total = sum(cell.core_hours for cell in cells)
    runs = sum(cell.runs for cell in cells)
    capped = sum(cell.core_hours for cell in cells if cell.source in (CAP, CAP_OTHER_SETUP))
    lines += ["", f"Total (estimated): {runs} runs, {total:.2f} core-hours; wall {_duration(total)} on one core, "
              f"{_duration(total / jobs)} with --jobs {jobs} on {jobs} free cores. Of these, {capped:.2f} core-hours "
              "are cells without an official log of their setup, counted at their max_steps (an upper bound)."]
    failed = [cell for cell in cells if cell.error is not None]
    if failed:
        lines.append(f"{len(failed)} cell(s) ({sum(cell.runs for cell in failed)} runs) failed to build or train "
                     "(fwbench run records them as failed): counted as 0 core-hours.")
    return "\n".join(lines)
