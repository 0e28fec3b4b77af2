"""From records to tables: flatten run records into a DataFrame, aggregate seeds, estimate capacity."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pandas as pd

from fwbench.errors import one_line
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

#: The fields :func:`records_frame` reads where a record holds them, each absent, null or of its type.
OPTIONAL_RECORD_FIELDS = {"grid": str, "diverged_at": int, "diverged_reason": str, "steps_per_s": (int, float),
                          "tokens_per_s": (int, float), "started_at": str, "ended_at": str, "environment": dict,
                          "curve": list, "final_evaluation": dict}

#: The frame's columns read from a record's ``environment`` (``run.environment``): column → (entry, its type;
#: each entry absent, null or of its type), in the order the report's environment table shows them.
ENVIRONMENT_COLUMNS = {"device": ("device", str), "machine": ("device_name", str), "torch": ("torch", str),
                       "python": ("python", str), "threads": ("threads", int), "commit": ("git_commit", str)}

#: The frame's own columns (:func:`records_frame`): a config or metrics key of one of these names would
#: overwrite the record's value (``config: {"status": 5}`` replaced the run's status).
FRAME_COLUMNS = frozenset({"run_id", "task", "variant", "d_dot", "seed", "status", "steps", "wall_s",
                           *OPTIONAL_RECORD_FIELDS.keys() - {"environment"}, *ENVIRONMENT_COLUMNS})


def is_of_kind(value: object, kind: type | tuple[type, ...]) -> bool:
    """Whether ``value`` is a ``kind`` as the report computes with it: a bool is no number, and an
    integer beyond a float's range (json reads a number written as 400 digits as an int) is none either:
    the report converts its numbers to float (OverflowError: int too large to convert to float)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and abs(value) > 2**1023:  # float() overflows a little above; no metric is near
        return False
    return isinstance(value, kinds)



#: What the LM report reads of a record's ``final_evaluation`` (``lm_section``, ``lm_figures``, ``claims_lm``),
#: each part optional: a key's type, ``[kind]`` a non-empty list of them, ``[[kind]]`` of pairs of them.
NUMBER = (int, float)
FINAL_EVALUATION_PARTS = {
    "long_context": {"buckets": [[int]], "tokens": int, "carried_ppl": [NUMBER], "reset_ppl": [NUMBER],
                     "carried_ppl_all": NUMBER, "reset_ppl_all": NUMBER},
    "carried_lengths": {"lengths": [int], "ppl": [NUMBER], "ppl_ratio": [NUMBER], "tokens": int},
    "sample": {"text": str, "prompt": str, "temperature": NUMBER, "seed": int},
}


def _fits(value: object, shape: object) -> bool:
    """Whether ``value`` has ``shape`` (:data:`FINAL_EVALUATION_PARTS`' notation); a number may be null
    (written so for being NaN or inf, restored by :func:`restore_non_finite` where the record says so)."""
    if isinstance(shape, dict):
        return isinstance(value, dict) and all(key in value and _fits(value[key], part) for key, part in shape.items())
    if isinstance(shape, list):
        if shape[0] == [int]:  # pairs
            return isinstance(value, list) and bool(value) and all(
                isinstance(pair, list) and len(pair) == 2 and all(is_of_kind(x, int) for x in pair) for pair in value)
        return isinstance(value, list) and bool(value) and all(_fits(x, shape[0]) for x in value)
    return (value is None and shape is NUMBER) or is_of_kind(value, shape)


def _final_evaluation_problems(evaluation: dict) -> list[str]:
    """The parts of a ``final_evaluation`` the LM report cannot read (``final_evaluation.long_context``, ...):
    a part of another shape, or lists the report zips that differ in length."""
    wrong = []
    for name, shape in FINAL_EVALUATION_PARTS.items():
        part = evaluation.get(name)
        if name not in evaluation or (part is None and name != "long_context"):
            continue  # not measured (carried_lengths and sample are read only where truthy)
        if not _fits(part, shape):
            wrong.append(f"final_evaluation.{name}")
        elif name == "long_context" and not len(part["buckets"]) == len(part["carried_ppl"]) == len(part["reset_ppl"]):
            wrong.append(f"final_evaluation.{name}")
        elif name == "carried_lengths" and len(part["lengths"]) != len(part["ppl"]):
            wrong.append(f"final_evaluation.{name}")
    return wrong

@cache
def _config_field_types() -> dict[str, dict[str, tuple[type | tuple[type, ...], bool]]]:
    """Per task, each config field's (type, whether null is allowed), from the task's config dataclass
    (``build_record`` writes ``asdict`` of it: every field, of its type; a float field may hold an int)."""
    from dataclasses import fields

    from fwbench.tasks import TASKS

    names = {"int": int, "float": float, "str": str, "bool": bool}
    out = {}
    for task, definition in TASKS.items():
        types = {}
        for f in fields(definition.config_class):
            text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            # a type named otherwise (tuple[int, ...], a registered task's own class) is not checked:
            # the report reads such a field as an opaque column, whatever it holds
            kind = names.get(text.split("|")[0].strip(), object)
            types[f.name] = ((int, float) if kind is float else kind, "None" in text)
        out[task] = types
    return out


@cache
def _config_defaults() -> dict[str, dict[str, object]]:
    """Per task, its config dataclass's defaults: what a field a record lacks was for its run."""
    from dataclasses import asdict

    from fwbench.tasks import TASKS

    return {task: asdict(definition.config_class()) for task, definition in TASKS.items()}


def _mistyped_fields(record: dict) -> list[str]:
    """The names (dotted below the top level) of the fields of ``record`` (its non-finite values restored)
    that :func:`records_frame` and the report cannot read: missing or of another type than fwbench writes."""
    wrong = [name for name, kind in RUN_RECORD_FIELDS.items() if not is_of_kind(record.get(name), kind)]
    if wrong:
        return wrong
    if not isinstance(record["variant"].get("spec"), str):
        wrong.append("variant.spec")
    if record["variant"].get("d_dot") is not None and not is_of_kind(record["variant"]["d_dot"], int):
        wrong.append("variant.d_dot")
    wrong += [name for name, kind in OPTIONAL_RECORD_FIELDS.items()
              if record.get(name) is not None and not is_of_kind(record[name], kind)]
    if record["status"] == "diverged" and not is_of_kind(record.get("diverged_at"), int) and "diverged_at" not in wrong:
        wrong.append("diverged_at")  # the report names the step of every divergence (build_record writes it)
    curve = record.get("curve")
    if isinstance(curve, list) and not all(isinstance(point, dict) and is_of_kind(point.get("step"), int) and all(
            value is None or is_of_kind(value, NUMBER) for value in point.values()) for point in curve):
        wrong.append("curve")  # points {step, train_loss, eval_loss, ...}, drawn by the LM figure
    if isinstance(record.get("final_evaluation"), dict):
        wrong += _final_evaluation_problems(record["final_evaluation"])
    environment = record.get("environment")
    if isinstance(environment, dict):
        wrong += [f"environment.{name}" for name, kind in ENVIRONMENT_COLUMNS.values()
                  if environment.get(name) is not None and not is_of_kind(environment[name], kind)]
    # metrics: numbers (null where never measured); a string or a list made the report raise
    wrong += [f"metrics.{name}" for name, value in record["metrics"].items()
              if name in FRAME_COLUMNS or not (value is None or is_of_kind(value, (int, float)))]
    config, types = record["config"], _config_field_types().get(record["task"])
    if types is None:  # a task fwbench does not know: no table reads it; scalars that shadow no column
        wrong += [f"config.{name}" for name, value in config.items()
                  if name in FRAME_COLUMNS or not (value is None or is_of_kind(value, (str, int, float, bool)))]
        return wrong
    # a task's config: each field of its dataclass that the record holds, of its type (an S of "3" or null
    # made the report raise); a field it lacks is the dataclass's default, as the run's own config is
    # (``RunSpec.task_config``: config_class(**config)), and :func:`records_frame` reads it so; another key
    # is read as a column too, so it must be a scalar that overwrites none of the record's own (a
    # ``status`` there replaced the run's status)
    for name, value in config.items():
        if name not in types:
            if name in FRAME_COLUMNS or not (value is None or is_of_kind(value, (str, int, float, bool))):
                wrong.append(f"config.{name}")
            continue
        kind, nullable = types[name]
        if kind is not object and not (is_of_kind(value, kind) or (nullable and value is None)):
            wrong.append(f"config.{name}")
    return wrong


def run_record_faults(record: dict) -> list[str]:
    """The fields of a record (a parsed line of runs.jsonl) that make it no run record, missing or mistyped
    ("config.S", "environment.threads"), as :func:`readable_run_records` names them; empty for a run record."""
    return _mistyped_fields(restore_non_finite(record))  # a field written as null for being NaN is the float it was


def readable_run_records(records: list[dict], source: str | Path) -> tuple[list[dict], list[str]]:
    """(the records :func:`records_frame` can read, a ``SOURCE: record 'ID' skipped: ...`` problem for each
    other one). A record of ``source`` (runs.jsonl) missing a field that :func:`records_frame` or the report
    reads, or holding it as another type (a hand-edited line, another tool's JSON), made ``fwbench report``
    a traceback (KeyError: 'task'; below the top level: a metric or ``config.S`` that is a string, a
    ``config.d_model`` missing, an ``environment`` that is null, a ``wall_s`` of 400 digits); it is skipped
    and counted as the store skips a line that is not a record. Checked: :data:`RUN_RECORD_FIELDS`,
    :data:`OPTIONAL_RECORD_FIELDS`, :data:`ENVIRONMENT_COLUMNS`, every metric a number or null, and the
    config of a known task exactly the fields of its config dataclass, each of its type."""
    return split_readable(records, source, run_record_faults, "run record")


def split_readable(records: list[dict], source: str | Path, faults, what: str) -> tuple[list[dict], list[str]]:
    """(the records of ``source`` for which ``faults(record)`` names no field, a ``SOURCE: record 'ID' skipped:
    no WHAT (missing or mistyped: FIELDS)`` problem for each other one), in file order: the one rule by which
    runs.jsonl (:func:`readable_run_records`) and bench.jsonl (``readable_bench_records``) skip and name a record."""
    readable, problems = [], []
    for record in records:
        wrong = faults(record)
        if wrong:
            problems.append(f"{one_line(source)}: record {record['run_id']!r} skipped: no {what} "
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
        environment = r.get("environment") or {}  # null is no environment (readable_run_records allows it)
        row = {
            "run_id": r["run_id"], "task": r["task"], "variant": r["variant"]["spec"], "d_dot": r["variant"].get("d_dot"),
            "seed": r["seed"], "status": r["status"], "steps": r["steps"], "wall_s": r["wall_s"],
            # every optional field, as null where absent: the report names the step of every divergence (it
            # crashed on a diverged run without them)
            **{name: r.get(name) for name in OPTIONAL_RECORD_FIELDS if name != "environment"},
            **{column: environment.get(entry) for column, (entry, _) in ENVIRONMENT_COLUMNS.items()},
        }
        # a config field the record lacks (a store older than the field, a hand-made record) is its default,
        # as for the run itself: a missing MQAR d_model was NaN in a column the table casts to int
        row.update({**_config_defaults().get(r["task"], {}), **r["config"]})
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
