"""The paper's claims, each checked against this run's records: PASS, FAIL, INDICATIVE or NOT RUN.

A claim is a function from the records table to a :class:`ClaimResult` that states what the paper
found (from ``reference_data``), what this run measured, what evidence the verdict rests on, and where
the paper makes the claim. Each criterion states what the paper states over the cells the paper shows
it on; a test feeds the official seed-1 logs through every criterion (they must pass) and a wrong twin
of those logs (it must fail). Setting 1 claims live here, Setting 2 claims in
:mod:`fwbench.analysis.claims_setting2`, language-model claims in :mod:`fwbench.analysis.claims_lm`.
Add a claim by writing one function and listing it in ``CLAIMS``.

Every capacity comes from the one estimator of :mod:`fwbench.analysis.capacity` (per seed, robust to
one bad point, then aggregated); two capacities differ only when their seed intervals do not overlap
and a grid point separates them. Losses are compared through log-space intervals. A diverged run is
neither a pass nor a measured loss.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pandas as pd

from fwbench.analysis.capacity import capacity_estimates, capacity_intervals, describe, retrieval_rows
from fwbench.analysis.claims_lm import LM_CLAIMS
from fwbench.analysis.claims_setting2 import SETTING2_CLAIMS, official_loss
from fwbench.analysis.evidence import (
    RETRIEVAL_MINIMUM,
    cell_loss,
    certainly_below,
    certainly_lower,
    describe_cell,
    retrieval_gaps,
    s_range_missing,
    variants_missing,
)
from fwbench.analysis.records import CAPACITY_THRESHOLD
from fwbench.analysis.reference import official_records
from fwbench.analysis.verdicts import FAIL, INDICATIVE, NOT_RUN, PASS, ClaimResult, judge, lean, not_run
from fwbench.variants import d_dot_of, parse_spec

__all__ = ["CLAIMS", "FAIL", "INDICATIVE", "NOT_RUN", "PASS", "evaluate_claims", "main_d_key"]

#: The paper's key size: Setting 1 claims read it.
PAPER_D_KEY = 64
#: Where the paper's softmax still retrieves (Figure 2 left), and the slack "≈" allows.
SOFTMAX_HOLDS_TO, APPROX = 500, 0.9
#: C3: capacity / d_dot of the sum rule lies in this band (the paper's own ratios: 0.85–1.03).
D_DOT_BAND = (0.7, 1.3)


def main_d_key(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of one d_key: the paper's (64) if present, else the d_key with the most rows.

    Losses at different d_key are not comparable (d_dot grows with d_key), so they are never averaged.
    """
    if rows.empty or "d_key" not in rows or rows["d_key"].nunique() <= 1:
        return rows
    if (rows["d_key"] == PAPER_D_KEY).any():
        return rows[rows["d_key"] == PAPER_D_KEY]
    return rows[rows["d_key"] == rows["d_key"].value_counts().idxmax()]


def _widest_nu_sweep(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the d_key whose DPFP sweep has the most values of ν (ties: the larger d_key).

    Capacities at different d_key are not comparable (d_dot = 2·d_key·ν), so C2 uses one d_key.
    """
    if rows.empty or "d_key" not in rows:
        return rows
    dpfp = rows[rows["variant"].str.startswith("dpfp:nu=")]
    if dpfp.empty:
        return rows
    counts = dpfp.groupby("d_key")["variant"].nunique()
    best = max(counts.index, key=lambda d: (counts[d], d))
    return rows[rows["d_key"] == best]


def _official(setting: int) -> pd.DataFrame:
    return retrieval_rows(official_records(), setting)


@cache
def _official_capacity_text(setting: int, variant: str) -> str:
    rows = _official(setting)
    return describe(capacity_intervals(rows[rows["variant"] == variant]).iloc[0]).replace(" (1 seed", " (seed 1")


def _rows_of(frame: pd.DataFrame, setting: int, variants: list[str] | None = None) -> pd.DataFrame:
    rows = main_d_key(retrieval_rows(frame, setting))
    return rows if variants is None or rows.empty else rows[rows["variant"].isin(variants)]


def claim_linear_fails_softmax_holds(frame: pd.DataFrame) -> ClaimResult:
    """C1: linear attention (d_dot 64) fails by S=80 while softmax holds to S≈500.

    Criterion: linear's capacity certainly ≤ 80 and softmax's certainly ≥ 0.9·500 (losses of 0.016–0.030
    at S ≥ 540, as in the official logs, do not fail it). Minimum: S to 80 for linear and to 500 for
    softmax, plus :data:`~fwbench.analysis.evidence.RETRIEVAL_MINIMUM`.
    """
    claim = f"C1: linear attention (d_dot 64) fails by S=80 while softmax holds (≤ {CAPACITY_THRESHOLD}) to S≈500"
    paper = (f"capacity: linear {_official_capacity_text(1, 'linear')} (0.108 at S=80), "
             f"softmax {_official_capacity_text(1, 'softmax')} (0.016–0.030 at S ≥ 540)")
    reference, minimum = "Sec. 6.1, Fig. 2 (left)", f"linear to S=80, softmax to S={SOFTMAX_HOLDS_TO}; " \
        + RETRIEVAL_MINIMUM
    rows = _rows_of(frame, 1, ["linear", "softmax"])
    caps = capacity_estimates(rows)
    if "linear" not in caps or "softmax" not in caps:
        return not_run("C1", claim, paper, "needs Setting 1 runs of linear and softmax", minimum, reference)
    (linear, linear_text), (softmax, softmax_text) = caps["linear"], caps["softmax"]
    holds_to = APPROX * SOFTMAX_HOLDS_TO
    linear_fails, softmax_holds = linear.at_most(80), softmax.at_least(holds_to)
    measured = f"capacity: linear {linear_text}; softmax {softmax_text}"
    gaps = [*retrieval_gaps(rows), s_range_missing(rows, "linear", 80),
            s_range_missing(rows, "softmax", SOFTMAX_HOLDS_TO)]
    return judge("C1", claim, paper, measured, lean([linear_fails, softmax_holds]), gaps, minimum, reference)


def claim_dpfp_capacity_grows_with_nu(frame: pd.DataFrame) -> ClaimResult:
    """C2: DPFP's capacity grows with ν (d_dot = 2·d_key·ν): each ν certainly above the one before."""
    claim = "C2: DPFP capacity grows with ν (sum rule, Setting 1)"
    paper = "capacity " + ", ".join(f"ν={nu}: {_official_capacity_text(1, f'dpfp:nu={nu}')}" for nu in (1, 2, 3))
    reference, minimum = "Sec. 6.1, Fig. 2 (left)", "ν = 1, 2, 3 at one d_key; " + RETRIEVAL_MINIMUM
    rows = _widest_nu_sweep(retrieval_rows(frame, 1))
    rows = rows[rows["variant"].str.startswith("dpfp:nu=")] if not rows.empty else rows
    caps = capacity_estimates(rows)
    nus = sorted(int(v.split("=")[1]) for v in caps)
    if len(nus) < 2:
        return not_run("C2", claim, paper, "needs Setting 1 runs of at least two values of ν", minimum, reference)
    measured = "capacity " + ", ".join(f"ν={nu}: {caps[f'dpfp:nu={nu}'][1]}" for nu in nus)
    measured += f" (d_key {int(rows['d_key'].iloc[0])})"
    checks = [caps[f"dpfp:nu={b}"][0].above(caps[f"dpfp:nu={a}"][0]) for a, b in zip(nus, nus[1:])]
    gaps = [*retrieval_gaps(rows), "" if len(nus) >= 3 else f"ν ∈ {{{', '.join(map(str, nus))}}} only"]
    gaps += [f"ν={nu} not bracketed by the S grid" for nu in nus if caps[f"dpfp:nu={nu}"][0].bound]
    return judge("C2", claim, paper, measured, lean(checks), gaps, minimum, reference)


#: The sum-rule memories C3 names (Figure 2 left, d_key 64).
SUM_RULE_NAMED = ["linear", "dpfp:nu=1", "dpfp:nu=2", "dpfp:nu=3"]


def claim_sum_rule_failure_scales_with_d_dot(frame: pd.DataFrame) -> ClaimResult:
    """C3: with the sum rule, capacity ≈ d_dot: capacity / d_dot within 0.7–1.3 for linear and DPFP
    ν = 1, 2, 3 at d_key 64 (FAIL when a ratio is certainly outside the band, seed interval and grid)."""
    low_band, high_band = D_DOT_BAND
    claim = f"C3: for the sum rule, capacity ≈ d_dot (capacity / d_dot within {low_band}–{high_band}, d_key 64)"
    official = capacity_estimates(_official(1))
    paper = "capacity / d_dot: " + ", ".join(
        f"{v} {official[v][0].value / _paper_d_dot(v):.2f}" for v in SUM_RULE_NAMED)
    reference, minimum = "Sec. 6.1 (\"capacity = d_dot\"), Fig. 2 (left)", \
        "linear, DPFP ν = 1, 2, 3 bracketed at d_key 64; " + RETRIEVAL_MINIMUM
    rows = retrieval_rows(frame, 1)
    rows = main_d_key(rows[rows["variant"].map(_is_sum_rule_linear_or_dpfp)]) if not rows.empty else rows
    if rows.empty:
        return not_run("C3", claim, paper, "needs Setting 1 runs of linear or DPFP", minimum, reference)
    d_key = int(rows["d_key"].iloc[0]) if "d_key" in rows and pd.notna(rows["d_key"].iloc[0]) else PAPER_D_KEY
    caps = capacity_estimates(rows)
    parts, checks, gaps = [], [], [*retrieval_gaps(rows), variants_missing(rows, SUM_RULE_NAMED)]
    if d_key != PAPER_D_KEY:
        gaps.append(f"d_key {d_key}, not the paper's {PAPER_D_KEY}")
    for variant, (cap, text) in caps.items():
        d_dot = float(d_dot_of(variant, d_key))
        low, high = cap.ratio_interval(d_dot)
        sign = f"{cap.bound} " if cap.bound else ""  # a censored capacity gives a bound on the ratio too
        parts.append(f"{variant} {text} → {sign}{cap.value / d_dot:.2f}·d_dot")
        if (high < low_band and cap.grid_high / d_dot <= low_band) or (low > high_band and
                                                                        cap.grid_low / d_dot >= high_band):
            checks.append(False)
        elif not cap.bound and low >= low_band and high <= high_band:
            checks.append(True)
        else:
            checks.append(None)
            if cap.bound:
                gaps.append(f"{variant} not bracketed by the S grid")
    return judge("C3", claim, paper, "; ".join(parts), lean(checks), gaps, minimum, reference)


def _is_sum_rule_linear_or_dpfp(variant: str) -> bool:
    spec = parse_spec(variant)
    return spec.info.rule == "sum" and spec.name in ("linear", "dpfp")


def _paper_d_dot(variant: str) -> float:
    """d_dot of a spec at the paper's d_key."""
    return float(d_dot_of(variant, PAPER_D_KEY))


FAVOR_NAMED = ["favor:m=64", "favor:m=128", "favor:m=512"]


def _favor_at_smallest_S(rows: pd.DataFrame) -> tuple[int, dict[str, tuple]]:
    """(smallest S where FAVOR+ ran, m-sorted {variant: (interval, diverged)} at that S)."""
    S = int(rows["S"].min())
    at = rows[rows["S"] == S]
    order = sorted(at["variant"].unique(), key=lambda v: parse_spec(v).params["m"])
    return S, {v: cell_loss(at[at["variant"] == v]) for v in order}


def claim_favor_never_reaches_zero(frame: pd.DataFrame) -> ClaimResult:
    """C4: FAVOR+ (sum rule, m ∈ {64, 128, 512}) stays above the capacity threshold even at S=20."""
    claim = f"C4: FAVOR+ with m ≤ 512 does not reach ~0 (best loss > {CAPACITY_THRESHOLD}) even at S=20"
    paper = "S=20: " + ", ".join(f"{v} {official_loss(1, v, 20):.3f}" for v in FAVOR_NAMED)
    reference, minimum = "Sec. 6.1, Fig. 2 (left)", "m = 64, 128, 512 at S=20; " + RETRIEVAL_MINIMUM
    rows = _rows_of(frame, 1)
    favor = rows[rows["variant"].isin(FAVOR_NAMED) & (rows["S"] <= 20)] if not rows.empty else rows
    if favor.empty:
        return not_run("C4", claim, paper, "needs Setting 1 FAVOR+ runs at S ≤ 20", minimum, reference)
    S, cells = _favor_at_smallest_S(favor)
    checks = [None if c is None else not c for c in (certainly_below(i, CAPACITY_THRESHOLD) for i, _ in cells.values())]
    measured = f"S={S}: " + "; ".join(f"{v} {describe_cell(*cell)}" for v, cell in cells.items())
    ran = [v for v in FAVOR_NAMED if v in cells]
    gaps = [*retrieval_gaps(favor), "" if len(ran) == len(FAVOR_NAMED) else
            f"{', '.join(v.split(':')[1] for v in ran)} only"]
    return judge("C4", claim, paper, measured, lean(checks), gaps, minimum, reference)


def claim_favor_improves_with_m(frame: pd.DataFrame) -> ClaimResult:
    """C13: FAVOR+'s loss at the smallest S falls as m grows: the largest m certainly below the smallest,
    and no larger m certainly above the next smaller one (neighbours, 0.117 vs 0.074 officially, may sit
    within seed noise)."""
    claim = "C13: FAVOR+ improves with the number of random features m (best loss at S=20 falls with m)"
    paper = "S=20: " + " > ".join(f"{v.split(':')[1]} {official_loss(1, v, 20):.3f}" for v in FAVOR_NAMED)
    reference, minimum = "Sec. 6.1, Fig. 2 (left)", "m = 64, 128, 512 at S=20; " + RETRIEVAL_MINIMUM
    rows = _rows_of(frame, 1)
    favor = rows[rows["variant"].str.startswith("favor:") & (rows["S"] <= 20)] if not rows.empty else rows
    if favor.empty or favor["variant"].nunique() < 2:
        return not_run("C13", claim, paper, "needs Setting 1 runs of two values of m at S ≤ 20", minimum, reference)
    S, cells = _favor_at_smallest_S(favor)
    names = list(cells)
    reversed_ = [certainly_lower(cells[a][0], cells[b][0]) for a, b in zip(names, names[1:])]
    checks = [certainly_lower(cells[names[-1]][0], cells[names[0]][0]), *(False for r in reversed_ if r is True)]
    measured = f"S={S}: " + " → ".join(f"{v.split(':')[1]} {describe_cell(*cells[v])}" for v in names)
    gaps = [*retrieval_gaps(favor), variants_missing(favor, FAVOR_NAMED)]
    return judge("C13", claim, paper, measured, lean(checks), gaps, minimum, reference)


def claim_dpfp_beats_favor_at_equal_d_dot(frame: pd.DataFrame) -> ClaimResult:
    """C12: at equal d_dot, DPFP's capacity is certainly above FAVOR+'s (ν=1 vs m=64: d_dot 128;
    ν=2 vs m=128: d_dot 256)."""
    claim = "C12: DPFP beats FAVOR+ at equal d_dot (capacity, sum rule, Setting 1)"
    pairs = [("dpfp:nu=1", "favor:m=64"), ("dpfp:nu=2", "favor:m=128")]
    paper = "capacity: " + "; ".join(
        f"{d} {_official_capacity_text(1, d)} vs {f} {_official_capacity_text(1, f)}" for d, f in pairs)
    reference, minimum = "Sec. 6.1, Fig. 2 (left)", "both pairs (d_dot 128, 256) at d_key 64; " + RETRIEVAL_MINIMUM
    rows = _rows_of(frame, 1, [v for pair in pairs for v in pair])
    caps = capacity_estimates(rows)
    ran = [(d, f) for d, f in pairs if d in caps and f in caps]
    if not ran:
        return not_run("C12", claim, paper, "needs Setting 1 runs of DPFP and FAVOR+ with equal d_dot", minimum,
                       reference)
    checks = [caps[d][0].above(caps[f][0]) for d, f in ran]
    measured = "; ".join(f"{d} {caps[d][1]} vs {f} {caps[f][1]}" for d, f in ran)
    gaps = [*retrieval_gaps(rows), "" if len(ran) == len(pairs) else f"{' vs '.join(ran[0])} only"]
    return judge("C12", claim, paper, measured, lean(checks), gaps, minimum, reference)


#: Every claim; the table lists them in id order (C1-C4, C12, C13 here; C5, C6, C11, C14 Setting 2;
#: C7-C10 language modelling).
CLAIMS: list[Callable[[pd.DataFrame], ClaimResult]] = [
    claim_linear_fails_softmax_holds,
    claim_dpfp_capacity_grows_with_nu,
    claim_sum_rule_failure_scales_with_d_dot,
    claim_favor_never_reaches_zero,
    claim_dpfp_beats_favor_at_equal_d_dot,
    claim_favor_improves_with_m,
    *SETTING2_CLAIMS,
    *LM_CLAIMS,
]


def without_failed_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without the runs that raised (status ``failed``: ``failed_record``, metrics {}, trained again
    by the next ``fwbench run``): such a run measured nothing, so no claim may read it as a run that ended.
    C14 read three favor-delta runs that raised at S = 100 as '0 of 3 diverged' and leaned FAIL, and the
    seed minimum counted their seeds as run."""
    return frame[frame["status"] != "failed"] if "status" in frame else frame


def evaluate_claims(frame: pd.DataFrame) -> list[ClaimResult]:
    """Every claim in ``CLAIMS`` checked against ``frame`` (see :func:`analysis.records_frame`), in id order;
    runs that failed are no evidence (:func:`without_failed_runs`)."""
    frame = without_failed_runs(frame)
    results = [claim(frame) for claim in CLAIMS]
    return sorted(results, key=lambda r: int(r.id[1:]))
