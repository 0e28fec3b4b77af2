"""Seed statistics to the digit: the printed form of an interval, the confidence level and the
dropping of missing values, the log-space intervals per group. Written against the survivors of a
mutation pass (docs/mutation.md): each assertion pins a value a planted fault would change."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fwbench.analysis.statistics import LOG_FLOOR, Interval, log_interval, log_mean_ci, mean_ci, t_interval

# Quantiles of Student's t distribution, from a printed table.
T_95_DF4 = 2.131846786   # t_{0.95, 4}: the two-sided 90 % interval with 5 values
T_90_DF2 = 1.885618083   # t_{0.90, 2}: the two-sided 80 % interval with 3 values
T_975_DF1 = 12.70620474  # t_{0.975, 1}: the two-sided 95 % interval with 2 values


@pytest.mark.parametrize("interval, text", [
    (Interval(0.0031, 0.0012, 0.0079, 3), "0.0031 [0.0012, 0.0079]"),   # below 1: 3 significant digits
    (Interval(12.3456, 1.23456, 123.456, 3), "12.35 [1.235, 123.5]"),  # from 1 on: 4 significant digits
    (Interval(0.001, 0.0005, 1e4, 3), "0.001 [5.00e-04, 1.00e+04]"),  # 1e-3 is plain, 1e4 and 5e-4 are not
    (Interval(9999.0, -0.5, 0.0, 2), "9999 [-0.5, 0]"),                # a negative bound; zero is plain
    (Interval(0.25, math.nan, math.nan, 1), "0.25 (1 seed)"),
    (Interval(0.25, math.nan, math.nan, 2), "0.25 (1 seed)"),          # no interval whatever n says
    (Interval(math.nan, math.nan, math.nan, 0), "n/a"),
    (Interval(0.5, 0.4, 0.6, 0), "n/a"),                               # n = 0 wins over the numbers
    (Interval(math.nan, 0.4, 0.6, 3), "n/a"),
])
def test_an_interval_prints_its_mean_and_bounds(interval, text):
    assert str(interval) == text


def test_half_width_is_half_the_interval():
    assert Interval(3.0, 1.0, 7.0, 2).half_width == 3.0


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5])
def test_a_confidence_outside_the_open_unit_interval_is_refused(confidence):
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1.0, 2.0], confidence=confidence)


def test_the_confidence_level_sets_the_quantile_and_is_recorded():
    """x = 1..5 at 90 %: half-width t_{0.95,4} · √0.5 = 1.507443."""
    interval = t_interval([1, 2, 3, 4, 5], confidence=0.9)
    half = T_95_DF4 * math.sqrt(0.5)
    assert (interval.low, interval.high) == pytest.approx((3 - half, 3 + half), abs=1e-6)
    assert interval.confidence == 0.9
    for values in ([], [0.5], [2.0, 2.0]):  # the no-interval, one-seed and zero-spread paths keep it too
        assert t_interval(values, confidence=0.9).confidence == 0.9


def test_two_values_use_one_degree_of_freedom():
    """[1, 3]: mean 2, s = √2, s/√2 = 1, half-width t_{0.975,1} = 12.706."""
    interval = t_interval([1.0, 3.0])
    assert (interval.mean, interval.n) == (2.0, 2)
    assert (interval.low, interval.high) == pytest.approx((2 - T_975_DF1, 2 + T_975_DF1), abs=1e-6)


def test_missing_values_are_dropped_and_a_constant_sample_is_a_point():
    interval = t_interval([None, 2.0, math.nan, 4.0])
    assert (interval.n, interval.mean) == (2, 3.0)
    constant = t_interval([2.0, 2.0, 2.0])
    assert (constant.mean, constant.low, constant.high, constant.n) == (2.0, 2.0, 2.0, 3)
    one = t_interval([0.25])
    assert (one.mean, one.n) == (0.25, 1) and math.isnan(one.high)
    empty = t_interval([None, math.nan])
    assert empty.n == 0 and math.isnan(empty.mean) and math.isnan(empty.low) and math.isnan(empty.high)


def test_log_interval_at_another_confidence():
    """[0.1, 0.2, 0.4]: logs ln 0.2 ± ln 2, s = ln 2; 80 % bounds 0.2 · exp(±t_{0.90,2} · ln 2 / √3)."""
    interval = log_interval([0.1, 0.2, 0.4], confidence=0.8)
    half = T_90_DF2 * math.log(2) / math.sqrt(3)
    assert interval.mean == pytest.approx(0.2)
    assert (interval.low, interval.high) == pytest.approx((0.2 * math.exp(-half), 0.2 * math.exp(half)))
    assert (interval.n, interval.confidence) == (3, 0.8)


def test_log_interval_floors_non_positive_values_and_drops_unmeasured_ones():
    floored = log_interval([0.0, -1.0])
    assert floored.mean == pytest.approx(LOG_FLOOR) and floored.n == 2
    assert (floored.low, floored.high) == pytest.approx((LOG_FLOOR, LOG_FLOOR))
    assert log_interval([None, math.nan, -math.inf, math.inf, 0.5]).n == 1
    one = log_interval([0.5])
    assert one.mean == pytest.approx(0.5) and math.isnan(one.low) and math.isnan(one.high)
    two = log_interval([0.1, 0.1 * math.e ** 2])  # logs ln 0.1 + {0, 2}: mean ln 0.1 + 1, s/√2 = 1
    assert two.mean == pytest.approx(0.1 * math.e)
    assert (two.low, two.high) == pytest.approx((0.1 * math.e ** (1 - T_975_DF1), 0.1 * math.e ** (1 + T_975_DF1)))
    empty = log_interval([], confidence=0.9)
    assert empty.n == 0 and math.isnan(empty.mean) and empty.confidence == 0.9


def test_mean_ci_of_an_empty_frame_has_the_columns_and_no_rows():
    out = mean_ci(pd.DataFrame(), ["variant"], "loss")
    assert list(out.columns) == ["variant", "mean", "std", "n", "ci_low", "ci_high"] and out.empty


def test_mean_ci_keeps_a_group_without_a_key_and_reports_std_and_n():
    frame = pd.DataFrame({"variant": ["a", "a", "a", None, None], "d": [1, 1, 1, 1, 1],
                          "loss": [0.1, 0.2, 0.3, 1.0, math.nan]})
    out = mean_ci(frame, ["variant", "d"], "loss", confidence=0.8)
    assert list(out.columns) == ["variant", "d", "mean", "std", "n", "ci_low", "ci_high"]
    assert len(out) == 2  # the group whose variant is missing is kept
    a = out[out["variant"] == "a"].iloc[0]
    half = T_90_DF2 * 0.1 / math.sqrt(3)
    assert (a["mean"], a["std"], a["n"]) == pytest.approx((0.2, 0.1, 3))
    assert (a["ci_low"], a["ci_high"]) == pytest.approx((0.2 - half, 0.2 + half))
    missing = out[out["variant"].isna()].iloc[0]
    assert (missing["mean"], missing["n"]) == (1.0, 1) and math.isnan(missing["ci_low"])


def test_log_mean_ci_is_log_interval_per_group():
    frame = pd.DataFrame({"variant": ["a"] * 4 + ["b"] * 3,
                          "loss": [0.0005, 0.0008, 0.3, math.inf, 0.0, 0.01, math.nan]})
    out = log_mean_ci(frame, ["variant"], "loss", confidence=0.9).set_index("variant")
    for variant, values in (("a", [0.0005, 0.0008, 0.3]), ("b", [0.0, 0.01])):
        expected = log_interval(values, confidence=0.9)
        row = out.loc[variant]
        assert row["n"] == expected.n
        assert (row["mean"], row["ci_low"], row["ci_high"]) == pytest.approx((expected.mean, expected.low, expected.high))
        assert math.isnan(row["std"])
    assert frame["loss"].iloc[3] == math.inf  # the caller's frame is not modified
