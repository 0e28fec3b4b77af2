"""Report figures (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fwbench.analysis.reference import official_synthetic  # noqa: E402
from fwbench.analysis.statistics import mean_ci  # noqa: E402


def capacity_figure(ours: pd.DataFrame, setting: int, path: Path, title: str) -> Path:
    """Best eval loss vs S, one line per variant (seed mean, 95 % t-band), official seed 1 dashed.

    ``ours`` holds the retrieval rows of one setting (see :func:`analysis.records_frame`).
    """
    fig, ax = plt.subplots(figsize=(8, 5))
    official = official_synthetic()
    official = official[official["setting"] == setting]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (variant, rows) in enumerate(sorted(ours.groupby("variant"), key=lambda kv: kv[0])):
        colour = colours[index % len(colours)]
        stats = mean_ci(rows, ["S"], "best_eval_loss").set_index("S").sort_index()
        ax.plot(stats.index, stats["mean"], "o-", color=colour, label=f"{variant} (fwbench)")
        if rows["seed"].nunique() > 1:  # 95 % Student-t band over seeds
            ax.fill_between(stats.index, stats["ci_low"].clip(lower=1e-6), stats["ci_high"], color=colour, alpha=0.2)
        ref = official[official["variant"] == variant].sort_values("S")
        if not ref.empty:
            ax.plot(ref["S"], ref["min_eval_loss"], "--", color=colour, alpha=0.6, label=f"{variant} (official, seed 1)")
    ax.set_yscale("log")
    ax.set_xlabel("number of unique keys S")
    ax.set_ylabel("best evaluation loss ½‖v − v̂‖²")
    ax.axhline(0.01, color="grey", lw=0.8, ls=":")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
