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


@lru_cache(maxsize=1)
def paper_lm_tables() -> pd.DataFrame:
    """The paper's WikiText-103 perplexities (Tables 2, 4, 5), as transcribed."""
    return pd.read_csv(REFERENCE_DIR / "paper_lm_tables.csv")
