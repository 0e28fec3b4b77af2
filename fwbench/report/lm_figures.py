"""Language-model report figures: learning curves and the long-context (carried state) evaluation."""

from __future__ import annotations

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


def learning_curves_figure(rows: pd.DataFrame, path: Path, title: str) -> Path:
    """Validation bits per character (the evaluation subset) against training step, one line per run."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for _, row in rows.sort_values("variant").iterrows():
        curve = [p for p in (row["curve"] or []) if "eval_bpc" in p]
        if curve:
            ax.plot([p["step"] for p in curve], [p["eval_bpc"] for p in curve], marker="o", ms=3,
                    label=f"{row['variant']} (seed {row['seed']})", **_style(row["variant"]))
    if "unigram_bpc" in rows and rows["unigram_bpc"].notna().any():
        ax.axhline(rows["unigram_bpc"].dropna().iloc[0], color="grey", lw=0.8, ls=":", label="unigram baseline")
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
    for _, row in rows.sort_values("variant").iterrows():
        evaluation = row.get("final_evaluation")
        if not isinstance(evaluation, dict) or "long_context" not in evaluation:
            continue
        lc = evaluation["long_context"]
        ends = [hi for _, hi in lc["buckets"]]
        ratio = [c / r for c, r in zip(lc["carried_ppl"], lc["reset_ppl"], strict=True)]
        ax.plot(ends, ratio, marker="o", ms=3, label=f"{row['variant']} (seed {row['seed']})", **_style(row["variant"]))
    ax.axhline(1.0, color="grey", lw=0.8)
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
