"""What a claim's evidence lacks, word for word, and how two cells' intervals compare at their edges.
Hand-made records frames; the claims built on these are tested in test_claims_criteria.py."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fwbench.analysis.evidence import (
    RETRIEVAL_MINIMUM,
    cell_loss,
    certainly_below,
    certainly_lower,
    describe_cell,
    retrieval_gaps,
    s_range_missing,
    seeds_missing,
    unfinished,
    variants_missing,
)
from fwbench.analysis.statistics import Interval, log_interval


def rows(*cells):
    """(variant, S, seed, best loss, status) tuples as a records frame."""
    return pd.DataFrame(cells, columns=["variant", "S", "seed", "best_eval_loss", "status"])


def test_the_minimum_names_three_seeds():
    assert RETRIEVAL_MINIMUM.startswith("≥ 3 seeds per cell")


def test_seeds_are_counted_per_variant_and_S():
    full = [("linear", S, seed, 1e-3, "converged") for S in (20, 40) for seed in (1, 2, 3)]
    assert seeds_missing(rows(*full)) == ""
    assert seeds_missing(rows()) == ""
    # S = 60 has one seed although the variant has three: the count is per cell
    assert seeds_missing(rows(*full, ("linear", 60, 1, 1e-3, "converged"))) == "1 seed"
    two = rows(*full, ("softmax", 20, 1, 1e-3, "diverged"), ("softmax", 20, 2, 1e-3, "converged"),
               ("softmax", 20, 2, 1e-3, "converged"))  # a repeated seed counts once; a diverged one counts
    assert seeds_missing(two) == "2 seeds"


def test_unfinished_lists_runs_cut_by_max_steps_above_the_threshold():
    frame = rows(
        ("linear", 80, 1, 0.3, "max_steps"), ("linear", 80, 2, 0.2, "max_steps"),  # one cell, named once
        ("dpfp:nu=1", 40, 1, 0.05, "max_steps"),
        ("dpfp:nu=1", 20, 1, 0.01, "max_steps"),   # at the threshold: it retrieves
        ("softmax", 20, 1, 0.5, "converged"),      # finished, however high
        ("softmax", 40, 1, 1e-3, "max_steps"),     # cut, but already retrieving
    )
    assert unfinished(frame) == "3 of 6 runs stopped at max_steps still above 0.01 (linear S=80, dpfp:nu=1 S=40)"
    assert unfinished(frame, threshold=0.1) == "2 of 6 runs stopped at max_steps still above 0.1 (linear S=80)"
    assert unfinished(frame.drop(columns="status")) == ""
    assert unfinished(rows()) == ""
    assert unfinished(frame[frame["status"] == "converged"]) == ""


def test_s_range_and_variants_missing():
    frame = rows(("softmax", 80, 1, 1e-3, "converged"), ("softmax", 160, 1, 1e-3, "converged"),
                 ("linear", 500, 1, 0.3, "converged"))
    assert s_range_missing(frame, "softmax", 500) == "softmax S ≤ 160 of 500"
    assert s_range_missing(frame, "softmax", 160) == ""
    assert s_range_missing(frame, "dpfp:nu=3", 80) == "dpfp:nu=3 not run"
    assert s_range_missing(rows(), "softmax", 80) == "softmax not run"
    assert variants_missing(frame, ["softmax", "linear"]) == ""
    assert variants_missing(frame, ["dpfp:nu=3", "softmax", "favor:m=64"]) == "dpfp:nu=3, favor:m=64 not run"
    assert variants_missing(rows(), ["linear"]) == "linear not run"


def test_a_frame_without_records_or_columns_lacks_everything():
    """An empty records frame may have no columns at all (no runs.jsonl line yet)."""
    nothing = pd.DataFrame()
    assert variants_missing(nothing, ["linear", "softmax"]) == "linear, softmax not run"
    assert s_range_missing(nothing, "softmax", 80) == "softmax not run"
    assert seeds_missing(nothing) == "" and unfinished(nothing) == ""


def test_retrieval_gaps_are_the_seed_and_finish_parts():
    frame = rows(("linear", 80, 1, 0.3, "max_steps"))
    assert retrieval_gaps(frame) == ["1 seed", "1 of 1 runs stopped at max_steps still above 0.01 (linear S=80)"]
    assert retrieval_gaps(frame, threshold=0.5) == ["1 seed", ""]


def test_a_cell_loss_leaves_diverged_runs_out_and_counts_them():
    frame = rows(("linear", 20, 1, 0.1, "converged"), ("linear", 20, 2, 0.4, "converged"),
                 ("linear", 20, 3, 1e-6, "diverged"), ("linear", 20, 4, 0.2, "diverged"),
                 ("linear", 20, 5, 0.3, "max_steps"))
    interval, diverged = cell_loss(frame)
    expected = log_interval([0.1, 0.4, 0.3])
    assert diverged == 2 and interval.n == 3
    assert (interval.mean, interval.low, interval.high) == pytest.approx((expected.mean, expected.low, expected.high))
    no_status = frame.drop(columns="status")
    interval, diverged = cell_loss(no_status)
    assert diverged == 0 and interval.n == 5


def test_describe_cell_adds_the_diverged_count():
    interval = Interval(0.0031, 0.0012, 0.0079, 3)
    assert describe_cell(interval, 0) == "0.0031 [0.0012, 0.0079]"
    assert describe_cell(interval, 2) == "0.0031 [0.0012, 0.0079], 2 diverged"


def point(value):
    return Interval(value, math.nan, math.nan, 1)


def test_certainly_lower_needs_intervals_apart():
    a, b = Interval(1.0, 0.5, 2.0, 3), Interval(4.0, 3.0, 5.0, 3)
    assert certainly_lower(a, b) is True and certainly_lower(b, a) is False
    touching = Interval(3.0, 2.0, 3.0, 3)  # its top equals b's bottom: not apart
    assert certainly_lower(touching, b) is None and certainly_lower(b, touching) is None
    assert certainly_lower(point(2.5), b) is True and certainly_lower(point(3.5), b) is None
    assert certainly_lower(b, point(2.5)) is False
    empty = Interval(math.nan, math.nan, math.nan, 0)
    assert certainly_lower(empty, b) is None and certainly_lower(a, empty) is None


def test_certainly_below_a_threshold():
    assert certainly_below(Interval(0.005, 0.002, 0.01, 3), 0.01) is True     # top at the threshold
    assert certainly_below(Interval(0.05, 0.01, 0.1, 3), 0.01) is None        # bottom at the threshold
    assert certainly_below(Interval(0.05, 0.011, 0.1, 3), 0.01) is False
    assert certainly_below(Interval(0.005, 0.001, 0.02, 3), 0.01) is None
    assert certainly_below(point(0.01), 0.01) is True and certainly_below(point(0.02), 0.01) is False
    assert certainly_below(Interval(math.nan, math.nan, math.nan, 0), 0.01) is None
