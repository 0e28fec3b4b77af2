"""Seed statistics, per-seed capacities with intervals and the grid's profile blocks, on hand-made data
whose answers are known. The claims' criteria are tested in test_claims_criteria.py and on the paper's
own logs in test_claims_official_logs.py."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fwbench.analysis.capacity import capacity_intervals, describe, seed_capacities, summary_capacity
from fwbench.analysis.records import estimate_capacity
from fwbench.analysis.statistics import log_interval, mean_ci, t_interval
from fwbench.run.grid import expand, load_grid

# t_{0.975, 4} and t_{0.975, 2}, from a printed table of Student's t distribution.
T_975_DF4 = 2.776445105
T_975_DF2 = 4.302652730


def test_t_interval_matches_a_hand_computed_interval():
    """x = 1..5: mean 3, s = √2.5, s/√5 = √0.5; half-width = 2.776445 · 0.707107 = 1.963243."""
    interval = t_interval([1, 2, 3, 4, 5])
    half = T_975_DF4 * math.sqrt(2.5) / math.sqrt(5)
    assert interval.n == 5 and interval.mean == pytest.approx(3.0)
    assert interval.low == pytest.approx(3 - half, abs=1e-6) and interval.high == pytest.approx(3 + half, abs=1e-6)
    assert half == pytest.approx(1.963243, abs=1e-6)


def test_t_interval_edge_cases():
    one = t_interval([0.25])
    assert one.n == 1 and one.mean == 0.25 and math.isnan(one.low) and "1 seed" in str(one)
    constant = t_interval([2.0, 2.0, 2.0])
    assert (constant.low, constant.high) == (2.0, 2.0)
    assert t_interval([math.nan, 1.0, 3.0]).n == 2
    assert t_interval([]).n == 0 and str(t_interval([])) == "n/a"
    with pytest.raises(ValueError, match="confidence"):
        t_interval([1, 2], confidence=1.5)


def test_mean_ci_groups_with_pandas_and_matches_t_interval():
    frame = pd.DataFrame({"variant": ["a"] * 3 + ["b"] * 2 + ["c"], "loss": [0.1, 0.2, 0.3, 1.0, 3.0, 7.0]})
    out = mean_ci(frame, ["variant"], "loss").set_index("variant")
    half_a = T_975_DF2 * 0.1 / math.sqrt(3)  # s = 0.1 for 0.1, 0.2, 0.3
    assert out.loc["a", "mean"] == pytest.approx(0.2) and out.loc["a", "n"] == 3
    assert (out.loc["a", "ci_low"], out.loc["a", "ci_high"]) == pytest.approx((0.2 - half_a, 0.2 + half_a))
    b = t_interval([1.0, 3.0])
    assert (out.loc["b", "ci_low"], out.loc["b", "ci_high"]) == pytest.approx((b.low, b.high))
    assert math.isnan(out.loc["c", "ci_low"]) and out.loc["c", "n"] == 1


def retrieval_rows(rows, setting=1, d_key=64):
    """Records-frame rows: (variant, d_dot, S, seed, best loss[, status, diverged_at])."""
    out = []
    for row in rows:
        variant, d_dot, S, seed, loss, *rest = row
        status = rest[0] if rest else "converged"
        out.append({"task": "retrieval", "setting": setting, "variant": variant, "d_key": d_key, "d_dot": d_dot,
                    "S": S, "seed": seed, "best_eval_loss": loss, "status": status,
                    "diverged_at": rest[1] if len(rest) > 1 else None})
    return pd.DataFrame(out)


def test_capacity_is_estimated_per_seed_then_given_a_t_interval():
    """Seed 1 crosses 0.01 log-midway between 40 (1e-3) and 60 (1e-1): 50; seed 2 between 40 and 80: 60;
    seed 3 at 55 (between 50 and 60). Mean 55, s = 5, half-width t_{0.975,2} · 5/√3 = 12.4, cut to the
    mean of the brackets [40, 60], [40, 80], [50, 60]: [43.3, 66.7]."""
    frame = retrieval_rows([
        ("dpfp:nu=1", 128, 40, 1, 1e-3), ("dpfp:nu=1", 128, 60, 1, 1e-1),
        ("dpfp:nu=1", 128, 40, 2, 1e-3), ("dpfp:nu=1", 128, 80, 2, 1e-1),
        ("dpfp:nu=1", 128, 50, 3, 1e-3), ("dpfp:nu=1", 128, 60, 3, 1e-1),
    ])
    per_seed = seed_capacities(frame).set_index("seed")["capacity"]
    assert list(per_seed) == pytest.approx([50.0, 60.0, 55.0])
    row = capacity_intervals(frame).iloc[0]
    half = T_975_DF2 * 5 / math.sqrt(3)
    assert row["capacity_mean"] == pytest.approx(55.0) and row["n_seeds"] == 3 and row["bound"] == ""
    assert 55 - half < 130 / 3 and (row["ci_low"], row["ci_high"]) == pytest.approx((130 / 3, 200 / 3))
    assert row["capacity_over_d_dot"] == pytest.approx(55 / 128)
    assert describe(row).startswith("≈ 55 [")


def test_capacity_censoring_and_the_divergence_policy():
    """Changed on purpose (issue 13): a diverged run used to count as a failure (+inf); it is now neither
    a pass nor a measured loss, left out of the curve and counted."""
    frame = retrieval_rows([
        ("dpfp:nu=2", 256, 20, 1, 1e-4), ("dpfp:nu=2", 256, 80, 1, 1e-3),  # passes every S: ≥ 80
        ("linear", 64, 20, 1, 0.3),  # fails the smallest S: < 20
        ("favor:m=64", 128, 20, 1, 1e-3), ("favor:m=64", 128, 40, 1, 0.002, "diverged", 12),
        ("favor:m=64", 128, 60, 1, 0.3),
    ])
    table = capacity_intervals(frame).set_index("variant")
    assert table.loc["dpfp:nu=2", "bound"] == "≥" and summary_capacity(table.loc["dpfp:nu=2"]).lower_bound_only
    assert table.loc["linear", "bound"] == "<"
    # the diverged run at S=40 is left out (its pre-divergence loss 0.002 is not a pass either): the
    # crossing lies between 20 and 60
    favor = table.loc["favor:m=64"]
    assert favor["bound"] == "" and (favor["grid_low"], favor["grid_high"]) == (20, 60)
    assert favor["n_diverged"] == 1
    assert describe(table.loc["dpfp:nu=2"]) == "≥ 80 (1 seed)"
    assert describe(favor).startswith("≈ 36 (1 seed; grid 20–60)")  # log-interpolated: 20 + 40·ln 10 / ln 300
    assert "1 diverged run(s) left out" in describe(favor)
    assert (table.loc["dpfp:nu=2", "grid_low"], table.loc["dpfp:nu=2", "grid_high"]) == (80, math.inf)
    assert (table.loc["linear", "grid_low"], table.loc["linear", "grid_high"]) == (0, 20)
    # the per-seed column marks a seed's bound (it read "80" and "20", as measured capacities)
    assert (table.loc["dpfp:nu=2", "per_seed"], table.loc["linear", "per_seed"]) == ("≥80", "<20")
    assert favor["per_seed"] == "36"


def test_one_bad_point_does_not_cap_a_capacity():
    """The official DPFP ν=2 delta run of Setting 2 fails at S=100 only (0.0854) and holds to S=200."""
    S = [20, 40, 60, 80, 100, 120, 140, 160, 180, 200]
    loss = [9.7e-4, 5.3e-4, 4.9e-4, 8.1e-4, 0.0854, 7.3e-4, 2.9e-4, 4.0e-4, 4.0e-4, 8.4e-4]
    capacity = estimate_capacity(S, loss)
    assert capacity.lower_bound_only and capacity.value == 200 and capacity.ignored == (100.0,)
    # two failures in a row are a real crossing; a failure at the last S counts too
    assert estimate_capacity([20, 40, 60, 80], [1e-3, 0.1, 0.2, 1e-3]).grid_high == 40
    assert estimate_capacity([20, 40, 60], [1e-3, 1e-3, 0.1]).grid_high == 60


def test_log_interval_stays_in_range():
    """[0.0005, 0.0008, 0.3]: the plain t-interval reaches below zero; the log-space one cannot."""
    values = [0.0005, 0.0008, 0.3]
    assert t_interval(values).low < 0
    interval = log_interval(values)
    logs = [math.log(v) for v in values]
    mean = sum(logs) / 3
    s = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert interval.mean == pytest.approx(math.exp(mean))
    assert interval.low == pytest.approx(math.exp(mean - T_975_DF2 * s / math.sqrt(3)))
    assert interval.high == pytest.approx(math.exp(mean + T_975_DF2 * s / math.sqrt(3)))
    assert 0 < interval.low < min(values) and interval.high > max(values)
    assert log_interval([math.inf, 0.1]).n == 1  # a diverged run's loss is not a measurement


def test_grid_bracket_is_the_widest_pair_of_grid_points_around_the_crossing_over_seeds():
    frame = retrieval_rows([
        ("dpfp:nu=1", 128, 40, 1, 1e-3), ("dpfp:nu=1", 128, 60, 1, 1e-1), ("dpfp:nu=1", 128, 80, 1, 0.2),
        ("dpfp:nu=1", 128, 20, 2, 1e-3), ("dpfp:nu=1", 128, 40, 2, 1e-1),
    ])
    row = capacity_intervals(frame).iloc[0]
    assert (row["grid_low"], row["grid_high"]) == (20, 60)


# --------------------------------------------------------------------------------------------
# Grid profiles made of blocks.
# --------------------------------------------------------------------------------------------


def test_profile_blocks_expand_to_the_union_of_their_products(tmp_path):
    path = tmp_path / "blocks.toml"
    path.write_text(
        'task = "retrieval"\n[defaults]\nsetting = 2\nd_key = 8\n'
        '[[profiles.quick]]\nvariant = ["linear", "dpfp:nu=1"]\nS = [4, 6]\nseed = 1\n'
        '[[profiles.quick]]\nvariant = "linear"\nS = [6, 8]\nseed = 1\nmax_steps = 7\n'
    )
    specs = expand(load_grid(path), "quick")
    cells = [(s.variant, s.config["S"], s.config["max_steps"]) for s in specs]
    # 4 + 2 cells; ("linear", 6) appears in both blocks with different max_steps, so both are kept
    assert len(cells) == 6 and ("linear", 8, 7) in cells
    assert ("linear", 6, 7) in cells and ("linear", 6, 100000) in cells
    assert len({s.run_id for s in specs}) == 6


def test_bad_profile_block_names_the_block(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('task = "retrieval"\n[[profiles.quick]]\nvariant = "linear"\nseed = 1\n'
                    '[[profiles.quick]]\nvariant = "linear"\nseed = 1\nSS = 3\n')
    from fwbench.errors import FwbenchError
    with pytest.raises(FwbenchError, match="block 2: unknown key 'SS'"):
        load_grid(path)


@pytest.mark.parametrize("name", ["setting2", "capacity_nu", "mqar"])
def test_bundled_grids_expand_with_their_quick_and_full_profiles(name):
    grid = load_grid(name)
    quick, full = expand(grid, "quick"), expand(grid, "full")
    assert quick and len(full) > len(quick)
    assert {s.seed for s in full} >= {1, 2, 3}, "the full profile runs at least 3 seeds"


def test_records_frame_keeps_the_step_and_reason_of_a_divergence():
    from fwbench.analysis.records import records_frame

    record = {"run_id": "a", "task": "retrieval", "variant": {"spec": "favor-delta:m=64", "d_dot": 128}, "seed": 1,
              "status": "diverged", "diverged_at": 1100, "diverged_reason": "evaluation loss is nan", "steps": 1100,
              "wall_s": 1.0, "config": {"setting": 2, "S": 140}, "metrics": {"best_eval_loss": None}}
    row = records_frame([record]).iloc[0]
    assert row["diverged_at"] == 1100 and row["diverged_reason"] == "evaluation loss is nan"


def test_two_capacities_differ_only_when_intervals_are_apart_and_a_grid_point_separates_them():
    from fwbench.analysis.capacity import CapacityEstimate

    low = CapacityEstimate(100, 95, 105, grid_low=80, grid_high=120, n_seeds=3)
    apart_same_grid = CapacityEstimate(115, 112, 118, grid_low=100, grid_high=120, n_seeds=3)
    apart_and_separated = CapacityEstimate(130, 125, 135, grid_low=120, grid_high=140, n_seeds=3)
    overlapping = CapacityEstimate(130, 100, 160, grid_low=120, grid_high=140, n_seeds=3)
    assert apart_same_grid.above(low) is None  # intervals apart, but no S where one retrieves and the other not
    assert apart_and_separated.above(low) is True and low.above(apart_and_separated) is False
    assert overlapping.above(low) is None
    bound = CapacityEstimate(160, 160, math.inf, grid_low=160, grid_high=math.inf, n_seeds=1, bound="≥")
    assert bound.above(low) is True and bound.at_least(150) is True and bound.at_most(500) is None
