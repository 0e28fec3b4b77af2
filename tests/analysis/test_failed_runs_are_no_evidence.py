"""A run that raised is stored as ``failed`` (``failed_record``: metrics {}, steps 0) and trained again by
the next ``fwbench run``: it measured nothing. The claims read such runs as runs that ended: C14 counted
favor-delta runs that raised at S = 100 as runs that did not diverge and leaned FAIL with its evidence
'met', and the seed minimum counted their seeds."""

from __future__ import annotations

from fwbench.analysis.claims import evaluate_claims
from fwbench.analysis.records import records_frame
from fwbench.analysis.verdicts import FAIL, PASS


def setting2_run(seed: int, S: int, status: str) -> dict:
    """A favor-delta Setting 2 record at d_key 64 as ``build_record`` (or ``failed_record``) writes it."""
    record = {"run_id": f"{seed}-{S}", "grid": "setting2", "task": "retrieval", "seed": seed, "status": status,
              "steps": 500, "wall_s": 10.0, "variant": {"spec": "favor-delta:m=64", "d_dot": 128},
              "config": {"setting": 2, "S": S, "d_key": 64, "max_steps": 500, "lr": 1e-3, "batch_size": 32},
              "metrics": {"best_eval_loss": 0.001, "final_eval_loss": 0.001, "best_step": 500},
              "diverged_at": None, "curve": []}
    if status == "failed":
        record.update(metrics={}, steps=0, wall_s=0.0, error="RuntimeError: boom")
    if status == "diverged":
        record.update(diverged_at=120, metrics={"best_eval_loss": None, "final_eval_loss": None, "best_step": None})
    return record


def c14(records: list[dict]):
    return next(c for c in evaluate_claims(records_frame(records)) if c.id == "C14")


def test_c14_does_not_read_runs_that_raised_as_runs_that_did_not_diverge():
    """Three seeds converged at S = 20 and raised at S = 100: no favor-delta run at S ≥ 40 ended, so C14
    has nothing to lean on (was FAIL, '0 of 6 diverged', evidence 'met')."""
    records = [setting2_run(seed, S, "converged" if S == 20 else "failed") for seed in (1, 2, 3) for S in (20, 100)]
    result = c14(records)
    assert result.verdict != FAIL and result.leaning != FAIL
    assert result.measured == "favor-delta:m=64: 0 of 3 diverged"
    assert "S < 40 only" in result.evidence


def test_the_seed_minimum_does_not_count_a_seed_whose_run_raised():
    """At S = 100 seed 1 diverged, seeds 2 and 3 raised: one seed ran, so C14 stays INDICATIVE (leaning
    PASS) with '1 seed' missing; it read PASS with its evidence met. With the retried runs ended, PASS."""
    records = [setting2_run(1, 100, "diverged"), setting2_run(2, 100, "failed"), setting2_run(3, 100, "failed")]
    result = c14(records)
    assert (result.verdict, result.leaning) == ("INDICATIVE", PASS) and "1 seed" in result.evidence
    retried = [setting2_run(1, 100, "diverged"), setting2_run(2, 100, "max_steps"), setting2_run(3, 100, "diverged")]
    retried[1]["metrics"]["best_eval_loss"] = 0.001
    assert c14(retried).verdict == PASS
