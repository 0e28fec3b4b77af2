"""Report figures (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fwbench.analysis.capacity import measured_loss  # noqa: E402
from fwbench.analysis.reference import official_synthetic  # noqa: E402
from fwbench.analysis.statistics import log_mean_ci  # noqa: E402
from fwbench.report.figure_style import legend_beside, plain_ticks, save  # noqa: E402


def capacity_figure(ours: pd.DataFrame, setting: int, path: Path, title: str) -> Path:
    """Best eval loss vs S, one line per variant (geometric seed mean, 95 % log-space band), official
    seed 1 dashed; the legend beside the axes. Diverged runs are not measured losses (left out).

    ``ours`` holds the retrieval rows of one setting (see :func:`analysis.records_frame`).
    """
    fig, ax = plt.subplots(figsize=(10, 5))
    ours = ours.assign(best_eval_loss=measured_loss(ours))
    official = official_synthetic()
    official = official[official["setting"] == setting]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (variant, rows) in enumerate(sorted(ours.groupby("variant"), key=lambda kv: kv[0])):
        colour = colours[index % len(colours)]
        stats = log_mean_ci(rows, ["S"], "best_eval_loss").set_index("S").sort_index()
        ax.plot(stats.index, stats["mean"], "o-", color=colour, label=f"{variant} (fwbench)")
        if rows["seed"].nunique() > 1:  # 95 % band over seeds, in log space
            ax.fill_between(stats.index, stats["ci_low"], stats["ci_high"], color=colour, alpha=0.2)
        ref = official[official["variant"] == variant].sort_values("S")
        if not ref.empty:
            ax.plot(ref["S"], ref["min_eval_loss"], "--", color=colour, alpha=0.6, label=f"{variant} (official, seed 1)")
    ax.set_yscale("log")
    ax.set_xlabel("number of unique keys S")
    ax.set_ylabel("best evaluation loss ½‖v − v̂‖²")
    ax.axhline(0.01, color="grey", lw=0.8, ls=":")
    ax.set_title(title)
    legend_beside(ax)  # inside, it covered the official softmax curve at S ≈ 350-500
    plain_ticks(ax)
    ax.grid(True, which="both", alpha=0.3)
    return save(fig, path)
