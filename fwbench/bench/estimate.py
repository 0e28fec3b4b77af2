"""``fwbench estimate GRID --profile P``: the predicted wall time and core-hours of a grid profile.

For every cell of the profile: steps per run × seconds per step, plus evaluations × seconds per evaluation.

- Steps per run: for a retrieval cell, the ``last_step`` of the official run of the same setting,
  variant and S (``analysis/reference_data/official_synthetic_results.csv``: the step at which the
  official code stopped, on the same stopping rule), capped by the cell's ``max_steps``, but only
  when the cell trains with the official run's setup (its lr and batch_size: 1e-3 and 32, tanh-fwm's
  1e-4 and 128, as :func:`fwbench.analysis.reference.official_records` gives them); another lr or
  batch converges after another number of steps, so such a cell, one the logs lack (and every
  language-model or MQAR cell) counts the cell's ``max_steps``, the most it can take. The
  ``source`` column says which, and why a logged cell was capped. The official logs hold one seed:
  every seed of a cell is predicted to take that seed's steps.
- Seconds per step: measured here, a few training steps of the real loop (:func:`fit`: batch,
  forward, backward, optimiser; 1 torch thread) per distinct step shape, i.e. per (task, variant,
  config without the keys that do not change a step's cost: lr, seeds, stopping and evaluation
  settings). The median of ``steps`` step intervals after one warm-up step, in CPU time of the
  training thread: the time a step needs a core for. Its wall time grows with the number of other
  runnable processes (~4× with 8 on 2 cores); its CPU time less, but not nothing: the same dpfp ν=3
  step at S=400 took 41 ms and, at another moment of a load of 6–7, 67 ms (other jobs' use of caches
  and memory, likely), while a second worker of the same grid adds ~5 % (one paused and resumed).
- Evaluations per run: the training loop (:func:`fwbench.run.training.fit`) evaluates every
  ``eval_every`` steps and once more at a last step that is not a multiple of it, so a run of n steps
  evaluates ⌈n / eval_every⌉ times; a task with a ``final_evaluation`` (the language model: the whole
  validation split, the long-context evaluations, a sample) runs it once after training.
- Seconds per evaluation: measured here as steps are, per evaluation shape (the step shape plus the
  evaluation size: ``eval_sequences`` × S queries for retrieval, ``eval_segments`` for the LM), the
  median of a few evaluations of the freshly built model after one warm-up, in CPU seconds; the
  final evaluation is timed once. An evaluation costs what a trained model's does: the forward pass
  does not depend on the weights.

Core-hours = Σ over runs of (steps × s/step + evaluations × s/evaluation + final evaluation) (one core
per run). Wall time with ``--jobs N`` (:mod:`fwbench.bench.schedule`): the runs' predicted seconds
handed out to N workers in the order the local launcher hands them out (grid order, each grid after
the one before), i.e. the time the last worker finishes, on N free cores; on a shared machine, wall
time is longer by the sharing. Not counted: process start-up, model construction, writing records
and checkpoints, the speed-up of packed runs (``--jobs 1`` packs runs that share shapes), a step
that grows slower as the run trains (the first steps are timed: FAVOR+ delta at S=140 in Setting 2
goes from ~37 to ~155 ms of CPU per step over 3000 steps, denormal floats), and other processes on
the machine. An estimate: measured runs are the check (``--against RESULTS_DIR``, per grid and per
cell; the README marks each figure as which).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from fwbench.analysis.reference import official_records
from fwbench.bench.schedule import makespan
from fwbench.bench.summary import markdown_cell
from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec
from fwbench.tasks.corpus import CorpusError
from fwbench.variants import parse_spec
from fwbench.variants.errors import shown

#: Config keys that change how many steps a run takes or when it evaluates, not what one step costs.
STEP_COST_FREE_KEYS = frozenset({"lr", "max_steps", "target_loss", "patience", "eval_every", "eval_sequences",
                                 "checkpoint_every"})
#: Config keys that change neither a step's nor an evaluation's cost (evaluation shapes keep the
#: evaluation's size: ``eval_sequences``, ``eval_segments``).
EVAL_COST_FREE_KEYS = STEP_COST_FREE_KEYS - {"eval_sequences"}
#: Evaluations timed per evaluation shape, after one warm-up (the final evaluation: once).
EVAL_REPEATS = 3
#: Step source labels of the table: the official log's step count, the cap for a cell the logs lack,
#: the cap for a logged (variant, S) trained with another lr or batch size than the official run.
OFFICIAL, CAP = "official log", "cap (max_steps)"
CAP_OTHER_SETUP = "cap (max_steps; lr/batch ≠ official run)"


@dataclass(frozen=True)
class CellEstimate:
    """One (variant, config) cell: its runs (seeds), steps per run and where that figure comes from,
    seconds per step, evaluations per run and seconds per evaluation (CPU seconds, one core), and the
    cell's core-hours (runs × :attr:`run_s` / 3600)."""

    variant: str
    config: dict
    runs: int
    steps: int
    source: str
    step_s: float
    #: why its step could not be timed (the model cannot be built, the task refuses the config),
    #: the message ``fwbench run`` would record for it as failed; ``None`` when it was timed
    error: str | None = None
    #: evaluations per run (⌈steps / eval_every⌉) and CPU seconds of one, of the final evaluation
    evaluations: int = 0
    eval_s: float = 0.0
    final_eval_s: float = 0.0

    @property
    def run_s(self) -> float:
        """Predicted CPU seconds of one run: steps × s/step + evaluations × s/evaluation + the final
        evaluation; 0 for a failed cell (``fwbench run`` spends no training on it)."""
        if self.error is not None:
            return 0.0
        return self.steps * self.step_s + self.evaluations * self.eval_s + self.final_eval_s

    @property
    def core_hours(self) -> float:
        """runs × :attr:`run_s` in hours."""
        return self.runs * self.run_s / 3600


def cell_key(spec: RunSpec) -> tuple:
    """The key of the cell a run belongs to: its variant and whole config (seeds share a cell)."""
    return (spec.variant, tuple(sorted(spec.config.items())))


def step_shape(spec: RunSpec) -> tuple:
    """The key under which one measured step time serves several runs: task, variant and the
    config keys that change a step's cost."""
    return (spec.task, spec.variant,
            tuple(sorted((k, v) for k, v in spec.config.items() if k not in STEP_COST_FREE_KEYS)))


def eval_shape(spec: RunSpec) -> tuple:
    """The key under which one measured evaluation time serves several runs: the step shape plus the
    evaluation's size."""
    return (spec.task, spec.variant,
            tuple(sorted((k, v) for k, v in spec.config.items() if k not in EVAL_COST_FREE_KEYS)))


def evaluations_per_run(steps: int, eval_every: int) -> int:
    """How many evaluations :func:`fwbench.run.training.fit` runs in ``steps`` steps: one every
    ``eval_every`` steps and one at a last step between two of them, i.e. ⌈steps / eval_every⌉."""
    return math.ceil(steps / eval_every)


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


#: The most steps ``fwbench estimate --steps`` times per cell: their median is as good an estimate as more would
#: give, and each is a training step (``--steps 10**12`` printed nothing for minutes, timing a trillion steps of
#: a grid whose runs take 6; 2**63 - 2 was refused as a ``max_steps`` the user never gave).
MAX_ESTIMATE_STEPS = 1000


def check_estimate_steps(steps: int) -> None:
    """Refuse a ``--steps`` outside [1, :data:`MAX_ESTIMATE_STEPS`].

    Raises:
        FwbenchError: naming ``--steps``.
    """
    if not 1 <= steps <= MAX_ESTIMATE_STEPS:
        raise FwbenchError(f"--steps: got {shown(steps)}; expected an integer in [1, {MAX_ESTIMATE_STEPS}] (the "
                           "median of that many timed training steps per run)")


def measure_step_seconds(spec: RunSpec, steps: int = 3, device: torch.device | None = None) -> float:
    """Median CPU seconds (this thread's) of ``steps`` training steps of ``spec`` after one warm-up
    step, timed between consecutive steps of the training loop (:func:`fwbench.run.training.fit`,
    no evaluation). With one torch thread (the runs' default) the step's work runs on this thread.

    Raises:
        FwbenchError: ``steps`` outside [1, :data:`MAX_ESTIMATE_STEPS`] (:func:`check_estimate_steps`).
    """
    from fwbench.run.training import fit

    check_estimate_steps(steps)
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


def measure_eval_seconds(spec: RunSpec, repeats: int = EVAL_REPEATS,
                         device: torch.device | None = None) -> tuple[float, float]:
    """(seconds of one evaluation, seconds of the final evaluation) of ``spec``, in CPU seconds of
    this thread: the median of ``repeats`` calls of the task's ``evaluate`` on the freshly built model
    (seeded, as :func:`fwbench.run.training.fit` builds it) after one warm-up, and one call of its
    ``final_evaluation`` (0.0 for a task without one). Training is not timed here.

    The NaN/inf checks are off, so that a model that is non-finite from the start (an unnormalised
    rule) is timed over its whole forward pass, what it costs until the loop stops it; such a model's
    run ends as diverged, which :func:`fit` gives no final evaluation: 0.0 then.

    Raises:
        FwbenchError: ``repeats`` < 1.
    """
    from fwbench.tasks import TASKS
    from fwbench.variants import set_check_finite

    if repeats < 1:
        raise FwbenchError(f"repeats: got {repeats}; expected a positive integer")
    device = device or torch.device("cpu")
    task, config = TASKS[spec.task], spec.task_config()
    torch.manual_seed(spec.seed)
    model = task.build_model(config, spec.variant).to(device)
    set_check_finite(model, False)
    model.eval()
    generator = torch.Generator().manual_seed(spec.seed)
    times, finite = [], True
    for _ in range(repeats + 1):
        start = time.thread_time()
        metrics = task.evaluate(model, config, generator, device)
        times.append(time.thread_time() - start)
        finite = finite and math.isfinite(metrics["loss"])
    final_s = 0.0
    if finite and hasattr(task, "final_evaluation"):
        start = time.thread_time()
        task.final_evaluation(model, config, device, spec.seed)
        final_s = time.thread_time() - start
    return statistics.median(times[1:]), final_s


def _no_evaluation(spec: RunSpec) -> tuple[float, float]:
    return 0.0, 0.0


def estimate(specs: list[RunSpec], step_timer: Callable[[RunSpec], float] = measure_step_seconds,
             on_cell: Callable[[CellEstimate], None] | None = None,
             eval_timer: Callable[[RunSpec], tuple[float, float]] | None = measure_eval_seconds) -> list[CellEstimate]:
    """One :class:`CellEstimate` per (variant, config without seed) of ``specs``, in grid order;
    ``step_timer`` is called once per distinct :func:`step_shape`, ``eval_timer`` (returning the
    seconds of one evaluation and of the final one) once per distinct :func:`eval_shape` of a cell
    whose step was timed; ``eval_timer=None`` leaves evaluations out (a training-only estimate)."""
    official = official_steps()
    eval_timer = eval_timer or _no_evaluation
    step_seconds: dict[tuple, float | str] = {}  # seconds, or the error of a shape that failed
    eval_seconds: dict[tuple, tuple[float, float] | str] = {}
    cells: dict[tuple, CellEstimate] = {}
    for spec in specs:
        key = cell_key(spec)
        if key in cells:
            cells[key] = replace(cells[key], runs=cells[key].runs + 1)
            continue
        shape = step_shape(spec)
        if shape not in step_seconds:
            step_seconds[shape] = _timed_or_error(step_timer, spec)
        timed = step_seconds[shape]
        if not isinstance(timed, str) and eval_shape(spec) not in eval_seconds:
            eval_seconds[eval_shape(spec)] = _timed_or_error(eval_timer, spec)
        evaluated = eval_seconds.get(eval_shape(spec), (0.0, 0.0))
        error = timed if isinstance(timed, str) else evaluated if isinstance(evaluated, str) else None
        steps, source = steps_needed(spec, official)
        eval_s, final_s = (0.0, 0.0) if error else evaluated
        cells[key] = CellEstimate(spec.variant, dict(spec.config), 1, steps, source, 0.0 if error else timed, error,
                                  evaluations_per_run(steps, spec.task_config().eval_every), eval_s, final_s)
        if on_cell is not None:
            on_cell(cells[key])
    return list(cells.values())


def _timed_or_error(timer: Callable[[RunSpec], object], spec: RunSpec) -> object:
    """``timer(spec)`` (a float, or a tuple of floats), or the one-line error of a cell that fails as
    ``fwbench run`` would record it (any exception but the user's setup: :class:`FwbenchError`,
    :class:`CorpusError`, which every cell would hit alike and which end the command in one line)."""
    try:
        timed = timer(spec)
        return tuple(float(t) for t in timed) if isinstance(timed, tuple) else float(timed)
    except (FwbenchError, CorpusError):
        raise
    except Exception as exc:  # a broken cell must not take the estimate down with it, as in fwbench run
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _duration(hours: float) -> str:
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.1f} h"


def run_seconds(specs: list[RunSpec], cells: list[CellEstimate]) -> list[float]:
    """The predicted CPU seconds (:attr:`CellEstimate.run_s`) of each of ``specs``, in their order."""
    by_key = {cell_key_of(cell): cell.run_s for cell in cells}
    return [by_key[cell_key(spec)] for spec in specs]


def cell_key_of(cell: CellEstimate) -> tuple:
    """:func:`cell_key` of the runs of ``cell``."""
    return (cell.variant, tuple(sorted(cell.config.items())))


def format_estimate(cells: list[CellEstimate], title: str, jobs: int = 2, wall_s: float | None = None) -> str:
    """A Markdown table (variant, S or shape, runs, steps/run, source, s/step, evaluations/run,
    s/evaluation, core-hours) and the totals: core-hours, and wall time on one core and with
    ``--jobs jobs`` on as many free cores: ``wall_s`` (the schedule of the runs in launch order,
    :mod:`fwbench.bench.schedule`), or, when not given, the schedule of the cells' runs in table order."""
    lines = [f"### {title}", "",
             "| variant | cell | runs | steps/run | steps from | CPU s/step | evals/run | CPU s/eval | core-h |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cell in cells:
        shown = {k: v for k, v in cell.config.items() if k in ("setting", "S", "d_model", "n_layers", "context")}
        where = ", ".join(f"{k}={v}" for k, v in shown.items())
        if cell.error is not None:
            timed = f"failed: {markdown_cell(cell.error)} | | "
        else:
            final = f" + final {cell.final_eval_s:.2f}" if cell.final_eval_s else ""
            timed = f"{cell.step_s:.4f} | {cell.evaluations} | {cell.eval_s:.4f}{final}"
        # a registered variant's name may hold a '|' (my|map), which split the row
        lines.append(f"| {markdown_cell(cell.variant)} | {markdown_cell(where)} | {cell.runs} | {cell.steps} | "
                     f"{cell.source} | {timed} | "
                     f"{cell.core_hours:.3f} |")
    total = sum(cell.core_hours for cell in cells)
    runs = sum(cell.runs for cell in cells)
    if wall_s is None:
        wall_s = makespan((cell.run_s for cell in cells for _ in range(cell.runs)), jobs)
    longest = max((cell.run_s for cell in cells), default=0.0) / 3600
    capped = sum(cell.core_hours for cell in cells if cell.source in (CAP, CAP_OTHER_SETUP))
    evaluations = sum(cell.runs * (cell.evaluations * cell.eval_s + cell.final_eval_s) for cell in cells) / 3600
    lines += ["", f"Total (estimated): {runs} runs, {total:.2f} core-hours ({evaluations:.2f} of them evaluations); "
              f"wall {_duration(total)} on one core, {_duration(wall_s / 3600)} with --jobs {jobs} on {jobs} free cores "
              f"(runs handed out in grid order; the longest run takes {_duration(longest)}). "
              f"Of these, {capped:.2f} core-hours "
              "are cells without an official log of their setup, counted at their max_steps (an upper bound)."]
    failed = [cell for cell in cells if cell.error is not None]
    if failed:
        lines.append(f"{len(failed)} cell(s) ({sum(cell.runs for cell in failed)} runs) failed to build or train "
                     "(fwbench run records them as failed): counted as 0 core-hours.")
    return "\n".join(lines)
