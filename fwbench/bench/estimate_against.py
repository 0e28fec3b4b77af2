"""``fwbench estimate ... --against RESULTS_DIR``: the estimate beside the runs a results store measured.

Per grid and in total, for the runs of the profile that have a finished record in the store:

- core time: predicted core-hours (:attr:`CellEstimate.run_s` summed) against the records' summed
  ``wall_s`` (each run's own wall time, training, evaluations and final evaluation), split into the
  ratio of step counts (Σ measured steps / Σ predicted steps) and of seconds per step (measured
  wall_s / steps against predicted run seconds / steps, evaluations included); and the training
  steps alone (a record's training seconds are ``steps / steps_per_s``, the loop's timed steps):
  measured over predicted training seconds per step, and the share of the time spent outside
  training steps (evaluations, final evaluation, set-up), predicted and measured;
- wall time: the predicted schedule on ``--jobs`` workers (:mod:`fwbench.bench.schedule`) of those
  runs against first ``started_at`` → last ``ended_at`` of their records.

Ratios are measured / predicted. A per-cell table gives the same split per cell, to find which cells
make a grid miss. The records' wall seconds include whatever else shared the machine; the
estimate's are CPU seconds of a free core, so a ratio above 1 can be the sharing, more steps than the
official log's one seed, or evaluation and per-run costs the estimate does not count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from fwbench.bench.estimate import CellEstimate, cell_key, cell_key_of, run_seconds
from fwbench.bench.schedule import makespan
from fwbench.bench.summary import markdown_cell
from fwbench.errors import one_line
from fwbench.run.grid import RunSpec


@dataclass(frozen=True)
class Comparison:
    """Predicted against measured for one grid (or the total) over its runs that have records."""

    name: str
    runs: int
    measured_runs: int
    predicted_core_s: float
    measured_core_s: float
    predicted_steps: int
    measured_steps: int
    predicted_wall_s: float
    measured_wall_s: float
    predicted_train_s: float = 0.0
    measured_train_s: float = 0.0

    @property
    def core_ratio(self) -> float:
        return _ratio(self.measured_core_s, self.predicted_core_s)

    @property
    def wall_ratio(self) -> float:
        return _ratio(self.measured_wall_s, self.predicted_wall_s)

    @property
    def steps_ratio(self) -> float:
        return _ratio(self.measured_steps, self.predicted_steps)

    @property
    def step_time_ratio(self) -> float:
        """Measured over predicted seconds per step (evaluations included in both)."""
        return _ratio(self.measured_core_s / max(self.measured_steps, 1), self.predicted_core_s / max(self.predicted_steps, 1))


    @property
    def train_step_ratio(self) -> float:
        """Measured over predicted training seconds per step (evaluations left out of both)."""
        return _ratio(self.measured_train_s / max(self.measured_steps, 1),
                      self.predicted_train_s / max(self.predicted_steps, 1))

    def outside_training(self) -> str:
        """The share of the time outside training steps, predicted / measured, in per cent."""
        predicted = 1 - self.predicted_train_s / self.predicted_core_s if self.predicted_core_s else 0.0
        measured = 1 - self.measured_train_s / self.measured_core_s if self.measured_core_s else 0.0
        return f"{predicted:.1%} / {measured:.1%}"


def _ratio(measured: float, predicted: float) -> float:
    return measured / predicted if predicted > 0 else float("nan")


def _instant(text: object) -> float | None:
    """Seconds since the epoch of an ISO 8601 timestamp; None for a record without one (an older or
    hand-edited record: its start or end is null, absent or not a timestamp)."""
    try:
        return datetime.fromisoformat(text).timestamp() if isinstance(text, str) else None
    except ValueError:
        return None


def _finished(specs: list[RunSpec], records: dict[str, dict]) -> list[RunSpec]:
    """The specs that have a finished record (not ``failed``)."""
    return [spec for spec in specs if records.get(spec.run_id, {}).get("status", "failed") != "failed"]


def _train_s(record: dict) -> float:
    """A record's seconds in training steps: ``steps / steps_per_s`` (0 when it has no rate)."""
    rate = record.get("steps_per_s")
    return record["steps"] / rate if rate else 0.0


def _window_s(found: list[dict]) -> float:
    """Seconds from the first record's start to the last one's end (0 without records; NaN where no
    record holds both timestamps: a window measured from some runs' times would understate it)."""
    if not found:
        return 0.0
    starts = [_instant(r.get("started_at")) for r in found]
    ends = [_instant(r.get("ended_at")) for r in found]
    if None in starts or None in ends:
        return float("nan")
    return max(ends) - min(starts)


def compare(name: str, specs: list[RunSpec], cells: list[CellEstimate], records: dict[str, dict],
            jobs: int) -> Comparison:
    """:class:`Comparison` of ``specs`` (in launch order) with their finished records (``records``:
    run_id → record; ``failed`` records and runs without one are left out of both sides)."""
    by_key = {cell_key_of(cell): cell for cell in cells}
    measured = _finished(specs, records)
    seconds = run_seconds(measured, cells)
    found = [records[spec.run_id] for spec in measured]
    return Comparison(
        name=name, runs=len(specs), measured_runs=len(found),
        predicted_core_s=sum(seconds), measured_core_s=sum(r["wall_s"] for r in found),
        predicted_steps=sum(by_key[cell_key(spec)].steps for spec in measured), measured_steps=sum(r["steps"] for r in found),
        predicted_wall_s=makespan(seconds, jobs), measured_wall_s=_window_s(found),
        predicted_train_s=sum(_train_seconds(by_key[cell_key(spec)]) for spec in measured),
        measured_train_s=sum(_train_s(r) for r in found))


def _train_seconds(cell: CellEstimate) -> float:
    return 0.0 if cell.error is not None else cell.steps * cell.step_s


def total(name: str, parts: list[Comparison], specs: list[RunSpec], records: dict[str, dict]) -> Comparison:
    """The grids of ``parts`` run one after another: sums, the wall predicted as the sum of the grids'
    schedules, measured from the first start to the last end over all of ``specs``' records."""
    wall = _window_s([records[spec.run_id] for spec in _finished(specs, records)])
    return Comparison(name, sum(p.runs for p in parts), sum(p.measured_runs for p in parts),
                      sum(p.predicted_core_s for p in parts), sum(p.measured_core_s for p in parts),
                      sum(p.predicted_steps for p in parts), sum(p.measured_steps for p in parts),
                      sum(p.predicted_wall_s for p in parts), wall,
                      sum(p.predicted_train_s for p in parts), sum(p.measured_train_s for p in parts))


def _minutes(seconds: float) -> str:
    return "n/a (a record without its start or end)" if math.isnan(seconds) else f"{seconds / 60:.1f} min"


def format_comparison(parts: list[Comparison], whole: Comparison, jobs: int, results_dir: str) -> str:
    """The per-grid and total table of predicted against measured core and wall time."""
    # the heading is one line: a --against holding a newline ended it there
    lines = [f"### Predicted vs measured ({one_line(results_dir)}; ratio = measured / predicted)", "",
             "| grid | runs with records | predicted core-h | measured run-h (Σ wall_s) | ratio | steps ratio | "
             "s/step ratio | training s/step ratio | outside training steps: predicted / measured | "
             f"predicted wall (--jobs {jobs}) | measured wall (first start → last end) | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for part in [*(part for part in parts if part.runs), whole]:  # a grid whose runs all belong to an earlier one: left out
        lines.append(f"| {markdown_cell(part.name)} | {part.measured_runs} of {part.runs} | {part.predicted_core_s / 3600:.2f} | "
                     f"{part.measured_core_s / 3600:.2f} | {part.core_ratio:.2f} | {part.steps_ratio:.2f} | "
                     f"{part.step_time_ratio:.2f} | {part.train_step_ratio:.2f} | {part.outside_training()} | "
                     f"{part.predicted_wall_s / 60:.1f} min | "
                     f"{_minutes(part.measured_wall_s)} | {part.wall_ratio:.2f} |")
    return "\n".join(lines)


def format_cells(grid_specs: list[tuple[str, list[RunSpec]]], cells: list[CellEstimate],
                 records: dict[str, dict]) -> str:
    """Per cell with records: predicted against mean measured steps per run, seconds per step
    (evaluations included; measured: Σ wall_s / Σ steps) and seconds per run, and the run-time ratio."""
    by_key = {cell_key_of(cell): cell for cell in cells}
    lines = ["| grid | variant | cell | runs | steps: predicted | measured (mean) | s/step: predicted | measured | "
             "s/run: predicted | measured (mean) | ratio |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, specs in grid_specs:
        groups: dict[tuple, list[dict]] = {}
        for spec in _finished(specs, records):
            groups.setdefault(cell_key(spec), []).append(records[spec.run_id])
        for key, found in groups.items():
            cell = by_key[key]
            steps = sum(r["steps"] for r in found)
            wall = sum(r["wall_s"] for r in found)
            shown = ", ".join(f"{k}={v}" for k, v in cell.config.items() if k in ("setting", "S", "lr", "d_model"))
            # a grid or registered variant named with a '|' (my|map) split the row
            lines.append(f"| {markdown_cell(name)} | {markdown_cell(cell.variant)} | {markdown_cell(shown)} | "
                         f"{len(found)} | {cell.steps} | {steps / len(found):.0f} | "
                         f"{cell.run_s / max(cell.steps, 1):.4f} | {wall / max(steps, 1):.4f} | {cell.run_s:.0f} | "
                         f"{wall / len(found):.0f} | {_ratio(wall / len(found), cell.run_s):.2f} |")
    return "\n".join(lines)
