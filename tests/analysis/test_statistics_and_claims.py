"""Seed statistics, per-seed capacities with intervals, the grid's profile blocks, claims C3-C7 and
the new report sections, on hand-made data whose answers are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fwbench.analysis.capacity import capacity_intervals, describe, seed_capacities, summary_capacity
from fwbench.analysis.claims import (
    CLAIMS,
    FAIL,
    NOT_RUN,
    PASS,
    claim_delta_rule_needs_capacity,
    claim_dpfp_capacity_grows_with_nu,
    claim_favor_never_reaches_zero,
    claim_linear_fails_softmax_holds,
    claim_setting2_delta_beats_sum,
    claim_sum_rule_failure_scales_with_d_dot,
    claim_unnormalised_delta_rule_fails,
    evaluate_claims,
)
from fwbench.analysis.statistics import mean_ci, t_interval
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
    seed 3 at 55 (between 50 and 60). Mean 55, s = 5, half-width t_{0.975,2} · 5/√3."""
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
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((55 - half, 55 + half))
    assert row["capacity_over_d_dot"] == pytest.approx(55 / 128)
    assert describe(row).startswith("≈ 55 [")


def test_capacity_censoring_and_divergence_count_as_bounds_and_failures():
    frame = retrieval_rows([
        ("dpfp:nu=2", 256, 20, 1, 1e-4), ("dpfp:nu=2", 256, 80, 1, 1e-3),  # passes every S: ≥ 80
        ("linear", 64, 20, 1, 0.3),  # fails the smallest S: < 20
        ("favor:m=64", 128, 20, 1, 1e-3), ("favor:m=64", 128, 40, 1, math.nan, "diverged", 12),  # diverged: +inf
    ])
    table = capacity_intervals(frame).set_index("variant")
    assert table.loc["dpfp:nu=2", "bound"] == "≥" and summary_capacity(table.loc["dpfp:nu=2"]).lower_bound_only
    assert table.loc["linear", "bound"] == "<"
    # a diverged run fails with an infinite loss: the crossing is the last S that passed
    assert table.loc["favor:m=64", "bound"] == "" and table.loc["favor:m=64", "capacity_mean"] == 20
    assert describe(table.loc["dpfp:nu=2"]) == "≥ 80 (1 seed)"
    assert describe(table.loc["favor:m=64"]) == "≈ 20 (1 seed; grid 20–40)"
    assert (table.loc["dpfp:nu=2", "grid_low"], table.loc["dpfp:nu=2", "grid_high"]) == (80, math.inf)
    assert (table.loc["linear", "grid_low"], table.loc["linear", "grid_high"]) == (0, 20)


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


# --------------------------------------------------------------------------------------------
# Claims C3-C7.
# --------------------------------------------------------------------------------------------


def test_claims_table_lists_c1_to_c10_and_says_not_run_on_an_empty_store():
    results = evaluate_claims(pd.DataFrame())  # C1-C7 synthetic, C8-C10 language modelling
    assert [r.id for r in results] == [f"C{i}" for i in range(1, 11)] and len(CLAIMS) == 10
    assert all(r.verdict == NOT_RUN for r in results)
    assert all(r.paper for r in results), "every claim states the paper's figure"


def test_c3_passes_when_sum_rule_capacities_track_d_dot_and_fails_otherwise():
    tracks = retrieval_rows([
        ("linear", 64, 40, 1, 1e-3), ("linear", 64, 80, 1, 0.2),
        ("dpfp:nu=1", 128, 80, 1, 1e-3), ("dpfp:nu=1", 128, 160, 1, 0.2),
        ("dpfp:nu=2", 256, 80, 1, 1e-3), ("dpfp:nu=2", 256, 160, 1, 1e-3),  # ≥ 160: consistent
    ])
    assert claim_sum_rule_failure_scales_with_d_dot(tracks).verdict == PASS
    too_small = retrieval_rows([
        ("linear", 64, 10, 1, 1e-3), ("linear", 64, 20, 1, 0.2),  # capacity ≈ 15 < 64 / 2
        ("dpfp:nu=1", 128, 80, 1, 1e-3), ("dpfp:nu=1", 128, 160, 1, 0.2),
    ])
    result = claim_sum_rule_failure_scales_with_d_dot(too_small)
    assert result.verdict == FAIL and "linear" in result.measured.split("—")[-1]
    assert claim_sum_rule_failure_scales_with_d_dot(retrieval_rows([("softmax", None, 20, 1, 0.0)])).verdict == NOT_RUN


def test_c4_checks_favor_at_the_smallest_S():
    high = retrieval_rows([("favor:m=64", 128, 20, 1, 0.11), ("favor:m=64", 128, 20, 2, 0.09)])
    assert claim_favor_never_reaches_zero(high).verdict == PASS
    reaches = retrieval_rows([("favor:m=128", 256, 20, 1, 0.004)])
    assert claim_favor_never_reaches_zero(reaches).verdict == FAIL
    assert claim_favor_never_reaches_zero(retrieval_rows([("favor:m=64", 128, 40, 1, 0.2)])).verdict == NOT_RUN


def test_c5_compares_the_delta_and_sum_rule_on_the_same_feature_map():
    ok = retrieval_rows([("dpfp:nu=1", 128, 20, 1, 0.1), ("dpfp-delta:nu=1", 128, 20, 1, 0.001)], setting=2)
    assert claim_setting2_delta_beats_sum(ok).verdict == PASS
    sum_fine = retrieval_rows([("dpfp:nu=1", 128, 20, 1, 0.02), ("dpfp-delta:nu=1", 128, 20, 1, 0.001)], setting=2)
    assert claim_setting2_delta_beats_sum(sum_fine).verdict == FAIL
    unpaired = retrieval_rows([("dpfp-delta:nu=1", 128, 20, 1, 0.001), ("linear", 64, 20, 1, 0.2)], setting=2)
    assert claim_setting2_delta_beats_sum(unpaired).verdict == NOT_RUN


def test_c6_needs_linear_delta_to_fail_where_dpfp_nu2_delta_holds():
    ok = retrieval_rows([("linear-delta", 64, 80, 1, 0.1), ("dpfp-delta:nu=2", 256, 80, 1, 0.002)], setting=2)
    assert claim_delta_rule_needs_capacity(ok).verdict == PASS
    dpfp_fails = retrieval_rows([("linear-delta", 64, 80, 1, 0.1), ("dpfp-delta:nu=2", 256, 80, 1, 0.03)], setting=2)
    assert claim_delta_rule_needs_capacity(dpfp_fails).verdict == FAIL
    too_small = retrieval_rows([("linear-delta", 64, 80, 1, 0.1), ("dpfp-delta:nu=2", 256, 40, 1, 0.001)], setting=2)
    assert claim_delta_rule_needs_capacity(too_small).verdict == FAIL  # never compared at S = 80
    assert claim_delta_rule_needs_capacity(ok[ok["variant"] == "linear-delta"]).verdict == NOT_RUN


def test_c7_passes_on_divergence_or_a_clearly_worse_loss():
    diverged = retrieval_rows([
        ("dpfp-delta-unnorm:nu=1", 128, 20, 1, math.inf, "diverged", 37), ("dpfp-delta:nu=1", 128, 20, 1, 0.001),
    ], setting=2)
    result = claim_unnormalised_delta_rule_fails(diverged)
    assert result.verdict == PASS and "diverged at step 37" in result.measured
    worse = retrieval_rows([("dpfp-delta-unnorm:nu=1", 128, 20, 1, 0.2), ("dpfp-delta:nu=1", 128, 20, 1, 0.001)],
                           setting=2)
    assert claim_unnormalised_delta_rule_fails(worse).verdict == PASS
    same = retrieval_rows([("dpfp-delta-unnorm:nu=1", 128, 20, 1, 0.0007), ("dpfp-delta:nu=1", 128, 20, 1, 0.001)],
                          setting=2)
    assert claim_unnormalised_delta_rule_fails(same).verdict == FAIL
    alone = retrieval_rows([("dpfp-delta-unnorm:nu=1", 128, 20, 1, 0.2)], setting=2)
    assert claim_unnormalised_delta_rule_fails(alone).verdict == NOT_RUN


def test_c1_and_c2_never_mix_key_sizes():
    """A ν sweep at d_key 16 next to the paper's d_key 64 runs: C1 reads d_key 64 only; C2 uses the
    d_key with the most values of ν (16 here) instead of averaging losses across key sizes."""
    paper = retrieval_rows([("linear", 64, 40, 1, 0.001), ("linear", 64, 80, 1, 0.2), ("softmax", None, 80, 1, 0.0),
                            ("dpfp:nu=1", 128, 80, 1, 0.001)])
    sweep = retrieval_rows([("linear", 16, 80, 1, 0.001)] + [
        (f"dpfp:nu={nu}", 32 * nu, S, 1, 1e-3 if S <= 32 * nu else 0.2) for nu in (1, 2, 3) for S in (16, 48, 80, 112)
    ], d_key=16)
    frame = pd.concat([paper, sweep])
    assert claim_linear_fails_softmax_holds(frame).verdict == PASS
    c2 = claim_dpfp_capacity_grows_with_nu(frame)
    assert c2.verdict == PASS and "d_key 16" in c2.measured
