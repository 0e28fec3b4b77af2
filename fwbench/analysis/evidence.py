"""What a synthetic claim's evidence lacks, and how two cells' losses compare under their intervals.

The minimum every retrieval claim states (see :mod:`fwbench.analysis.verdicts`): at least
:data:`~fwbench.analysis.verdicts.MIN_SEEDS` seeds in each cell it reads (a seed whose runs diverged counts:
divergence is a result); runs that ended by
convergence, plateau or divergence, not by ``max_steps`` while still above the threshold (more steps
can only lower a best loss, so a run at ``max_steps`` that already retrieves is final); and the S
range and variants the claim names. Each function returns the words for what is missing ("1 seed",
"linear S ≤ 80 of 200"), or "" when that part of the minimum is met.
"""

from __future__ import annotations

import math

import pandas as pd

from fwbench.analysis.capacity import measured_loss
from fwbench.analysis.records import CAPACITY_THRESHOLD
from fwbench.analysis.statistics import Interval, log_interval
from fwbench.analysis.verdicts import MIN_SEEDS

#: The retrieval minimum, as the claims table states it.
RETRIEVAL_MINIMUM = f"≥ {MIN_SEEDS} seeds per cell, runs finished (not max_steps above the threshold)"


def seeds_missing(rows: pd.DataFrame) -> str:
    """'1 seed' when some (variant, S) cell of ``rows`` has fewer than MIN_SEEDS seeds (diverged ones
    count as run: their seed was spent), else ''."""
    if rows.empty:
        return ""
    fewest = int(rows.groupby(["variant", "S"])["seed"].nunique().min())
    return "" if fewest >= MIN_SEEDS else f"{fewest} seed{'s' if fewest != 1 else ''}"


def unfinished(rows: pd.DataFrame, threshold: float = CAPACITY_THRESHOLD) -> str:
    """'2 of 9 runs stopped at max_steps still above 0.01 (linear S=80, …)' or ''."""
    if rows.empty or "status" not in rows:
        return ""
    cut = rows[(rows["status"] == "max_steps") & (rows["best_eval_loss"].astype(float) > threshold)]
    if cut.empty:
        return ""
    cells = ", ".join(dict.fromkeys(f"{v} S={int(s)}" for v, s in zip(cut["variant"], cut["S"])))
    return f"{len(cut)} of {len(rows)} runs stopped at max_steps still above {threshold} ({cells})"


def s_range_missing(rows: pd.DataFrame, variant: str, needed: float) -> str:
    """'softmax S ≤ 160 of 500' when ``variant`` was not run up to S = ``needed``; 'softmax not run'."""
    ran = rows[rows["variant"] == variant]["S"] if not rows.empty else pd.Series(dtype=float)
    if ran.empty:
        return f"{variant} not run"
    top = float(ran.max())
    return "" if top >= needed else f"{variant} S ≤ {top:.0f} of {needed:.0f}"


def variants_missing(rows: pd.DataFrame, named: list[str]) -> str:
    """'dpfp:nu=3 not run' for the variants a claim names that ``rows`` lacks; '' when all ran."""
    present = set(rows["variant"]) if not rows.empty else set()
    absent = [v for v in named if v not in present]
    return f"{', '.join(absent)} not run" if absent else ""


def retrieval_gaps(rows: pd.DataFrame, threshold: float = CAPACITY_THRESHOLD) -> list[str]:
    """Seeds and finished runs: the part of the minimum every retrieval claim shares."""
    return [seeds_missing(rows), unfinished(rows, threshold)]


def cell_loss(rows: pd.DataFrame) -> tuple[Interval, int]:
    """(log-space interval of the measured best losses, number of diverged runs) of one cell."""
    diverged = int((rows["status"] == "diverged").sum()) if "status" in rows else 0
    return log_interval(list(measured_loss(rows))), diverged


def describe_cell(interval: Interval, diverged: int) -> str:
    """'0.0031 [0.0012, 0.0079]' with ', 1 diverged' when runs diverged."""
    return f"{interval}" + (f", {diverged} diverged" if diverged else "")


def _bounds(interval: Interval) -> tuple[float, float]:
    """The interval, or the point itself for one seed."""
    if math.isnan(interval.low):
        return interval.mean, interval.mean
    return interval.low, interval.high


def certainly_lower(a: Interval, b: Interval) -> bool | None:
    """True if ``a``'s losses are below ``b``'s (intervals apart), False if above, None if they overlap
    or either cell has no measured loss."""
    if a.n == 0 or b.n == 0:
        return None
    (a_low, a_high), (b_low, b_high) = _bounds(a), _bounds(b)
    if a_high < b_low:
        return True
    if b_high < a_low:
        return False
    return None


def certainly_below(a: Interval, threshold: float) -> bool | None:
    """True if the whole interval is at or below ``threshold``, False if wholly above, else None."""
    if a.n == 0:
        return None
    low, high = _bounds(a)
    if high <= threshold:
        return True
    if low > threshold:
        return False
    return None
