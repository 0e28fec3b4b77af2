"""Capacity with confidence intervals: one capacity estimate per seed, then a Student-t interval.

For every (variant, d_key, seed) the loss-vs-S curve of that seed alone gives one capacity (the S
where the best evaluation loss crosses the threshold, interpolated in log-loss between grid points;
:func:`fwbench.analysis.records.estimate_capacity`). The capacities of the seeds are then summarised by
their mean and a 95 % Student-t interval (:mod:`fwbench.analysis.statistics`). When a seed's curve does not
bracket the threshold its capacity is censored (only a lower or an upper bound); the summary is then
marked as a bound (``≥`` / ``<``) and its interval describes the bounds, not the capacity.

Every capacity also gets its grid bracket [``grid_low``, ``grid_high``]: the last S that retrieved and
the first S that failed around the crossing (over all seeds: the widest such pair). It is the
resolution of the S grid, an interval even for a single seed, where a t-interval needs two or more.

Also: the capacity-vs-d_dot figure (paper Section 6.1: "capacity = d_dot") and its CSV.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from fwbench.analysis.records import CAPACITY_THRESHOLD, Capacity, estimate_capacity
from fwbench.analysis.statistics import CONFIDENCE, t_interval
from fwbench.run.strict_json import write_csv

#: Columns of the capacity CSV written by ``fwbench capacity``.
CAPACITY_COLUMNS = [
    "setting", "variant", "d_key", "d_dot", "n_seeds", "capacity_mean", "ci_low", "ci_high", "bound",
    "grid_low", "grid_high", "capacity_over_d_dot", "per_seed", "S_grid", "threshold",
]


def grid_bracket(S: list[float], loss: list[float], threshold: float = CAPACITY_THRESHOLD) -> tuple[float, float]:
    """(last S at or below ``threshold`` before the first failure, first S above it); 0 / inf when the
    curve does not bracket the crossing. NaN losses are ignored, as in :func:`estimate_capacity`."""
    points = sorted((s, l) for s, l in zip(S, loss, strict=True) if not (l is None or math.isnan(l)))
    low = 0.0
    for s, l in points:
        if l > threshold:
            return low, float(s)
        low = float(s)
    return low, math.inf


def retrieval_rows(frame: pd.DataFrame, setting: int) -> pd.DataFrame:
    """The retrieval-task rows of one setting (an empty frame when there are none)."""
    if frame.empty or "setting" not in frame:
        return frame.iloc[0:0]
    return frame[(frame["task"] == "retrieval") & (frame["setting"] == setting)]


def seed_capacities(rows: pd.DataFrame, threshold: float = CAPACITY_THRESHOLD) -> pd.DataFrame:
    """One capacity per (variant, d_key, d_dot, seed) from that seed's best-eval-loss-vs-S curve.

    A diverged run counts as a failure at its S (its loss is set to +inf before the estimate).
    Columns: variant, d_key, d_dot, seed, capacity, lower_bound_only, upper_bound_only, grid_low,
    grid_high, S_grid.
    """
    out = []
    if rows.empty:
        return pd.DataFrame(columns=["variant", "d_key", "d_dot", "seed", "capacity", "lower_bound_only",
                                     "upper_bound_only", "grid_low", "grid_high", "S_grid"])
    keys = ["variant", "d_key", "d_dot", "seed"]
    for (variant, d_key, d_dot, seed), group in rows.groupby(keys, dropna=False):
        loss = group["best_eval_loss"].astype(float).where(group["status"] != "diverged", math.inf)
        capacity = estimate_capacity(list(group["S"]), list(loss), threshold)
        grid_low, grid_high = grid_bracket(list(group["S"]), list(loss), threshold)
        out.append({
            "variant": variant, "d_key": d_key, "d_dot": d_dot, "seed": seed, "capacity": capacity.value,
            "lower_bound_only": capacity.lower_bound_only, "upper_bound_only": capacity.upper_bound_only,
            "grid_low": grid_low, "grid_high": grid_high,
            "S_grid": " ".join(str(int(s)) for s in sorted(group["S"].unique())),
        })
    return pd.DataFrame(out)


def capacity_intervals(rows: pd.DataFrame, threshold: float = CAPACITY_THRESHOLD,
                       confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per (variant, d_key, d_dot): mean capacity over seeds, t-interval, censoring (``bound``).

    ``bound`` is "" (every seed bracketed), "≥" (some seed passed every S: a lower bound) or "<"
    (some seed failed even the smallest S: an upper bound).
    """
    per_seed = seed_capacities(rows, threshold)
    out = []
    for (variant, d_key, d_dot), group in per_seed.groupby(["variant", "d_key", "d_dot"], dropna=False):
        interval = t_interval(list(group["capacity"]), confidence)
        bound = "≥" if group["lower_bound_only"].any() else "<" if group["upper_bound_only"].any() else ""
        out.append({
            "variant": variant, "d_key": d_key, "d_dot": d_dot, "n_seeds": interval.n,
            "capacity_mean": interval.mean, "ci_low": interval.low, "ci_high": interval.high, "bound": bound,
            "grid_low": group["grid_low"].min(), "grid_high": group["grid_high"].max(),
            "capacity_over_d_dot": interval.mean / d_dot if d_dot and not pd.isna(d_dot) else math.nan,
            "per_seed": " ".join(f"{c:.0f}" for c in group.sort_values("seed")["capacity"]),
            "S_grid": group["S_grid"].iloc[0], "threshold": threshold,
        })
    return pd.DataFrame(out, columns=[c for c in CAPACITY_COLUMNS if c != "setting"])


def summary_capacity(row: pd.Series) -> Capacity:
    """The :class:`Capacity` (with censoring) of one row of :func:`capacity_intervals`."""
    return Capacity(float(row["capacity_mean"]), lower_bound_only=row["bound"] == "≥",
                    upper_bound_only=row["bound"] == "<")


def describe(row: pd.Series) -> str:
    """'≈ 122 [110, 131] (3 seeds)', '≈ 25 (1 seed; grid 16–32)', '≥ 160 (1 seed)' …: a row in words."""
    mean = row["capacity_mean"]
    if pd.isna(mean):
        return "n/a"
    prefix = row["bound"] + " " if row["bound"] else "≈ "
    n = int(row["n_seeds"])
    if n > 1 and not pd.isna(row["ci_low"]):
        return f"{prefix}{mean:.0f} [{row['ci_low']:.0f}, {row['ci_high']:.0f}] ({n} seeds)"
    if not row["bound"] and "grid_low" in row and math.isfinite(row["grid_high"]):
        return f"{prefix}{mean:.0f} (1 seed; grid {row['grid_low']:.0f}–{row['grid_high']:.0f})"
    return f"{prefix}{mean:.0f} (1 seed)"


def write_capacity_csv(table: pd.DataFrame, path: Path) -> Path:
    """Write the capacity table (columns :data:`CAPACITY_COLUMNS`) as CSV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_csv(table.reindex(columns=CAPACITY_COLUMNS), path, index=False, float_format="%.4g")
    return path
