"""The capacity_nu quick profile (`nox -s capacity`) can decide C2: replayed on seed 1's measured loss
curves (evaluated every 50 steps, early stopping off), the profile's own stopping rule ends every run
by convergence or plateau, or below the threshold, never at max_steps while still above 0.01; every ν's
capacity is bracketed by its S grid; and C2 leans PASS with nothing missing but seeds. Under the old
profile (patience 3 × 100 steps, 1000–2000 steps) 5 of its 10 seed-1 runs ended at max_steps above 0.01.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from fwbench.analysis.claims import claim_dpfp_capacity_grows_with_nu, claim_sum_rule_failure_scales_with_d_dot
from fwbench.analysis.records import CAPACITY_THRESHOLD
from fwbench.analysis.verdicts import INDICATIVE, PASS
from fwbench.run.grid import expand, load_grid
from fwbench.run.training import LoopState
from fwbench.tasks.retrieval import RetrievalConfig
from fwbench.variants import d_dot_of

CURVES = json.loads((Path(__file__).parent / "capacity_nu_seed1_curves.json").read_text())["curves"]


def replay(curve: list[list[float]], config: RetrievalConfig) -> tuple[str, float, int]:
    """(status, best loss, last step) of a run under ``config``'s stopping rule, read off a curve
    evaluated every 50 steps: the evaluations at multiples of ``config.eval_every`` up to max_steps.
    A curve that ends before the rule stops it counts as cut at max_steps (it was still running)."""
    loop = LoopState()
    for step, loss in curve:
        if step % config.eval_every or step > config.max_steps:
            continue
        loop.step = int(step)
        if loop.record_evaluation({"loss": loss}, None, config, last=step >= config.max_steps):
            break
    return loop.status, loop.best_eval["loss"], loop.step


def quick_records() -> pd.DataFrame:
    rows = []
    for spec in expand(load_grid("capacity_nu"), "quick"):
        fields = {f.name for f in dataclasses.fields(RetrievalConfig)}
        config = RetrievalConfig(**{k: v for k, v in spec.config.items() if k in fields})
        curve = CURVES[spec.variant].get(str(config.S))
        assert curve, f"no measured curve for {spec.variant} S={config.S}: re-measure before changing the grid"
        status, best, steps = replay(curve, config)
        rows.append({"task": "retrieval", "setting": 1, "variant": spec.variant, "S": config.S, "seed": spec.seed,
                     "d_key": config.d_key, "d_dot": d_dot_of(spec.variant, config.d_key), "status": status,
                     "best_eval_loss": best, "steps": steps})
    return pd.DataFrame(rows)


def test_every_quick_run_ends_by_convergence_or_plateau_and_c2_can_decide():
    records = quick_records()
    cut = records[(records["status"] == "max_steps") & (records["best_eval_loss"] > CAPACITY_THRESHOLD)]
    assert cut.empty, cut
    assert set(records["variant"]) == {f"dpfp:nu={nu}" for nu in (1, 2, 3, 4)} and set(records["d_key"]) == {16}
    c2 = claim_dpfp_capacity_grows_with_nu(records)
    assert c2.verdict == INDICATIVE and c2.leaning == PASS, c2.measured
    assert c2.evidence.endswith("missing: 1 seed"), c2.evidence  # bracketed, finished: only the seeds lack
    # capacity ≈ 0.65-0.8·d_dot at this budget: ν=1 fails at S=24 (0.042), ν=4 holds at 96 (0.0055)
    assert "ν=1: ≈ 21" in c2.measured and "ν=4: ≈ 102" in c2.measured, c2.measured
    c3 = claim_sum_rule_failure_scales_with_d_dot(records)
    assert c3.verdict == INDICATIVE and "d_key 16, not the paper's 64" in c3.evidence


def test_an_indicative_verdict_says_which_way_its_criterion_leans():
    """The README reads the quick profile's claims by their leaning (C2 leans PASS on one seed), and
    the report's claims table and ``fwbench capacity`` print it after INDICATIVE; a PASS or FAIL
    verdict, and a criterion that does not lean, print none (the leaning was computed, never shown)."""
    from fwbench.analysis.verdicts import FAIL, judge, leaning_note

    c2 = claim_dpfp_capacity_grows_with_nu(quick_records())
    assert leaning_note(c2) == " (leans PASS)"
    assert leaning_note(judge("X", "claim", "paper", "measured", FAIL, [], "3 seeds", "ref")) == ""  # FAIL: met
    assert leaning_note(judge("X", "claim", "paper", "measured", None, [], "3 seeds", "ref")) == ""  # undecided
    assert leaning_note(judge("X", "claim", "paper", "measured", FAIL, ["1 seed"], "3 seeds", "ref")) == " (leans FAIL)"
