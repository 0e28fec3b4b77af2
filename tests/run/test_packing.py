"""Packed training (issue 16 item 2): runs that share shapes train as one model with a leading run
axis, and each gives the record it gives alone: same curve (to fp32 summation order), same stopping
step and status, its own divergence; the runner packs only the runs the store lacks."""

from __future__ import annotations

import math

import pytest
import torch

from fwbench.cli import main
from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec
from fwbench.run.pack_plan import PackPolicy, pack_policy, packing_pays, plan_packs
from fwbench.run.packing import _Pack, fit_packed
from fwbench.run.store import ResultsStore
from fwbench.run.training import fit
from fwbench.tasks.retrieval import RetrievalConfig

CPU = torch.device("cpu")


def assert_same_run(solo, packed, rtol=1e-5):
    """Two FitResults of one run: equal stopping, curves equal to ``rtol`` relative."""
    assert (packed.status, packed.steps, packed.best_step, packed.diverged_at) == (
        solo.status, solo.steps, solo.best_step, solo.diverged_at)
    assert packed.parameters == solo.parameters
    assert [sorted(p) for p in packed.curve] == [sorted(p) for p in solo.curve]
    for mine, alone in zip(packed.curve, solo.curve):
        for key, value in alone.items():
            assert mine[key] == pytest.approx(value, rel=rtol, abs=1e-9), (key, mine, alone)


@pytest.mark.parametrize("variant, setting", [("dpfp-delta:nu=1", 2), ("dpfp:nu=1", 1), ("softmax", 1)])
def test_a_packed_three_seed_cell_gives_the_solo_records(variant, setting):
    # the runs leave the pack at different steps: budget 7 (a last evaluation off the schedule),
    # a plateau after one evaluation without a new best, and the full budget
    base = RetrievalConfig(setting=setting, S=6, d_key=8, batch_size=8, eval_every=3, eval_sequences=4, max_steps=14)
    configs = [RetrievalConfig(**{**vars(base), "max_steps": 7}), RetrievalConfig(**{**vars(base), "patience": 1}), base]
    seeds = [11, 12, 13]
    packed = dict(fit_packed(variant, configs, seeds, CPU))
    assert sorted(packed) == [0, 1, 2]
    assert packed[0].steps == 7 and packed[2].steps == 14
    for i, (config, seed) in enumerate(zip(configs, seeds)):
        assert_same_run(fit("retrieval", variant, config, seed, CPU), packed[i])


def test_runs_are_yielded_as_they_end():
    base = RetrievalConfig(setting=1, S=4, d_key=8, batch_size=4, eval_every=2, eval_sequences=2, max_steps=6)
    configs = [base, RetrievalConfig(**{**vars(base), "max_steps": 2})]
    order = [(i, r.steps) for i, r in fit_packed("linear", configs, [1, 2], CPU)]
    assert order == [(1, 2), (0, 6)]


def test_a_diverging_run_leaves_the_pack_and_the_others_train_on_as_without_it():
    config = RetrievalConfig(setting=2, S=5, d_key=8, batch_size=4)
    poisoned = _Pack("dpfp-delta:nu=1", [config] * 3, [1, 2, 3], CPU, check_finite=True)
    with torch.no_grad():
        poisoned.model.key_embedding[1, 0, 0] = math.nan
    clean = _Pack("dpfp-delta:nu=1", [config] * 2, [1, 3], CPU, check_finite=True)
    diverged = poisoned.train_step(1)
    assert [m.seed for m in diverged] == [2]
    assert diverged[0].loop.status == "diverged" and diverged[0].loop.diverged_at == 1
    assert diverged[0].loop.diverged_reason.startswith("training: ")  # the solo message (NaN/inf check)
    assert [m.seed for m in poisoned.members] == [1, 3]
    for step in range(1, 4):
        if step > 1:
            assert poisoned.train_step(step) == []
        assert clean.train_step(step) == []
    for (name, mine), (_, theirs) in zip(poisoned.model.named_parameters(), clean.model.named_parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7, msg=name)


def spec(variant="dpfp:nu=1", seed=1, **config):
    return RunSpec("g", "retrieval", variant, seed, {"setting": 1, "S": 6, **config})


def test_packs_group_runs_of_one_shape_and_leave_the_rest_alone():
    specs = [spec(seed=1), spec(seed=2, target_loss=0.1), spec(seed=1, S=8), spec(seed=3),
             spec(seed=1, lr=0.01), spec("favor:m=16", seed=1), spec("favor:m=16", seed=2),
             RunSpec("g", "mqar", "dpfp:nu=1", 1, {})]
    packs = [[(s.variant, s.config.get("S"), s.seed) for s in pack] for pack in plan_packs(specs, PackPolicy(), CPU)]
    assert packs[0] == [("dpfp:nu=1", 6, 1), ("dpfp:nu=1", 6, 2), ("dpfp:nu=1", 6, 3)]
    assert sorted(len(p) for p in packs) == [1, 1, 1, 1, 1, 3]  # another S, another lr, FAVOR+ (Ω), another task
    assert [len(p) for p in plan_packs(specs[:4], PackPolicy(max_runs=2), CPU)][:2] == [2, 1]
    assert all(len(p) == 1 for p in plan_packs(specs, PackPolicy(max_runs=1), CPU))


def test_packing_is_automatic_where_it_pays():
    large = {"setting": 2, "S": 120, "batch_size": 32}  # measured 0.75x packed on CPU: memory-bound
    assert not packing_pays(large, "dpfp-delta:nu=1", CPU)
    assert packing_pays(large, "dpfp-delta:nu=1", torch.device("cuda"))  # launch-bound
    assert packing_pays({"setting": 2, "S": 60, "batch_size": 32}, "dpfp-delta:nu=1", CPU)  # measured 1.15x
    large = [spec("dpfp-delta:nu=1", seed, setting=2, S=120) for seed in (1, 2)]
    assert [len(p) for p in plan_packs(large, PackPolicy(), CPU)] == [1, 1]
    assert [len(p) for p in plan_packs(large, PackPolicy(forced=True), CPU)] == [2]


def test_the_environment_forces_or_switches_off_packing(monkeypatch):
    monkeypatch.delenv("FWBENCH_PACK", raising=False)
    assert pack_policy() == PackPolicy() and pack_policy(enabled=False).max_runs == 1
    monkeypatch.setenv("FWBENCH_PACK", "0")
    assert pack_policy().max_runs == 1
    monkeypatch.setenv("FWBENCH_PACK", "3")
    assert pack_policy() == PackPolicy(max_runs=3, forced=True) and pack_policy(enabled=False).max_runs == 1
    monkeypatch.setenv("FWBENCH_PACK", "many")
    with pytest.raises(FwbenchError, match=r"\$FWBENCH_PACK: got 'many'"):
        pack_policy()


GRID = """
name = "pack-tiny"
task = "retrieval"

[defaults]
setting = 2
S = 5
d_key = 8
batch_size = 4
eval_every = 3
eval_sequences = 2
max_steps = 6

[profiles.quick]
variant = ["dpfp-delta:nu=1"]
seed = [1, 2, 3]
"""


def test_the_runner_packs_only_the_runs_missing_from_the_store(tmp_path, monkeypatch):
    monkeypatch.delenv("FWBENCH_PACK", raising=False)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    packed, solo = tmp_path / "packed", tmp_path / "solo"
    assert main(["run", str(grid), "--results-dir", str(packed), "--quiet", "--seeds", "2"]) == 0
    assert main(["run", str(grid), "--results-dir", str(packed), "--quiet"]) == 0
    assert main(["run", str(grid), "--results-dir", str(solo), "--quiet", "--no-pack"]) == 0
    records = {r["seed"]: r for r in ResultsStore(packed).records()}
    alone = {r["seed"]: r for r in ResultsStore(solo).records()}
    assert len(ResultsStore(packed).records()) == 3 and sorted(records) == [1, 2, 3]
    assert "packed" not in records[2] and records[1]["packed"] == records[3]["packed"] == {"runs": 2}
    assert not any("packed" in r for r in alone.values())
    for seed in (1, 3):
        assert set(records[seed]) - {"packed"} == set(alone[seed])
        assert records[seed]["run_id"] == alone[seed]["run_id"] and records[seed]["steps"] == alone[seed]["steps"]
        for mine, theirs in zip(records[seed]["curve"], alone[seed]["curve"]):
            assert mine == pytest.approx(theirs, rel=1e-5)


def test_an_evaluation_that_goes_non_finite_ends_only_its_run():
    config = RetrievalConfig(setting=1, S=5, d_key=8, batch_size=4, eval_sequences=3)
    poisoned = _Pack("dpfp:nu=1", [config] * 2, [1, 2], CPU, check_finite=True)
    clean = _Pack("dpfp:nu=1", [config], [2], CPU, check_finite=True)
    with torch.no_grad():
        poisoned.model.query_weight[0, 0, 0] = math.inf
    stopping = poisoned.evaluate(poisoned.members, last=False)
    assert [m.seed for m in stopping] == [1]
    assert stopping[0].loop.diverged_reason.startswith("evaluation: ")
    clean.evaluate(clean.members, last=False)
    assert poisoned.members[1].loop.curve == clean.members[0].loop.curve
