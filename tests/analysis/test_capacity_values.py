"""Capacities to the digit: per-seed estimates with their skipped blips and S grids, the seed
aggregate, comparisons at the edges of an interval and of a grid bracket, the words and the CSV.
Hand-made curves whose crossings are known (log-midway between two grid points: ln 10 / ln 100)."""

from __future__ import annotations

import csv
import math

import pandas as pd
import pytest

from fwbench.analysis.capacity import (
    CAPACITY_COLUMNS,
    SEED_COLUMNS,
    CapacityEstimate,
    capacity_estimates,
    capacity_intervals,
    describe,
    grid_bracket,
    measured_loss,
    retrieval_rows,
    seed_capacities,
    summary_capacity,
    write_capacity_csv,
)

T_975_DF1 = 12.70620474  # t_{0.975, 1}, from a printed table


def curve_rows(*curves, d_key=64, d_dot=128):
    """(variant, seed, {S: loss}, status per S or None) as records-frame rows."""
    out = []
    for variant, seed, losses, *status in curves:
        for S, loss in losses.items():
            state = status[0].get(S, "converged") if status else "converged"
            out.append({"variant": variant, "d_key": d_key, "d_dot": d_dot, "S": S, "seed": seed,
                        "best_eval_loss": loss, "status": state})
    return pd.DataFrame(out)


# seed 1 fails once at S=40 (a blip) and crosses 0.01 log-midway between 60 and 80: 70;
# seed 2 fails once at S=100 and crosses midway between 120 and 140: 130. Given seed 2 first.
TWO_SEEDS = curve_rows(
    ("linear", 2, {20: 1e-3, 100: 0.5, 120: 1e-3, 140: 0.1}),
    ("linear", 1, {20: 1e-3, 40: 0.5, 60: 1e-3, 80: 0.1}),
)


def test_each_seed_has_its_crossing_blips_and_grid():
    per_seed = seed_capacities(TWO_SEEDS)
    assert list(per_seed.columns) == SEED_COLUMNS
    one, two = per_seed.set_index("seed").loc[1], per_seed.set_index("seed").loc[2]
    assert one["capacity"] == pytest.approx(70.0) and two["capacity"] == pytest.approx(130.0)
    assert (one["grid_low"], one["grid_high"], two["grid_low"], two["grid_high"]) == (60, 80, 120, 140)
    assert (one["ignored_S"], two["ignored_S"]) == ("40", "100")
    assert (one["S_grid"], two["S_grid"]) == ("20 40 60 80", "20 100 120 140")
    assert not one["lower_bound_only"] and not one["upper_bound_only"] and one["n_diverged"] == 0


def test_seed_capacities_take_the_threshold():
    """At threshold 0.2 only the blips fail (0.5): every S passes, a lower bound at the last S."""
    per_seed = seed_capacities(TWO_SEEDS, threshold=0.2).set_index("seed")
    assert list(per_seed["capacity"]) == [80.0, 140.0] and per_seed["lower_bound_only"].all()


def test_seed_capacities_of_an_old_frame_without_key_size_or_status():
    frame = TWO_SEEDS.drop(columns=["d_key", "d_dot", "status"])
    per_seed = seed_capacities(frame)
    assert len(per_seed) == 2 and per_seed["d_key"].isna().all() and per_seed["d_dot"].isna().all()
    assert (per_seed["n_diverged"] == 0).all()
    assert list(seed_capacities(frame.iloc[0:0]).columns) == SEED_COLUMNS


def test_a_diverged_run_is_counted_per_seed():
    frame = curve_rows(("linear", 1, {20: 1e-3, 40: 1e-4, 60: 0.1}, {40: "diverged"}))
    row = seed_capacities(frame).iloc[0]
    assert row["n_diverged"] == 1
    # left out of the curve: the crossing lies between 20 and 60 (log-midway: 40)
    assert row["capacity"] == pytest.approx(40.0) and (row["grid_low"], row["grid_high"]) == (20, 60)


def test_the_diverged_runs_of_a_seed_with_no_capacity_are_counted():
    """A seed whose every run diverged has no capacity and no place in the mean, but its runs are still
    counted as diverged (the count used to sum only the seeds with a capacity: 0, and no note)."""
    frame = curve_rows(("linear", 1, {20: 1e-3, 40: 0.1}),
                       ("linear", 2, {20: 1e-3, 40: 0.1}, {20: "diverged", 40: "diverged"}))
    row = capacity_intervals(frame).iloc[0]
    assert (row["n_seeds"], row["per_seed"], row["n_diverged"]) == (1, "30", 2)
    assert describe(row) == "≈ 30 (1 seed; grid 20–40) (2 diverged run(s) left out)"


def test_the_seed_aggregate_of_two_seeds():
    """Capacities 70 and 130: mean 100, s/√2 = 30, half-width t_{0.975,1} · 30 = 381, cut to the
    brackets: seed 1 lies in [60, 80] and seed 2 in [120, 140], so their mean lies in [90, 110]."""
    row = capacity_intervals(TWO_SEEDS).iloc[0]
    assert list(capacity_intervals(TWO_SEEDS).columns) == [c for c in CAPACITY_COLUMNS if c != "setting"]
    assert (row["capacity_mean"], row["n_seeds"], row["bound"]) == (pytest.approx(100.0), 2, "")
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((90.0, 110.0))
    assert (row["grid_low"], row["grid_high"]) == (60, 140)
    assert row["per_seed"] == "70 130"                 # in seed order
    assert row["ignored_S"] == "40 100"                # in numeric order, not text order
    assert row["S_grid"] == "20 40 60 80"              # the first seed's grid
    assert row["threshold"] == 0.01 and row["n_diverged"] == 0
    assert row["capacity_over_d_dot"] == pytest.approx(100 / 128)
    assert describe(row) == "≈ 100 [90, 110] (2 seeds) (one-point blip skipped at S=40 100)"


# Two seeds bracketed only by S=20 and S=200: crossings 110 (log-midway) and 80 (a third of the way).
WIDE_BRACKETS = curve_rows(("linear", 1, {20: 1e-3, 200: 0.1}), ("linear", 2, {20: 1e-3, 200: 1.0}))


def test_capacity_intervals_take_the_threshold_and_confidence():
    row = capacity_intervals(TWO_SEEDS, threshold=0.2).iloc[0]
    assert (row["capacity_mean"], row["bound"], row["threshold"]) == (110.0, "≥", 0.2)
    narrow = capacity_intervals(WIDE_BRACKETS, confidence=0.5).iloc[0]  # t_{0.75,1} = 1, s/√2 = 15
    assert (narrow["capacity_mean"], narrow["ci_low"], narrow["ci_high"]) == pytest.approx((95, 80, 110))
    wide = capacity_intervals(WIDE_BRACKETS).iloc[0]  # 95 ± 12.7 · 15 = [−96, 286]: cut to the brackets
    assert (wide["ci_low"], wide["ci_high"]) == pytest.approx((20, 200))


def test_a_censored_capacity_keeps_its_t_interval():
    """Only fully bracketed seeds cut the interval: with an open end (≥) the grid does not bound the mean."""
    censored = curve_rows(("linear", 1, {20: 1e-3, 200: 0.1}), ("linear", 2, {20: 1e-3, 200: 1e-3}))
    row = capacity_intervals(censored).iloc[0]
    assert row["bound"] == "≥" and row["ci_high"] > 200 and row["ci_low"] < 20


def test_a_lower_bound_wins_over_an_upper_bound_and_d_dot_may_be_missing():
    frame = curve_rows(("linear", 1, {20: 1e-3, 40: 1e-3}), ("linear", 2, {20: 0.5}), d_dot=math.nan)
    row = capacity_intervals(frame).iloc[0]
    assert row["bound"] == "≥" and math.isnan(row["capacity_over_d_dot"])
    only_upper = capacity_intervals(curve_rows(("linear", 2, {20: 0.5}), d_dot=0)).iloc[0]
    assert only_upper["bound"] == "<" and math.isnan(only_upper["capacity_over_d_dot"])


def test_a_row_becomes_an_estimate_with_open_ends_where_censored():
    row = pd.Series({"capacity_mean": 55.0, "ci_low": 40.0, "ci_high": 70.0, "bound": "", "grid_low": 50.0,
                     "grid_high": 60.0, "n_seeds": 3})
    assert CapacityEstimate.from_row(row) == CapacityEstimate(55.0, 40.0, 70.0, 50.0, 60.0, 3, "")
    point = CapacityEstimate.from_row(row.copy().replace({40.0: math.nan, 70.0: math.nan}))
    assert (point.low, point.high) == (55.0, 55.0)
    lower = CapacityEstimate.from_row(pd.concat([row.drop("bound"), pd.Series({"bound": "≥"})]))
    assert (lower.low, lower.high, lower.bound) == (40.0, math.inf, "≥")
    upper = CapacityEstimate.from_row(pd.concat([row.drop("bound"), pd.Series({"bound": "<"})]))
    assert (upper.low, upper.high, upper.bound) == (0.0, 70.0, "<")
    summary = summary_capacity(pd.concat([row.drop("bound"), pd.Series({"bound": "<"})]))
    assert summary.upper_bound_only and not summary.lower_bound_only
    assert (summary.value, summary.grid_low, summary.grid_high) == (55.0, 50.0, 60.0)
    assert not summary_capacity(row).upper_bound_only and not summary_capacity(row).lower_bound_only


def test_at_most_and_at_least_at_the_edges_of_interval_and_grid():
    e = CapacityEstimate(55, 40, 70, grid_low=50, grid_high=60, n_seeds=3)
    assert e.at_most(70) is True and e.at_most(69) is None and e.at_most(40) is None and e.at_most(39) is False
    assert CapacityEstimate(55, 40, 70, 50, 80, 3).at_most(75) is None      # grid not yet failed at 75
    assert CapacityEstimate(55, 45, 70, 40, 60, 3).at_most(42) is None      # grid has not retrieved at 42
    assert CapacityEstimate(55, 45, 70, 40, 60, 3).at_most(40) is False
    assert e.at_least(40) is True and e.at_least(41) is None and e.at_least(70) is None and e.at_least(71) is False
    assert CapacityEstimate(55, 50, 70, 45, 60, 3).at_least(48) is None     # grid has not retrieved at 48
    assert CapacityEstimate(50, 40, 55, 45, 60, 3).at_least(60) is False
    assert CapacityEstimate(50, 40, 55, 45, 60, 3).at_least(58) is None     # grid not yet failed at 58
    assert e.ratio_interval(10) == (4.0, 7.0)
    at_the_grid_point = CapacityEstimate(55, 50, 60, grid_low=50, grid_high=60, n_seeds=3)
    assert at_the_grid_point.at_most(60) is True and at_the_grid_point.at_least(50) is True


def test_above_needs_intervals_strictly_apart():
    low = CapacityEstimate(100, 95, 105, grid_low=80, grid_high=120, n_seeds=3)
    touching = CapacityEstimate(130, 105, 135, grid_low=120, grid_high=140, n_seeds=3)
    assert touching.above(low) is None and low.above(touching) is None


def test_capacity_estimates_map_each_variant_to_its_estimate_and_words():
    estimates = capacity_estimates(TWO_SEEDS)
    estimate, words = estimates["linear"]
    assert list(estimates) == ["linear"]
    assert estimate.value == pytest.approx(100.0) and (estimate.grid_low, estimate.grid_high, estimate.n_seeds) == (60, 140, 2)
    assert words == describe(capacity_intervals(TWO_SEEDS).iloc[0])


@pytest.mark.parametrize("fields, text", [
    ({"capacity_mean": math.nan}, "n/a"),
    ({"bound": "<", "capacity_mean": 20.0}, "< 20 (1 seed)"),
    ({"bound": "≥", "n_seeds": 2}, "≥ 36 (2 seeds)"),
    ({"n_diverged": 2, "ignored_S": "100"},
     "≈ 36 (1 seed; grid 20–60) (one-point blip skipped at S=100; 2 diverged run(s) left out)"),
    ({"grid_high": math.inf}, "≈ 36 (1 seed)"),
])
def test_describe_words(fields, text):
    row = {"capacity_mean": 36.2, "ci_low": math.nan, "ci_high": math.nan, "bound": "", "n_seeds": 1,
           "grid_low": 20.0, "grid_high": 60.0, "ignored_S": "", "n_diverged": 0}
    assert describe(pd.Series({**row, **fields})) == text


def test_describe_a_row_without_a_grid_bracket():
    assert describe(pd.Series({"capacity_mean": 36.2, "ci_low": math.nan, "bound": "", "n_seeds": 1})) == "≈ 36 (1 seed)"


def test_measured_loss_and_grid_bracket():
    frame = pd.DataFrame({"best_eval_loss": ["0.5", "0.25"], "status": ["converged", "diverged"]})
    loss = measured_loss(frame)
    assert loss.iloc[0] == 0.5 and math.isnan(loss.iloc[1])
    assert list(measured_loss(frame.drop(columns="status"))) == [0.5, 0.25]
    assert grid_bracket([20, 40], [1e-3, 0.1]) == (20, 40)
    assert grid_bracket([20, 40], [1e-3, 1e-3]) == (40, math.inf)
    assert grid_bracket([20, 40], [1e-3, 0.05], threshold=0.1) == (40, math.inf)
    assert grid_bracket([], []) == (0.0, math.inf) and grid_bracket([20], [math.nan]) == (0.0, math.inf)


def test_retrieval_rows_select_one_setting_of_the_retrieval_task():
    frame = pd.DataFrame({"task": ["retrieval", "retrieval", "mqar"], "setting": [1, 2, 1], "S": [20, 40, 60]})
    assert list(retrieval_rows(frame, 1)["S"]) == [20] and list(retrieval_rows(frame, 2)["S"]) == [40]
    assert retrieval_rows(frame.drop(columns="setting"), 1).empty
    assert list(retrieval_rows(frame.drop(columns="setting"), 1).columns) == ["task", "S"]
    assert retrieval_rows(frame.iloc[0:0], 1).empty


def test_the_capacity_csv_has_every_column_and_empty_cells_for_infinity(tmp_path):
    table = capacity_intervals(curve_rows(("linear", 1, {20: 1e-3, 40: 1e-3}), ("softmax", 1, {20: 1e-3, 40: 0.1})))
    path = write_capacity_csv(table, tmp_path / "new" / "capacity.csv")
    assert path == tmp_path / "new" / "capacity.csv"
    with open(path, newline="") as handle:
        lines = list(csv.DictReader(handle))
    assert list(lines[0]) == CAPACITY_COLUMNS  # in order, and no index column
    linear, softmax = lines
    assert (linear["variant"], linear["grid_high"], linear["bound"], linear["setting"]) == ("linear", "", "≥", "")
    assert softmax["capacity_mean"] == f"{20 + 20 * math.log(10) / math.log(100):.4g}" == "30"
