"""The paper's official results as data (recomputed from the official code's logs, seed 1).

``official_synthetic_results.csv`` names variants the official way (``phi`` = dpfp2, favor64, …;
``update_rule`` = sum, ours (the delta rule), fwm, cat (softmax)); this module maps them to fwbench
spec strings so that official points can be drawn beside ours.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pandas as pd

from fwbench.variants import d_dot_of

REFERENCE_DIR = Path(__file__).resolve().parent / "reference_data"


def official_variant_spec(phi: str, update_rule: str) -> str:
    """Map the official (phi, update_rule) names to an fwbench spec, e.g. (dpfp2, ours) → dpfp-delta:nu=2."""
    if phi == "softmax":
        return "softmax"
    suffix = {"sum": "", "ours": "-delta", "fwm": "-fwm"}[update_rule]
    match = re.fullmatch(r"(dpfp|favor)(\d+)", phi)
    if match:
        name, number = match.groups()
        param = "nu" if name == "dpfp" else "m"
        return f"{name}{suffix}:{param}={number}"
    return f"{phi}{suffix}"


@lru_cache(maxsize=1)
def official_synthetic() -> pd.DataFrame:
    """Official seed-1 runs: columns setting, S, L, variant (fwbench spec), min_eval_loss, …"""
    frame = pd.read_csv(REFERENCE_DIR / "official_synthetic_results.csv")
    frame["variant"] = [official_variant_spec(p, u) for p, u in zip(frame["phi"], frame["update_rule"])]
    return frame


#: The official runs' stopping rule (reference_data/README.md): eval loss ≤ 0.001 or 10 evaluations
#: without improvement, at most 100k steps, evaluating every 100 steps.
OFFICIAL_TARGET_LOSS, OFFICIAL_MAX_STEPS, OFFICIAL_EVAL_EVERY = 0.001, 100000, 100


@lru_cache(maxsize=4)
def official_records(seeds: tuple[int, ...] = (1,)) -> pd.DataFrame:
    """The official seed-1 results as rows of a records frame (:func:`fwbench.analysis.records_frame`),
    so the claims engine can read the paper's own logs as it reads ours.

    Columns: task, grid, setting, S, variant, d_key (64), d_dot, seed, best_eval_loss, status, steps,
    max_steps, eval_every. ``status`` follows the official stopping rule: "diverged" when the last
    evaluation was NaN (FAVOR+ with the delta rule in Setting 2), "converged" at loss ≤ 0.001, else
    "plateau". ``seeds`` repeats every row under each seed given: ``(1, 2, 3)`` reads the paper's logs
    as if every seed had matched seed 1, which lets a test ask whether a criterion passes them once
    the seed minimum is met. Cached: callers must copy before changing it.
    """
    official = official_synthetic()
    rows = []
    for seed in seeds:
        for _, r in official.iterrows():
            diverged = pd.isna(r["last_eval_loss"])
            status = ("diverged" if diverged else
                      "converged" if r["min_eval_loss"] <= OFFICIAL_TARGET_LOSS else "plateau")
            rows.append({
                "task": "retrieval", "grid": "capacity" if r["setting"] == 1 else "setting2",
                "setting": int(r["setting"]), "S": int(r["S"]), "variant": r["variant"], "d_key": 64,
                "d_dot": d_dot_of(r["variant"], 64), "seed": seed, "best_eval_loss": float(r["min_eval_loss"]),
                "status": status, "steps": int(r["last_step"]), "max_steps": OFFICIAL_MAX_STEPS,
                "eval_every": OFFICIAL_EVAL_EVERY,
                # the official tanh-FWM runs used lr 1e-4 and batch 128 ("necessary for FWM")
                "lr": 1e-4 if r["variant"] == "tanh-fwm" else 1e-3,
                "batch_size": 128 if r["variant"] == "tanh-fwm" else 32,
            })
    return pd.DataFrame(rows)


@lru_cache(maxsize=1)
def paper_lm_tables() -> pd.DataFrame:
    """The paper's WikiText-103 perplexities (Tables 2, 4, 5), as transcribed."""
    return pd.read_csv(REFERENCE_DIR / "paper_lm_tables.csv")
