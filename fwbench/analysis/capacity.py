"""Capacity with confidence intervals: one capacity estimate per seed, then aggregated over seeds.

This is the one capacity estimator of the suite: every claim, table and figure that states a
capacity goes through :func:`seed_capacities` / :func:`capacity_intervals`. For every (variant,
d_key, seed) the loss-vs-S curve of that seed alone gives one capacity (the S where the best
evaluation loss rises above the threshold to stay, interpolated in log-loss between grid points,
robust to one bad point; :func:`fwbench.analysis.records.estimate_capacity`). The capacities of the
seeds are then summarised by their mean and a 95 % Student-t interval
(:mod:`fwbench.analysis.statistics`). When a seed's curve does not bracket the threshold its capacity
is censored (only a lower or an upper bound); the summary is then marked as a bound (``≥`` / ``<``).

Every capacity also gets its grid bracket [``grid_low``, ``grid_high``]: the last S that retrieved and
the first S that failed around the crossing (over all seeds: the widest such pair), the resolution of
the S grid. Two capacities differ (:meth:`CapacityEstimate.above`) only when their seed intervals do
not overlap *and* a grid point separates them.

Divergence policy (the same in every table and claim): a diverged run is neither a pass nor a measured
loss. It is left out of the curve it belongs to and counted in ``n_diverged``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fwbench.analysis.records import CAPACITY_THRESHOLD, Capacity, estimate_capacity
from fwbench.analysis.statistics import CONFIDENCE, t_interval
from fwbench.run.strict_json import write_csv

#: Columns of the capacity CSV written by ``fwbench capacity``.
CAPACITY_COLUMNS = [
    "setting", "variant", "d_key", "d_dot", "n_seeds", "capacity_mean", "ci_low", "ci_high", "bound",
    "grid_low", "grid_high", "capacity_over_d_dot", "per_seed", "n_diverged", "ignored_S", "S_grid", "threshold",
]

#: The one sentence every table with losses or capacities carries about diverged runs.
DIVERGENCE_POLICY = ("A diverged run is neither a pass nor a measured loss: it is left out of losses, "
                     "intervals and capacities, and counted as diverged.")


def measured_loss(rows: pd.DataFrame) -> pd.Series:
    """The best eval loss of each row, NaN for a diverged run (see :data:`DIVERGENCE_POLICY`)."""
    loss = rows["best_eval_loss"].astype(float)
    return loss.where(rows["status"] != "diverged", math.nan) if "status" in rows else loss


def grid_bracket(S: list[float], loss: list[float], threshold: float = CAPACITY_THRESHOLD) -> tuple[float, float]:
    """(last S that retrieved before the crossing, first S that failed); 0 / inf when the curve does
    not bracket the crossing. The crossing is :func:`estimate_capacity`'s (one bad point skipped)."""
    capacity = estimate_capacity(S, loss, threshold)
    if math.isnan(capacity.value):
        return 0.0, math.inf
    return capacity.grid_low, capacity.grid_high


def retrieval_rows(frame: pd.DataFrame, setting: int) -> pd.DataFrame:
    """The retrieval-task rows of one setting (an empty frame when there are none)."""
    if frame.empty or "setting" not in frame:
        return frame.iloc[0:0]
    return frame[(frame["task"] == "retrieval") & (frame["setting"] == setting)]


SEED_COLUMNS = ["variant", "d_key", "d_dot", "seed", "capacity", "lower_bound_only", "upper_bound_only",
                "grid_low", "grid_high", "n_diverged", "ignored_S", "S_grid"]


def seed_capacities(rows: pd.DataFrame, threshold: float = CAPACITY_THRESHOLD) -> pd.DataFrame:
    """One capacity per (variant, d_key, d_dot, seed) from that seed's best-eval-loss-vs-S curve.

    Diverged runs are left out of the curve (:data:`DIVERGENCE_POLICY`) and counted in ``n_diverged``.
    Columns: :data:`SEED_COLUMNS`.
    """
    if rows.empty:
        return pd.DataFrame(columns=SEED_COLUMNS)
    # hand-made or older frames may lack these columns: one group, and no diverged run
    rows = rows.assign(**{c: rows[c] if c in rows else math.nan for c in ("d_key", "d_dot")},
                       status=rows["status"] if "status" in rows else "converged")
    out = []
    for (variant, d_key, d_dot, seed), group in rows.groupby(["variant", "d_key", "d_dot", "seed"], dropna=False):
        capacity = estimate_capacity(list(group["S"]), list(measured_loss(group)), threshold)
        out.append({
            "variant": variant, "d_key": d_key, "d_dot": d_dot, "seed": seed, "capacity": capacity.value,
            "lower_bound_only": capacity.lower_bound_only, "upper_bound_only": capacity.upper_bound_only,
            "grid_low": capacity.grid_low, "grid_high": capacity.grid_high,
            "n_diverged": int((group["status"] == "diverged").sum()) if "status" in group else 0,
            "ignored_S": " ".join(f"{s:.0f}" for s in capacity.ignored),
            "S_grid": " ".join(str(int(s)) for s in sorted(group["S"].unique())),
        })
    return pd.DataFrame(out, columns=SEED_COLUMNS)


def capacity_intervals(rows: pd.DataFrame, threshold: float = CAPACITY_THRESHOLD,
                       confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per (variant, d_key, d_dot): mean capacity over seeds, t-interval, censoring (``bound``).

    With every seed bracketed, the t-interval is cut to [mean of the seeds' ``grid_low``, mean of their
    ``grid_high``]: the range the mean of bracketed capacities can take.

    ``bound`` is "" (every seed bracketed), "≥" (some seed passed every S: a lower bound) or "<"
    (some seed failed even the smallest S: an upper bound).
    """
    out = []
    for (variant, d_key, d_dot), seeds in seed_capacities(rows, threshold).groupby(["variant", "d_key", "d_dot"],
                                                                                  dropna=False):
        # a seed whose every run diverged has no capacity, but its diverged runs are counted with the others
        group = seeds.dropna(subset=["capacity"])
        if group.empty:
            continue
        interval = t_interval(list(group["capacity"]), confidence)
        bound = "≥" if group["lower_bound_only"].any() else "<" if group["upper_bound_only"].any() else ""
        ci_low, ci_high = interval.low, interval.high
        if not bound and interval.n > 1:
            # Every seed's capacity lies in its own grid bracket, so their mean lies between the mean of
            # the brackets' ends: a t-interval reaching past that (3 seeds: ±4.3 standard errors) claims an
            # uncertainty the grid has already ruled out.
            ci_low = max(ci_low, float(group["grid_low"].mean()))
            ci_high = min(ci_high, float(group["grid_high"].mean()))
        out.append({
            "variant": variant, "d_key": d_key, "d_dot": d_dot, "n_seeds": interval.n,
            "capacity_mean": interval.mean, "ci_low": ci_low, "ci_high": ci_high, "bound": bound,
            "grid_low": group["grid_low"].min(), "grid_high": group["grid_high"].max(),
            "capacity_over_d_dot": interval.mean / d_dot if d_dot and not pd.isna(d_dot) else math.nan,
            "per_seed": " ".join(_seed_text(seed) for _, seed in group.sort_values("seed").iterrows()),
            "n_diverged": int(seeds["n_diverged"].sum()),
            "ignored_S": " ".join(sorted({s for text in group["ignored_S"] for s in text.split()}, key=float)),
            "S_grid": group["S_grid"].iloc[0], "threshold": threshold,
        })
    return pd.DataFrame(out, columns=[c for c in CAPACITY_COLUMNS if c != "setting"])


def _seed_text(seed: pd.Series) -> str:
    """One seed's capacity for the per-seed column, with its censoring: "<16" (failed even the smallest
    S), "≥160" (passed every S), "22" (bracketed); a bare bound read as a measured capacity."""
    mark = "≥" if seed["lower_bound_only"] else "<" if seed["upper_bound_only"] else ""
    return f"{mark}{seed['capacity']:.0f}"


@dataclass(frozen=True)
class CapacityEstimate:
    """One row of :func:`capacity_intervals` as a value with its two uncertainties: the seed interval
    [``low``, ``high``] (the point itself for one seed; open-ended when censored) and the grid bracket."""

    value: float
    low: float
    high: float
    grid_low: float
    grid_high: float
    n_seeds: int
    bound: str = ""

    @classmethod
    def from_row(cls, row: pd.Series) -> CapacityEstimate:
        value = float(row["capacity_mean"])
        low = value if pd.isna(row["ci_low"]) else float(row["ci_low"])
        high = value if pd.isna(row["ci_high"]) else float(row["ci_high"])
        if row["bound"] == "≥":
            high = math.inf
        if row["bound"] == "<":
            low = 0.0
        return cls(value, low, high, float(row["grid_low"]), float(row["grid_high"]), int(row["n_seeds"]),
                   row["bound"])

    def above(self, other: CapacityEstimate) -> bool | None:
        """True if certainly larger than ``other`` (intervals apart and a grid point between them:
        at some S this one retrieves and ``other`` does not), False if certainly smaller, else None."""
        if self.low > other.high and self.grid_low >= other.grid_high:
            return True
        if other.low > self.high and other.grid_low >= self.grid_high:
            return False
        return None

    def at_most(self, S: float) -> bool | None:
        """True if the capacity is certainly ≤ ``S`` (interval and grid: the memory fails by S), False if
        certainly above it, None if the evidence does not say."""
        if self.high <= S and self.grid_high <= S:
            return True
        if self.low > S and self.grid_low >= S:
            return False
        return None

    def at_least(self, S: float) -> bool | None:
        """True if the capacity is certainly ≥ ``S`` (the memory still retrieves at S), False if certainly
        below it, None if the evidence does not say."""
        if self.low >= S and self.grid_low >= S:
            return True
        if self.high < S and self.grid_high <= S:
            return False
        return None

    def ratio_interval(self, d_dot: float) -> tuple[float, float]:
        """The seed interval divided by ``d_dot``."""
        return self.low / d_dot, self.high / d_dot


def capacity_estimates(rows: pd.DataFrame) -> dict[str, tuple[CapacityEstimate, str]]:
    """variant → (capacity estimate, its description) for the rows of one setting and d_key."""
    table = capacity_intervals(rows)
    return {row["variant"]: (CapacityEstimate.from_row(row), describe(row)) for _, row in table.iterrows()}


def summary_capacity(row: pd.Series) -> Capacity:
    """The :class:`Capacity` (value, censoring, grid bracket) of one row of :func:`capacity_intervals`."""
    return Capacity(float(row["capacity_mean"]), lower_bound_only=row["bound"] == "≥",
                    upper_bound_only=row["bound"] == "<", grid_low=float(row["grid_low"]),
                    grid_high=float(row["grid_high"]))


def describe(row: pd.Series) -> str:
    """'≈ 122 [110, 131] (3 seeds)', '≈ 25 (1 seed; grid 16–32)', '≥ 160 (1 seed)' …: a row in words,
    with the S of skipped one-point blips and the count of diverged runs when there are any."""
    mean = row["capacity_mean"]
    if pd.isna(mean):
        return "n/a"
    prefix = row["bound"] + " " if row["bound"] else "≈ "
    n = int(row["n_seeds"])
    if row["bound"]:
        text = f"{prefix}{mean:.0f} ({n} seed{'s' if n != 1 else ''})"
    elif n > 1 and not pd.isna(row["ci_low"]):
        text = f"{prefix}{mean:.0f} [{row['ci_low']:.0f}, {row['ci_high']:.0f}] ({n} seeds)"
    elif not row["bound"] and "grid_low" in row and math.isfinite(row["grid_high"]):
        text = f"{prefix}{mean:.0f} (1 seed; grid {row['grid_low']:.0f}–{row['grid_high']:.0f})"
    else:
        text = f"{prefix}{mean:.0f} (1 seed)"
    notes = []
    if row.get("ignored_S"):
        notes.append(f"one-point blip skipped at S={row['ignored_S']}")
    if row.get("n_diverged"):
        notes.append(f"{int(row['n_diverged'])} diverged run(s) left out")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def write_capacity_csv(table: pd.DataFrame, path: Path) -> Path:
    """Write the capacity table (columns :data:`CAPACITY_COLUMNS`) as CSV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_csv(table.reindex(columns=CAPACITY_COLUMNS), path, index=False, float_format="%.4g")
    return path
