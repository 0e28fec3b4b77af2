"""Seed statistics: mean and Student-t confidence interval over seeds, grouped with pandas.

For n seeds with sample mean x̄ and sample standard deviation s (ddof = 1), the two-sided interval at
confidence c is x̄ ± t_{(1+c)/2, n−1} · s / √n (``scipy.stats.t``). With one seed there is no
interval: its bounds are NaN and the report says "1 seed" instead of drawing a band.

Why Student t rather than a bootstrap: the grids run 1 to 5 seeds, too few for a bootstrap to say
anything, and t is exact for normally distributed per-seed results. Values are the per-seed best
evaluation losses or per-seed capacities, each computed on one seed's own curve.

Losses are positive and spread over decades (0.0005 and 0.3 in one cell), so their intervals are
computed in log space (:func:`log_interval`): the geometric mean with exp(mean ± t·s/√n) of the log
losses, which never leaves (0, ∞); a plain t-interval of [0.0005, 0.0008, 0.3] would reach −0.33.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

#: Confidence level of every interval in the report.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values with a two-sided Student-t confidence interval [low, high]."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        if self.n == 0 or math.isnan(self.mean):
            return "n/a"
        if self.n == 1 or math.isnan(self.low):
            return f"{_fmt(self.mean)} (1 seed)"
        return f"{_fmt(self.mean)} [{_fmt(self.low)}, {_fmt(self.high)}]"


def _fmt(x: float) -> str:
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.3g}" if abs(x) < 1 else f"{x:.4g}"
    return f"{x:.2e}"


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean and Student-t interval of ``values`` (NaNs dropped).

    Raises:
        ValueError: ``confidence`` outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: got {confidence!r}; expected a number in (0, 1)")
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, confidence)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1, confidence)
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    if sem == 0:
        return Interval(mean, mean, mean, n, confidence)
    low, high = stats.t.interval(confidence, df=n - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), n, confidence)


#: Losses are floored here before their logarithm (a loss of exactly 0 would be −∞ in log space).
LOG_FLOOR = 1e-12


def log_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Geometric mean of positive ``values`` (losses, perplexities) with a Student-t interval taken in
    log space and mapped back: it stays positive, as the quantity does. NaN and infinite values are
    dropped (a diverged run is not a measured loss). Values ≤ 0 are floored at :data:`LOG_FLOOR`.

    Raises:
        ValueError: ``confidence`` outside (0, 1).
    """
    finite = [max(float(v), LOG_FLOOR) for v in values if v is not None and math.isfinite(v)]
    logs = t_interval([math.log(v) for v in finite], confidence)
    if logs.n == 0:
        return logs
    low, high = (math.nan, math.nan) if logs.n == 1 else (math.exp(logs.low), math.exp(logs.high))
    return Interval(math.exp(logs.mean), low, high, logs.n, confidence)


def mean_ci(frame: pd.DataFrame, by: list[str], value: str, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Per group of ``by``: ``mean``, ``std``, ``n`` (seeds with a finite value), ``ci_low``, ``ci_high``.

    NaN values (e.g. a diverged run without an evaluation) are left out of the statistics; the
    caller shows them separately.
    """
    columns = [*by, "mean", "std", "n", "ci_low", "ci_high"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    grouped = frame.groupby(by, dropna=False)[value]
    out = grouped.agg(mean="mean", std="std", n="count").reset_index()
    sem = out["std"] / np.sqrt(out["n"])
    t = stats.t.ppf((1 + confidence) / 2, df=(out["n"] - 1).clip(lower=1))
    half = np.where(out["n"] > 1, t * sem, np.nan)
    out["ci_low"] = out["mean"] - half
    out["ci_high"] = out["mean"] + half
    return out[columns]


def log_mean_ci(frame: pd.DataFrame, by: list[str], value: str, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """As :func:`mean_ci`, in log space: ``mean`` is the geometric mean and [``ci_low``, ``ci_high``] the
    interval of :func:`log_interval`, so a band on a loss never reaches below zero. Non-finite and
    missing values are left out (``n`` counts the rest); values ≤ 0 are floored at :data:`LOG_FLOOR`."""
    logged = frame.copy()
    raw = logged[value].astype(float)
    logged[value] = np.log(raw.where(np.isfinite(raw)).clip(lower=LOG_FLOOR))
    out = mean_ci(logged, by, value, confidence)
    for column in ("mean", "ci_low", "ci_high"):
        out[column] = np.exp(out[column])
    out["std"] = math.nan  # a standard deviation of logs would read as one of the values
    return out
