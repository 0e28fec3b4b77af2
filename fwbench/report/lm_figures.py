"""Language-model report figures: learning curves and the long-context (carried state) evaluation."""

from __future__ import annotations

import math
import numbers
import textwrap
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fwbench.report.figure_style import integer_ticks, legend_beside, plain_ticks, save  # noqa: E402


def _style(variant: str) -> dict:
    # one colour per feature map, solid for the delta rule, dashed for the sum rule
    family = variant.split(":")[0].removesuffix("-delta")
    colours = {"softmax": "black", "linear": "tab:blue", "favor": "tab:orange", "dpfp": "tab:green"}
    solid = "-delta" in variant or family == "softmax"
    return {"color": colours.get(family, "tab:purple"), "ls": "-" if solid else "--"}


#: Marker of each learning rate of a sweep, smallest first (colour and dash already say φ and the rule).
LR_MARKERS = ("o", "s", "^", "D", "v", "P")


def swept(rows: pd.DataFrame) -> bool:
    """Whether ``rows`` hold more than one learning rate (then every run is named with its lr)."""
    return "lr" in rows and rows["lr"].nunique() > 1


def run_detail(row: pd.Series, with_lr: bool) -> str:
    """'lr 0.006, seed 1' (with ``with_lr``) or 'seed 1': what tells one run of a variant from another."""
    return (f"lr {row['lr']:g}, " if with_lr else "") + f"seed {int(row['seed'])}"


def run_label(row: pd.Series, with_lr: bool) -> str:
    """'linear (lr 0.006, seed 1)' or 'linear (seed 1)': one run in a legend."""
    return f"{row['variant']} ({run_detail(row, with_lr)})"


def _curve(row: pd.Series) -> list[dict]:
    """A run's learning curve: its points, or none (a failed run's record holds no curve: NaN in the frame)."""
    curve = row.get("curve")
    return [p for p in curve if isinstance(p, dict)] if isinstance(curve, list) else []


def _finite(value: object) -> bool:
    """Whether ``value`` is a finite real number (numpy's included; ``True`` and 10**400 are not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        return False


def _runs(rows: pd.DataFrame):
    """(row, label, line style) of every run: sorted by variant, lr and seed; one marker per lr of a sweep."""
    with_lr = swept(rows)
    rates = sorted(rows["lr"].dropna().unique()) if with_lr else []
    order = [c for c in ("variant", "lr", "seed") if c in rows]
    for _, row in rows.sort_values(order).iterrows():
        marker = LR_MARKERS[rates.index(row["lr"]) % len(LR_MARKERS)] if with_lr else "o"
        yield row, run_label(row, with_lr), {**_style(row["variant"]), "marker": marker}


def learning_curves_figure(rows: pd.DataFrame, path: Path, title: str) -> Path:
    """Validation bits per character (the evaluation subset) against training step, one line per run
    (with an lr sweep, each run's legend entry names its lr and each lr has its own marker). Runs without a
    point of finite step and bpc (diverged before their first evaluation, or failed) are counted per variant
    in a last legend entry rather than silently left out."""
    fig, ax = plt.subplots(figsize=(8, 5))
    undrawn: Counter = Counter()
    for row, label, style in _runs(rows):
        curve = [p for p in _curve(row) if _finite(p.get("eval_bpc")) and _finite(p.get("step"))]
        if curve:
            ax.plot([p["step"] for p in curve], [p["eval_bpc"] for p in curve], ms=4, label=label, **style)
        else:
            undrawn[row["variant"]] += 1
    if "unigram_bpc" in rows and rows["unigram_bpc"].notna().any():
        ax.axhline(rows["unigram_bpc"].dropna().iloc[0], color="grey", lw=0.8, ls=":", label="unigram baseline")
    if undrawn:
        runs = ", ".join(f"{variant} ({count} run{'s' if count > 1 else ''})" for variant, count in undrawn.items())
        # wrapped to the width of a run's entry: a wider legend squeezed the axes until the step ticks overlapped
        ax.plot([], [], " ", label=textwrap.fill(f"not drawn, no point with a finite step and bpc: {runs}", 32,
                                                     break_on_hyphens=False))
    ax.set_xlabel("training step")
    ax.set_ylabel("validation bits per character (evaluation subset)")
    ax.set_title(title)
    legend_beside(ax)  # long handles: the sum rule (dashed) and the delta rule (solid) share a colour
    integer_ticks(ax, "x")
    ax.grid(True, alpha=0.3)
    return save(fig, path)


def long_context_figure(rows: pd.DataFrame, path: Path, title: str) -> Path:
    """Carried-state perplexity ÷ per-segment perplexity for each position bucket of the stream.

    Above 1: the memory carried from earlier segments hurts; below 1: it helps. x is the end of
    each bucket in characters (log scale).
    """
    fig, ax = plt.subplots(figsize=(8, 5))
    plotted = False
    for row, label, style in _runs(rows):
        evaluation = row.get("final_evaluation")
        if not isinstance(evaluation, dict) or "long_context" not in evaluation:
            continue
        lc = evaluation["long_context"]
        # a perplexity that overflowed (inf in both: a ratio of NaN) has no point on a log axis
        points = [(hi, c / r) for (_, hi), c, r in zip(lc["buckets"], lc["carried_ppl"], lc["reset_ppl"], strict=True)
                  if math.isfinite(c / r) and c / r > 0]
        if points:
            ax.plot(*zip(*points), ms=4, label=label, **style)
            plotted = True
    ax.axhline(1.0, color="grey", lw=0.8)
    if not plotted:  # log axes without a positive point fail in matplotlib's tick locator
        ax.text(0.5, 0.5, "no finite ratio: every perplexity overflowed", ha="center", transform=ax.transAxes)
        ax.set_title(title)
        return save(fig, path)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("position in the validation stream (characters, end of bucket)")
    ax.set_ylabel("perplexity with carried state ÷ per-segment perplexity")
    ax.set_title(title)
    legend_beside(ax)
    plain_ticks(ax, "x")
    plain_ticks(ax, "y")  # a ratio axis spanning less than a decade read "1.15 × 10^0"
    ax.grid(True, which="both", alpha=0.3)
    return save(fig, path)
