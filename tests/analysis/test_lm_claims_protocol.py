"""How the LM claims read a setup: each variant at its best learning rate, differences beyond seed
noise, and C10 from the carried-length evaluation (16× ÷ 1× the carried training length)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fwbench.analysis.claims_lm import (
    claim_carried_state_sum_degrades_delta_holds,
    claim_delta_beats_sum,
    claim_unnormalised_delta_rule_fails,
)
from fwbench.analysis.lm_protocol import (
    at_best_learning_rate,
    best_learning_rates,
    carried_ratio,
    describe_learning_rates,
)
from fwbench.analysis.verdicts import FAIL, PASS

SETUP = {"task": "shakespeare", "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "context": 16,
         "batch_size": 4, "max_steps": 1000, "positional": "none", "schedule": "noam", "dropout": 0.0,
         "tied_output": True, "train_segments": 1, "truncated_bptt": False, "final_evaluation": None}


def row(variant: str, seed: int, lr: float, val_ppl: float, status: str = "max_steps", **metrics) -> dict:
    return {**SETUP, "variant": variant, "seed": seed, "lr": lr, "val_ppl": val_ppl, "status": status, **metrics}


def test_each_variant_is_read_at_its_best_seed_mean_learning_rate_and_a_divergence_disqualifies_a_rate():
    rows = pd.DataFrame([
        row("linear", 1, 1e-3, 6.0), row("linear", 2, 1e-3, 6.2),
        row("linear", 1, 3e-3, 5.0), row("linear", 2, 3e-3, 5.2),
        # the delta rule's higher rate is best on seed 1 but diverged on seed 2: never chosen
        row("linear-delta", 1, 1e-3, 5.5), row("linear-delta", 2, 1e-3, 5.6),
        row("linear-delta", 1, 3e-3, 4.0), row("linear-delta", 2, 3e-3, math.nan, status="diverged"),
    ])
    assert best_learning_rates(rows) == {"linear": 3e-3, "linear-delta": 1e-3}
    chosen = at_best_learning_rate(rows)
    assert sorted(zip(chosen["variant"], chosen["lr"], chosen["seed"])) == [
        ("linear", 3e-3, 1), ("linear", 3e-3, 2), ("linear-delta", 1e-3, 1), ("linear-delta", 1e-3, 2)]
    # read at their best rates the sum rule is ahead here: C8 cannot lean PASS (two seeds: INDICATIVE)
    result = claim_delta_beats_sum(rows)
    assert result.leaning != PASS and "→ linear-delta 5.55 [4.949, 6.223] (lr 0.001, edge of the sweep)" in result.measured


def carried_rows(sum_ratio: float, delta_ratio: float) -> pd.DataFrame:
    setup = {"train_segments": 4, "truncated_bptt": True}
    return pd.DataFrame([
        {**row(v, seed, 6e-3, 8.0, carried_ppl_1x=8.0, carried_ppl_16x=8.0 * r * (1 + 0.01 * seed)), **setup}
        for v, r in (("linear", sum_ratio), ("linear-delta", delta_ratio)) for seed in (1, 2, 3)])


def test_c10_reads_the_carried_length_evaluation():
    assert carried_ratio(carried_rows(1.3, 1.0)).round(3).to_dict() == {"linear": 1.326, "linear-delta": 1.02}
    result = claim_carried_state_sum_degrades_delta_holds(carried_rows(1.3, 1.0))
    assert result.verdict == PASS and "16× ÷ 1×" in result.measured and "truncated BPTT" in result.measured
    # what the quick runs showed: the delta rule's perplexity grows beyond the carried training length
    assert claim_carried_state_sum_degrades_delta_holds(carried_rows(1.04, 1.9)).verdict == FAIL


def test_c10_reads_the_stream_where_the_carried_length_evaluation_pairs_no_rules():
    """The sum rule re-run with the carried-length evaluation, the delta rule's records older (the
    stream's last bucket only): the claim text says the stream is read then; it was NOT RUN ('needs sum
    and delta runs with the long-context evaluation') though both rules had that evaluation."""
    def stream(ratio: float) -> dict:
        return {"long_context": {"buckets": [[0, 16], [16, 64]], "carried_ppl": [8.0, 8.0 * ratio],
                                 "reset_ppl": [8.0, 8.0], "carried_ppl_all": 8.0 * ratio, "reset_ppl_all": 8.0}}
    rows = carried_rows(1.3, 1.0)
    rows = rows.assign(final_evaluation=[stream(1.3 if v == "linear" else 1.0) for v in rows["variant"]])
    rows.loc[rows["variant"] == "linear-delta", ["carried_ppl_1x", "carried_ppl_16x"]] = math.nan
    result = claim_carried_state_sum_degrades_delta_holds(rows)
    assert result.verdict == PASS, result.measured
    assert result.measured.startswith("carried ÷ per-segment ppl, last bucket of the stream: linear ×1.30 vs "
                                      "linear-delta ×1.00 [")
    assert "where that evaluation pairs no sum and delta rule, carried ÷ per-segment ppl" in result.claim


def test_c10_reads_the_stream_at_each_variants_best_learning_rate():
    """Records with the stream's last bucket only, the delta rule swept over two rates: it holds (×1.00)
    at its best rate (val ppl 7.0) and degrades (×1.50) at the worse one (20.0). The stream ratios were
    averaged over every rate (×1.25: FAIL) while the 16× evaluation is read at the best rate."""
    def stream(ratio: float) -> dict:
        return {"long_context": {"buckets": [[0, 16], [16, 64]], "carried_ppl": [8.0, 8.0 * ratio],
                                 "reset_ppl": [8.0, 8.0], "carried_ppl_all": 8.0 * ratio, "reset_ppl_all": 8.0}}
    rows = pd.DataFrame([{**row(v, seed, lr, ppl), "train_segments": 4, "final_evaluation": stream(r)}
                         for v, lr, ppl, r in (("linear", 6e-3, 8.0, 1.3), ("linear-delta", 6e-3, 7.0, 1.0),
                                               ("linear-delta", 3e-2, 20.0, 1.5)) for seed in (1, 2, 3)])
    result = claim_carried_state_sum_degrades_delta_holds(rows)
    assert result.verdict == PASS
    assert result.measured.startswith("carried ÷ per-segment ppl, last bucket of the stream: linear ×1.30 vs "
                                      "linear-delta ×1.00 [")


def test_c8_reads_the_limited_context_setup_when_a_carried_state_setup_is_also_stored():
    limited = [row(v, seed, 6e-3, p * (1 + 0.01 * seed)) for v, p in (("linear", 11.0), ("linear-delta", 9.5))
               for seed in (1, 2, 3)]
    carried = [{**row(v, 1, 6e-3, p), "train_segments": 4, "truncated_bptt": True}
               for v, p in (("linear", 9.0), ("linear-delta", 9.5))]
    for rows in (carried + limited, limited + carried):  # whichever the store holds first
        result = claim_delta_beats_sum(pd.DataFrame(rows))
        assert result.verdict == PASS and "carried over" not in result.measured


def unnorm_sweep(diverged_at: dict[float, int], unnorm_ppl: float = 7.0) -> pd.DataFrame:
    """linear-delta at 5.0 and linear-delta-unnorm at ``unnorm_ppl`` over lr 6e-3 and 1.2e-2, 3 seeds each;
    ``diverged_at`` maps a rate to how many of its seeds diverged."""
    rows = []
    for lr in (6e-3, 1.2e-2):
        for seed in (1, 2, 3):
            rows.append(row("linear-delta", seed, lr, 5.0 + 0.01 * seed + lr))
            diverged = seed <= diverged_at.get(lr, 0)
            rows.append(row("linear-delta-unnorm", seed, lr, math.nan if diverged else unnorm_ppl + 0.01 * seed,
                            status="diverged" if diverged else "max_steps"))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("diverged_at,count,verdict", [
    ({6e-3: 3, 1.2e-2: 3}, "6 of 6 runs diverged (lr 0.006: 3 of 3, lr 0.012: 3 of 3)", PASS),
    ({1.2e-2: 3}, "3 of 6 runs diverged (lr 0.006: 0 of 3, lr 0.012: 3 of 3)", PASS),  # worse at 0.006
    ({}, "0 of 6 runs diverged (lr 0.006: 0 of 3, lr 0.012: 0 of 3)", PASS),
])
def test_c7_counts_every_diverged_run_of_the_sweep(diverged_at, count, verdict):
    result = claim_unnormalised_delta_rule_fails(unnorm_sweep(diverged_at))
    assert count in result.measured and result.verdict == verdict, result.measured


def test_c7_with_half_the_sweep_diverged_is_decided_at_the_stable_rate():
    # lr 1.2e-2 diverged on every seed, but at 6e-3 the unnormalised rule trains and beats the delta rule
    result = claim_unnormalised_delta_rule_fails(unnorm_sweep({1.2e-2: 3}, unnorm_ppl=4.0))
    assert result.verdict == FAIL and "3 of 6 runs diverged" in result.measured


def test_a_rate_without_a_measured_run_is_never_named_best():
    rows = unnorm_sweep({6e-3: 3, 1.2e-2: 3})
    assert best_learning_rates(rows) == {"linear-delta": 6e-3}
    assert "linear-delta-unnorm none (every run diverged or unmeasured)" in describe_learning_rates(rows)
    # every run failed: all of them stay in the cells, so their failures are counted
    assert (at_best_learning_rate(rows)["variant"] == "linear-delta-unnorm").sum() == 6


def test_the_best_rate_is_marked_when_the_sweep_does_not_bracket_it():
    sweep = pd.DataFrame([row("linear", seed, lr, ppl) for lr, ppl in ((3e-3, 6.0), (6e-3, 5.0), (1.2e-2, 5.5))
                          for seed in (1, 2, 3)]
                         + [row("softmax", seed, lr, ppl) for lr, ppl in ((3e-3, 6.0), (6e-3, 5.5), (1.2e-2, 5.0))
                            for seed in (1, 2, 3)]
                         + [row("linear-delta", seed, 6e-3, 4.0) for seed in (1, 2, 3)])
    text = describe_learning_rates(sweep)
    assert text == ("best lr per variant among measured runs: linear 0.006, linear-delta 0.006 (the only lr run), "
                    "softmax 0.012 (edge of the sweep)")
    one_rate = sweep[sweep["lr"] == 6e-3]
    assert describe_learning_rates(one_rate) == "lr 0.006 for every variant (one rate, no sweep)"
    assert "best lr" not in claim_delta_beats_sum(one_rate).measured


@pytest.mark.parametrize("with_lr", [True, False], ids=["one rate", "no lr recorded"])
def test_c7_shows_the_unnormalised_rules_perplexity_without_a_rate_sweep(with_lr):
    """Break-it finding (h-break14v): with one learning rate for every run (or none recorded) there is
    no rate label, and C7 dropped the unnormalised rule's perplexity with it: 'linear-delta-unnorm: 1 of
    3 runs diverged vs linear-delta 5.02 [...]', a PASS decided on an interval the table did not show."""
    rows = unnorm_sweep({6e-3: 1})
    rows = rows[rows["lr"] == 6e-3]
    if not with_lr:
        rows = rows.drop(columns="lr")
    result = claim_unnormalised_delta_rule_fails(rows)
    assert "linear-delta-unnorm 7.025 [6.962, 7.089], 1 of 3 runs diverged vs linear-delta" in result.measured, \
        result.measured
    assert result.verdict == PASS
