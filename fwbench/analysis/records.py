"""From records to tables: flatten run records into a DataFrame, aggregate seeds, estimate capacity."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fwbench.run.strict_json import restore_non_finite

#: Best eval loss at or below which a memory counts as retrieving (the capacity threshold).
CAPACITY_THRESHOLD = 0.01


#: The metrics a finished run of each task records and the report reads by name. A run that diverges
#: before its first evaluation records none of them, so a store where every run of a task diverged would
#: have no such column (a KeyError in the report); :func:`records_frame` adds them as NaN, as a store
#: with one finished run has them for the diverged ones.
TASK_METRICS = {
    "retrieval": ("best_eval_accuracy", "final_eval_accuracy"),
    "mqar": ("best_eval_accuracy", "final_eval_accuracy"),
    "shakespeare": ("best_eval_bpc", "best_eval_ppl", "final_eval_bpc", "final_eval_ppl", "val_loss", "val_bpc",
                    "val_ppl", "unigram_bpc", "stream_bpc", "stream_ppl", "stream_reset_ppl", "carried_ppl_1x",
                    "carried_ppl_4x", "carried_ppl_16x"),
}


#: The metrics a finished run of every task records (``build_record``): a failed run records none
#: (``failed_record``: metrics {}), so a store whose every run failed had no ``best_eval_loss`` column and
#: the report raised KeyError: 'best_eval_loss'; :func:`records_frame` adds them as NaN like :data:`TASK_METRICS`.
COMMON_METRICS = ("best_eval_loss", "final_eval_loss", "best_step")


#: The fields every run record holds (``build_record``, ``failed_record``) and :func:`records_frame` reads,
#: with their types: a JSON object with a string ``run_id`` but without them is no run record fwbench wrote.
RUN_RECORD_FIELDS = {"task": str, "variant": dict, "seed": int, "status": str, "steps": int,
                     "wall_s": (int, float), "config": dict, "metrics": dict}


def readable_run_records(records: list[dict], source: str | Path) -> tuple[list[dict], list[str]]:
    """(the records :func:`records_frame` can read, a ``SOURCE: record 'ID' skipped: ...`` problem for each
    other one). A record of ``source`` (runs.jsonl) missing a field of :data:`RUN_RECORD_FIELDS`, or holding
    it as another type (a hand-edited line, another tool's JSON), made ``fwbench report`` a traceback
    (KeyError: 'task'); it is skipped and counted as the store skips a line that is not a record."""
    readable, problems = [], []
    for record in records:
        restored = restore_non_finite(record)  # a field written as null for being NaN is the float it was
        wrong = [name for name, kind in RUN_RECORD_FIELDS.items()
                 if isinstance(restored.get(name), bool) or not isinstance(restored.get(name), kind)]
        if not wrong and not isinstance(record["variant"].get("spec"), str):
            wrong = ["variant.spec"]
        if wrong:
            problems.append(f"{source}: record {record['run_id']!r} skipped: no run record "
                            f"(missing or mistyped: {', '.join(wrong)})")
        else:
            readable.append(record)
    return readable, problems


def load_run_records(results_dir: str | Path) -> tuple[list[dict], list[str]]:
    """(the run records of ``results_dir``'s runs.jsonl that :func:`records_frame` can read, a problem for
    every line or record skipped): the store's corrupt lines, then records that are no run record
    (:func:`readable_run_records`)."""
    from fwbench.run.store import ResultsStore

    store = ResultsStore(results_dir)
    loaded = store.load()
    records, unreadable = readable_run_records(loaded.records, store.path)
    return records, loaded.problems + unreadable


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: grid, task, variant spec, seed, every config field, metrics, status,
    and (as Python objects) the learning ``curve`` and the task's ``final_evaluation``. Every
    :data:`TASK_METRICS` column of the tasks present exists (NaN where a run did not measure it).
    A value the record lists in ``non_finite`` (written as null) is read as the float it was
    (:func:`~fwbench.run.strict_json.restore_non_finite`): an overflowed perplexity is inf, not missing."""
    rows = []
    for r in map(restore_non_finite, records):  # values written as null because they were inf or NaN
        row = {
            "run_id": r["run_id"], "grid": r.get("grid"), "task": r["task"], "variant": r["variant"]["spec"],
            "d_dot": r["variant"].get("d_dot"), "seed": r["seed"], "status": r["status"],
            # the report names the step of every divergence (it crashed on a diverged run without them)
            "diverged_at": r.get("diverged_at"), "diverged_reason": r.get("diverged_reason"),
            "steps": r["steps"], "wall_s": r["wall_s"], "steps_per_s": r.get("steps_per_s"),
            "device": r.get("environment", {}).get("device"),
            "torch": r.get("environment", {}).get("torch"),
            "threads": r.get("environment", {}).get("threads"),
            "machine": r.get("environment", {}).get("device_name"),
            "python": r.get("environment", {}).get("python"),
            "commit": r.get("environment", {}).get("git_commit"),
            "started_at": r.get("started_at"), "ended_at": r.get("ended_at"),
            "tokens_per_s": r.get("tokens_per_s"),
            "curve": r.get("curve"),
            "final_evaluation": r.get("final_evaluation"),
        }
        row.update(r["config"])
        row.update(r["metrics"])
        if r["status"] == "diverged" and row.get("best_eval_loss") is None:
            # diverged before its first evaluation: never measured (null in the record); a number here
            # for the frame's float column only: tables, capacities and claims read a diverged run's
            # loss as NaN, neither a pass nor a measured loss (capacity.measured_loss, DIVERGENCE_POLICY)
            row["best_eval_loss"] = math.inf
        rows.append(row)
    frame = pd.DataFrame(rows)
    for task in dict.fromkeys(r["task"] for r in records):
        for name in (*COMMON_METRICS, *TASK_METRICS.get(task, ())):
            if name not in frame:
                frame[name] = math.nan
    return frame


@dataclass(frozen=True)
class Capacity:
    """Largest S that a memory still retrieves, with censoring when the grid does not bracket it.

    ``value`` is the interpolated crossing of the threshold; ``lower_bound_only`` means every S run
    passed (capacity ≥ value); ``upper_bound_only`` means even the smallest S failed (< value).
    [``grid_low``, ``grid_high``] are the grid points around the crossing (the last S that retrieved,
    the first S that failed; 0 / inf when censored). ``ignored`` lists the S of isolated failures that
    were read as one bad point (see :func:`estimate_capacity`).
    """

    value: float
    lower_bound_only: bool = False
    upper_bound_only: bool = False
    grid_low: float = math.nan
    grid_high: float = math.nan
    ignored: tuple[float, ...] = ()

    def __str__(self) -> str:
        if math.isnan(self.value):
            return "n/a"
        prefix = "≥ " if self.lower_bound_only else "< " if self.upper_bound_only else "≈ "
        return f"{prefix}{self.value:.0f}"

    @property
    def low(self) -> float:
        return 0.0 if self.upper_bound_only else self.value

    @property
    def high(self) -> float:
        return math.inf if self.lower_bound_only else self.value

    def exceeds(self, other: Capacity) -> bool | None:
        """True if certainly larger than ``other``, False if certainly not, None if censoring hides it."""
        if self.low > other.high:
            return True
        if self.high <= other.low:
            return False
        return None


def estimate_capacity(S: list[float], loss: list[float], threshold: float = CAPACITY_THRESHOLD) -> Capacity:
    """Capacity from a loss-vs-S curve: the S where the loss rises above ``threshold`` to stay.

    Robust to one bad point: a failure whose next grid point retrieves again is an isolated blip and
    is skipped (listed in ``Capacity.ignored``): the official DPFP ν=2 delta run of Setting 2 fails at
    S=100 only, and holds from 120 to 200. A failure at the last S run counts (nothing shows it to be
    a blip). Between the last passing S and the failure the crossing is interpolated linearly in
    log-loss. Points are sorted by S; NaN losses (no measurement, e.g. a diverged run) are ignored;
    an infinite loss is a failure.
    """
    points = sorted((s, l) for s, l in zip(S, loss) if not (l is None or math.isnan(l)))
    if not points:
        return Capacity(math.nan)
    fails = [l > threshold for _, l in points]
    ignored = []
    for i, (s, l) in enumerate(points):
        if not fails[i]:
            continue
        if i + 1 < len(points) and not fails[i + 1]:
            ignored.append(float(s))  # one bad point between retrieving ones
            continue
        before = [p for j, p in enumerate(points[:i]) if not fails[j]]
        if not before:
            return Capacity(float(s), upper_bound_only=True, grid_low=0.0, grid_high=float(s),
                            ignored=tuple(ignored))
        s0, l0 = before[-1]
        log_l0 = math.log(max(l0, 1e-12))
        fraction = (math.log(threshold) - log_l0) / (math.log(l) - log_l0)  # 0 for an infinite loss
        return Capacity(float(s0 + fraction * (s - s0)), grid_low=float(s0), grid_high=float(s),
                        ignored=tuple(ignored))
    last = float(points[-1][0])
    return Capacity(last, lower_bound_only=True, grid_low=last, grid_high=math.inf, ignored=tuple(ignored))


def mean_over_seeds(frame: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Mean, standard deviation and count of ``value`` over seeds, per group ``by``."""
    grouped = frame.groupby(by, dropna=False)[value]
    out = grouped.agg(["mean", "std", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out
