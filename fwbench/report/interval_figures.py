"""Report figures with seed statistics: mean over seeds and a 95 % Student-t band or error bar
(:mod:`fwbench.analysis.statistics`); a band needs at least two seeds. Official seed-1 results are drawn
beside ours where they exist. Written as PNG with matplotlib.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fwbench.analysis.capacity import capacity_intervals, measured_loss, retrieval_rows  # noqa: E402
from fwbench.analysis.records import CAPACITY_THRESHOLD  # noqa: E402
from fwbench.analysis.reference import official_records, official_synthetic  # noqa: E402
from fwbench.analysis.statistics import log_mean_ci, mean_ci  # noqa: E402
from fwbench.report.figure_style import legend_below, legend_beside, plain_ticks, save, texts_as_written  # noqa: E402
from fwbench.report.point_labels import line_boxes, marker_box, place_labels  # noqa: E402


def _save(fig, path: Path) -> Path:
    return save(fig, path)


def finite_loss(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a column ``loss``: the best eval loss, NaN where it is not finite or the run diverged
    (a diverged run is not a measured loss)."""
    rows = rows.copy()
    loss = measured_loss(rows)
    rows["loss"] = loss.where(np.isfinite(loss))
    return rows


def loss_vs_S_figure(rows: pd.DataFrame, setting: int, path: Path, title: str) -> Path:
    """Best eval loss vs S per variant: geometric seed mean (markers + line), 95 % log-space band (≥ 2
    seeds), official seed 1 dashed, diverged runs as red crosses at the top of the axis (count per S)."""
    fig, ax = plt.subplots(figsize=(10.5, 5.2))
    official = official_synthetic()
    official = official[official["setting"] == setting]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    rows = finite_loss(rows)
    stats = log_mean_ci(rows, ["variant", "S"], "loss")
    top = 1.0
    for index, (variant, group) in enumerate(sorted(stats.groupby("variant"), key=lambda kv: kv[0])):
        colour = colours[index % len(colours)]
        group = group.sort_values("S")
        ax.plot(group["S"], group["mean"], "o-", color=colour, label=f"{variant} (fwbench)")
        band = group[group["n"] > 1]
        if not band.empty:
            ax.fill_between(band["S"], band["ci_low"], band["ci_high"], color=colour, alpha=0.2)
        ref = official[official["variant"] == variant].sort_values("S")
        if not ref.empty:
            # the official code evaluated Setting 2 on length S; we train and evaluate on 2S
            evaluated = ", evaluated on S" if setting == 2 else ""
            ax.plot(ref["S"], ref["min_eval_loss"], "--", color=colour, alpha=0.6,
                    label=f"{variant} (official, seed 1{evaluated})")
        top = max(top, float(np.nanmax(group["mean"])) if group["mean"].notna().any() else top)
    diverged = rows[rows["status"] == "diverged"]
    if not diverged.empty:  # one cross per S, with how many runs diverged there (their names: the table)
        counts = diverged.groupby("S").size()
        ax.plot(counts.index, [top * 1.5] * len(counts), "x", color="red", ms=9, ls="none",
                label="diverged runs at this S (count; no loss)")
        for S, count in counts.items():
            ax.annotate(str(count), (S, top * 1.5), fontsize=7, xytext=(0, 6), textcoords="offset points",
                        color="red", ha="center")
    ax.set_yscale("log")
    ax.set_xlabel("number of unique keys S")
    ax.set_ylabel("best evaluation loss ½‖v − v̂‖²")
    ax.axhline(CAPACITY_THRESHOLD, color="grey", lw=0.8, ls=":")
    ax.set_title(title)
    legend_beside(ax)  # inside, two columns of labels covered the curves they name
    plain_ticks(ax)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def official_capacities(threshold: float = CAPACITY_THRESHOLD) -> pd.DataFrame:
    """Setting 1 capacities of the official seed-1 runs (d_key 64), from the one capacity estimator
    (:func:`fwbench.analysis.capacity.capacity_intervals`): variant, d_dot, capacity, bound."""
    table = capacity_intervals(retrieval_rows(official_records(), 1), threshold)
    table = table[table["d_dot"].notna()]
    return pd.DataFrame({"variant": table["variant"], "d_dot": table["d_dot"], "capacity": table["capacity_mean"],
                         "bound": table["bound"]}).reset_index(drop=True)


#: Legend words for the censoring mark of a capacity (see :func:`fwbench.analysis.capacity.capacity_intervals`).
BOUND_WORDS = {"≥": "lower bound", "<": "upper bound", "": ""}


def capacity_vs_d_dot_figure(table: pd.DataFrame, path: Path, official: pd.DataFrame | None = None) -> Path:
    """Capacity against d_dot (log-log) with the line capacity = d_dot.

    ``table``: rows of :func:`fwbench.analysis.capacity.capacity_intervals`. Filled markers: this run's seed
    mean with its 95 % t-interval (solid bar), or with one seed the S-grid bracket (dotted bar); a
    triangle up (down) marks a lower (upper) bound where the S grid did not bracket the capacity.
    Hollow grey markers: the official seed-1 runs (d_key 64), each named beside its marker where the name
    covers no other label, marker or bar (:func:`fwbench.report.point_labels.place_labels`). The legend
    sits under the axes, so the plot keeps the figure's width.
    """
    fig, ax = plt.subplots(figsize=(8, 7))
    shown = table[table["capacity_mean"].notna()]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ours = []  # (d_dot, capacity, bar low, bar high): label placement keeps clear of them
    for index, ((variant, d_key), group) in enumerate(shown.groupby(["variant", "d_key"], sort=True)):
        colour = colours[index % len(colours)]
        row = group.iloc[0]
        marker = {"≥": "^", "<": "v"}.get(row["bound"], "o")
        yerr, low, high, style = None, row.get("ci_low", math.nan), row.get("ci_high", math.nan), "-"
        if math.isnan(low) and not row["bound"] and math.isfinite(row.get("grid_high", math.nan)):
            low, high, style = row["grid_low"], row["grid_high"], ":"  # one seed: the S-grid bracket instead
        if not math.isnan(low):
            yerr = [[max(row["capacity_mean"] - low, 0)], [max(high - row["capacity_mean"], 0)]]
        bound = BOUND_WORDS[row["bound"]]
        bars = ax.errorbar([row["d_dot"]], [row["capacity_mean"]], yerr=yerr, fmt=marker, color=colour, ms=7,
                           capsize=3, label=f"{variant} (d_key {int(d_key)}{', ' + bound if bound else ''})")
        if yerr is not None:
            bars[2][0].set_linestyle(style)
        ours.append((row["d_dot"], row["capacity_mean"], None if yerr is None else low,
                     None if yerr is None else high))
    ref = official[official["capacity"].notna()] if official is not None else pd.DataFrame()
    for bound, marker in (("", "o"), ("≥", "^"), ("<", "v")):
        part = ref[ref["bound"] == bound] if not ref.empty else ref
        if not part.empty:
            note = f", {BOUND_WORDS[bound]}" if bound else ""
            ax.scatter(part["d_dot"], part["capacity"], marker=marker, facecolors="none", edgecolors="grey",
                       s=70, label=f"official seed 1 (d_key 64{note})")
    values = list(shown["d_dot"]) + list(shown["capacity_mean"])
    if not ref.empty:
        values += list(ref["d_dot"]) + list(ref["capacity"])
    values = [v for v in values if v and v > 0 and math.isfinite(v)] or [10, 1000]
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], "k--", lw=1, label="capacity = d_dot")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("d_dot (size of φ: columns of the fast weight)")
    ax.set_ylabel(f"capacity: largest S with best loss ≤ {CAPACITY_THRESHOLD}")
    ax.set_title("Setting 1: capacity vs d_dot\n(seed mean; bars: 95 % t-interval; dotted bars: S-grid bracket)",
                 fontsize=10)
    legend_below(ax, ncol=2)
    plain_ticks(ax, "x")
    plain_ticks(ax, "y")
    ax.grid(True, which="both", alpha=0.3)
    texts_as_written(fig)  # before the draw below: a variant named a$\frac$ raised there
    fig.tight_layout()  # the final layout first: labels are placed in pixels
    fig.canvas.draw()
    avoid = [marker_box(ax, x, y, 7.0, lo, hi) for x, y, lo, hi in ours]
    avoid += [marker_box(ax, x, y, 7.0) for x, y in zip(ref.get("d_dot", []), ref.get("capacity", []), strict=True)]
    avoid += line_boxes(ax, (low, low), (high, high))  # no name written across the line capacity = d_dot
    place_labels(ax, [(r["d_dot"], r["capacity"], r["variant"]) for _, r in ref.iterrows()], avoid,
                 fontsize=7, color="dimgrey")
    return _save(fig, path)


def mqar_figure(rows: pd.DataFrame, path: Path) -> Path:
    """MQAR accuracy at the query positions vs d_model, one line per variant (seed mean, 95 % band)."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    rows = rows.copy()
    # a diverged run is no measured accuracy (the divergence policy): a red cross, not in the mean
    rows["accuracy"] = rows["best_eval_accuracy"].astype(float).where(rows["status"] != "diverged")
    stats = mean_ci(rows, ["variant", "d_model"], "accuracy")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (variant, group) in enumerate(sorted(stats.groupby("variant"), key=lambda kv: kv[0])):
        colour = colours[index % len(colours)]
        group = group.sort_values("d_model")
        ax.plot(group["d_model"], group["mean"], "o-", color=colour, label=variant)
        band = group[group["n"] > 1]
        if not band.empty:
            ax.fill_between(band["d_model"], band["ci_low"], band["ci_high"].clip(upper=1.0), color=colour, alpha=0.2)
    for _, run in rows[rows["status"] == "diverged"].iterrows():
        ax.plot(run["d_model"], 0.0, "x", color="red", ms=9)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("d_model")
    ax.set_ylabel("accuracy at query positions (best evaluation)")
    ax.set_title("Multi-query associative recall (Zoology generator)")
    legend_beside(ax)
    plain_ticks(ax, "x")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)
