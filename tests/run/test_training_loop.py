"""The training loop itself: its saved state, the evaluation of the final model, the exact step
early stopping ends at, FAVOR+'s redraw every step, and the record's strict JSON (issue 14 items
5 and 6, the loop's planted faults of item 14; issue 15 item 4)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn

from fwbench import tasks
from fwbench.errors import FwbenchError
from fwbench.run import training
from fwbench.run.checkpoint import load_checkpoint
from fwbench.run.distributed import DistributedContext, parameter_digest
from fwbench.run.environment import denormal_flushing_supported, portable_argv
from fwbench.run.grid import RunSpec, load_grid
from fwbench.run.launchers import LaunchOptions
from fwbench.run.runner import run_grid
from fwbench.run.store import ResultsStore
from fwbench.run.training import LoopState, fit, redraw_random_features
from fwbench.tasks.retrieval import RetrievalConfig
from fwbench.variants import Favor, NonFiniteError
from fwbench.variants.kernels.precision import denormals_are_flushed


@dataclass(frozen=True)
class ScriptedConfig:
    """A task whose evaluation losses are ``losses`` in turn (then the last one again)."""

    losses: tuple[float, ...] = (1.0,)
    batch_size: int = 2
    lr: float = 0.01
    eval_every: int = 2
    patience: int = 3
    target_loss: float = 0.0
    max_steps: int = 40


class ScriptedTask:
    """Trains a 2×2 linear map; ``evaluate`` returns the scripted loss and the step it ran after."""

    name: ClassVar[str] = "scripted"
    config_class: ClassVar[type] = ScriptedConfig

    def validate(self, config):
        pass

    def build_model(self, config, variant):
        model = nn.Linear(2, 2)
        model.steps, model.evaluations = 0, 0
        return model

    def train_batch(self, config, generator):
        return torch.randn(config.batch_size, 2, generator=generator)

    def loss(self, model, x, config):
        model.steps += 1
        return model(x).pow(2).mean()

    def evaluate(self, model, config, generator, device):
        loss = config.losses[min(model.evaluations, len(config.losses) - 1)]
        model.evaluations += 1
        return {"loss": loss, "after_step": float(model.steps)}


@pytest.fixture(autouse=True)
def scripted_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "scripted", ScriptedTask())


def test_the_model_a_run_ends_with_is_evaluated_whatever_the_schedule():
    """eval_every 10, max_steps 19: evaluations at 10 and at 19 (the issue's 100/190, scaled down)."""
    result = fit("scripted", "linear", ScriptedConfig(losses=(0.5, 0.25), eval_every=10, max_steps=19), 1,
                 torch.device("cpu"))
    assert result.status == "max_steps" and result.steps == 19
    assert [point["step"] for point in result.curve] == [10, 19]
    assert result.final_eval == {"loss": 0.25, "after_step": 19.0}
    assert result.best_eval["loss"] == 0.25 and result.best_step == 19
    assert "train_loss" not in result.curve[-1]  # no training step belongs to the extra evaluation


def test_a_run_whose_budget_is_a_multiple_of_eval_every_is_evaluated_once_per_evaluation_step():
    result = fit("scripted", "linear", ScriptedConfig(eval_every=5, max_steps=20), 1, torch.device("cpu"))
    assert [point["step"] for point in result.curve] == [5, 10, 15, 20]


def test_a_real_task_is_evaluated_at_its_last_step():
    config = RetrievalConfig(S=4, d_key=8, batch_size=4, eval_every=5, eval_sequences=4, max_steps=7, target_loss=0.0)
    result = fit("retrieval", "linear", config, 2, torch.device("cpu"))
    assert [point["step"] for point in result.curve] == [5, 7]
    assert result.final_eval["loss"] == result.curve[-1]["eval_loss"]


def test_early_stopping_ends_at_the_evaluation_that_completes_the_patience():
    """Best at step 4, then three worse evaluations (6, 8, 10): patience 3 stops at step 10, not 12."""
    config = ScriptedConfig(losses=(1.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95), eval_every=2, patience=3, max_steps=40)
    result = fit("scripted", "linear", config, 1, torch.device("cpu"))
    assert result.status == "plateau"
    assert result.steps == 10 and result.best_step == 4 and result.best_eval["loss"] == 0.5
    assert [point["step"] for point in result.curve] == [2, 4, 6, 8, 10]


def test_a_plateau_needs_evaluations_without_a_new_best_not_equal_ones():
    """An improvement resets the count: 1.0, 0.9 (best), 0.95, 0.8 (best), 0.85, 0.85, 0.85 → stops at step 14."""
    config = ScriptedConfig(losses=(1.0, 0.9, 0.95, 0.8, 0.85), eval_every=2, patience=3, max_steps=40)
    result = fit("scripted", "linear", config, 1, torch.device("cpu"))
    assert result.status == "plateau" and result.steps == 14 and result.best_step == 8


def test_reaching_the_target_converges_at_that_evaluation():
    config = ScriptedConfig(losses=(1.0, 0.5, 0.01), eval_every=3, target_loss=0.01)
    result = fit("scripted", "linear", config, 1, torch.device("cpu"))
    assert result.status == "converged" and result.steps == 9


def test_training_a_favor_model_draws_new_features_every_step():
    """The loop calls the redraw: Ω differs at every step, and the draws repeat with the seed."""
    config = RetrievalConfig(S=4, d_key=8, batch_size=4, eval_every=3, eval_sequences=4, max_steps=6, target_loss=0.0)

    def omegas_per_step(seed: int) -> list[torch.Tensor]:
        seen: list[torch.Tensor] = []
        model_maps: list[Favor] = []
        original = Favor.redraw_features

        def recording(self):
            original(self)
            model_maps.append(self)
            seen.append(self.omega.detach().clone())

        Favor.redraw_features = recording
        try:
            fit("retrieval", "favor:m=8", config, seed, torch.device("cpu"))
        finally:
            Favor.redraw_features = original
        assert len({id(m) for m in model_maps}) >= 1
        return seen

    draws = omegas_per_step(5)
    per_step = len(draws) // config.max_steps
    assert per_step >= 1 and len(draws) == per_step * config.max_steps  # every step, every feature map
    for before, after in zip(draws, draws[per_step:]):
        assert not torch.equal(before, after)
    assert all(torch.equal(a, b) for a, b in zip(draws, omegas_per_step(5)))


def test_redrawing_from_a_stream_leaves_the_global_generator_alone():
    model = nn.Sequential(Favor(8, m=4))
    stream = torch.Generator().manual_seed(7)
    before = torch.get_rng_state()
    redraw_random_features(model, stream)
    first = model[0].omega.clone()
    assert torch.equal(torch.get_rng_state(), before)
    redraw_random_features(model, torch.Generator().manual_seed(7))
    assert torch.equal(model[0].omega, first)  # the same stream state, the same Ω


def test_loop_state_saves_and_restores_itself():
    loop = LoopState(step=12, curve=[{"step": 10, "eval_loss": 0.5}], best_eval={"loss": 0.5}, best_step=10,
                     since_best=1, train_s=2.5, wall_s=3.0)
    saved = loop.state_dict()
    assert "clock" not in saved and "resumed_at" not in saved and saved["wall_s"] >= 3.0
    restored = LoopState.from_state_dict(json.loads(json.dumps(saved)))  # a plain, JSON-able dict
    assert restored.resumed_at == 12
    for name in ("step", "curve", "best_eval", "best_step", "since_best", "status", "train_s", "finished"):
        assert getattr(restored, name) == getattr(loop, name), name


def strict(line: str) -> dict:
    """Parse ``line`` as strict JSON: NaN, Infinity and -Infinity are errors."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(line, parse_constant=refuse)


def test_a_run_that_diverges_before_any_evaluation_writes_strict_json(tmp_path):
    """lr 1e12: diverged at step 2; its best loss was never measured, so null, not Infinity."""
    config = RetrievalConfig(S=4, d_key=8, batch_size=4, eval_every=50, eval_sequences=4, max_steps=100, lr=1e12)
    spec = RunSpec("diverge", "retrieval", "linear", 1, config.__dict__)
    store = ResultsStore(tmp_path)
    run_grid([spec], store, LaunchOptions(device="cpu"), quiet=True)
    line, = store.path.read_text().splitlines()
    record = strict(line)
    assert record["status"] == "diverged" and record["diverged_at"] == 2
    assert record["diverged_reason"] == "training loss is nan"
    assert record["metrics"]["best_eval_loss"] is None and record["metrics"]["final_eval_loss"] is None


def test_every_non_finite_value_is_written_as_null_with_its_reason(tmp_path):
    store = ResultsStore(tmp_path)
    record = {"run_id": "x", "metrics": {"loss": float("inf"), "ok": 1.5},
              "curve": [{"step": 2, "eval_loss": float("nan")}, {"step": 4, "eval_loss": -float("inf")}]}
    store.append(record)
    written = strict(store.path.read_text())
    assert written["metrics"] == {"loss": None, "ok": 1.5}
    assert written["curve"] == [{"step": 2, "eval_loss": None}, {"step": 4, "eval_loss": None}]
    assert written["non_finite"] == {"metrics.loss": "inf", "curve.0.eval_loss": "nan", "curve.1.eval_loss": "-inf"}
    assert record["metrics"]["loss"] == float("inf")  # the caller's record is left as it was
    bench = ResultsStore(tmp_path, "bench.jsonl")
    bench.append({"run_id": "b", "ratio": float("nan")})
    assert strict(bench.path.read_text())["ratio"] is None


def test_numpy_and_torch_numbers_in_a_record_are_written_as_json_numbers(tmp_path):
    """A metric averaged with NumPy is a numpy.float32, which json cannot write: the record (and
    the finished run) would be lost. Scalars, arrays and tensors become numbers and lists."""
    store = ResultsStore(tmp_path)
    store.append({"run_id": "np", "metrics": {"loss": np.float32(0.25), "steps": np.int64(7), "nan": np.float32("nan"),
                                              "per_key": np.array([0.5, np.inf], dtype=np.float32),
                                              "peak": torch.tensor(3.0), "ok": np.bool_(True)}})
    written = strict(store.path.read_text())
    assert written["metrics"] == {"loss": 0.25, "steps": 7, "nan": None, "per_key": [0.5, None], "peak": 3.0, "ok": True}
    assert written["non_finite"] == {"metrics.nan": "nan", "metrics.per_key.1": "inf"}


def test_csv_tables_hold_empty_cells_for_non_finite_values(tmp_path):
    import pandas as pd

    from fwbench.run.strict_json import write_csv

    write_csv(pd.DataFrame({"a": [1.0, float("inf"), float("nan")], "b": ["x", "y", "z"]}), tmp_path / "t.csv",
              index=False)
    assert (tmp_path / "t.csv").read_text().splitlines() == ["a,b", "1.0,x", ",y", ",z"]


def test_the_grid_loader_warns_when_the_budget_falls_between_evaluations(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
                    'max_steps = [190, 200]\neval_every = 100\n')
    grid = load_grid(path)
    assert grid.warnings == ("grid g profile quick: max_steps 190 is not a multiple of eval_every 100; runs that "
                             "reach it are also evaluated at step 190, off the every-100 schedule",)


def test_tables_still_count_a_run_diverged_before_any_evaluation_as_failed():
    from fwbench.analysis.records import records_frame

    record = {"run_id": "x", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1, "status": "diverged",
              "steps": 2, "wall_s": 0.1, "config": {"S": 4}, "metrics": {"best_eval_loss": None}}
    assert records_frame([record])["best_eval_loss"].tolist() == [float("inf")]


def test_fwbench_run_prints_the_schedule_warning_and_evaluates_the_last_step(tmp_path, capsys):
    from fwbench.cli import main

    grid = tmp_path / "w.toml"
    grid.write_text('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nS = 4\nd_key = 8\n'
                    'batch_size = 4\neval_sequences = 4\nmax_steps = 3\neval_every = 2\ntarget_loss = 0.0\n')
    assert main(["run", str(grid), "--results-dir", str(tmp_path / "r"), "--quiet"]) == 0
    assert ("fwbench: warning: grid w profile quick: max_steps 3 is not a multiple of eval_every 2; runs that "
            "reach it are also evaluated at step 3, off the every-2 schedule") in capsys.readouterr().err
    record, = ResultsStore(tmp_path / "r").records()
    assert [point["step"] for point in record["curve"]] == [2, 3]
    assert record["metrics"]["final_eval_loss"] == record["curve"][-1]["eval_loss"]


def _denormal_survives() -> bool:
    return not denormals_are_flushed()


@pytest.mark.skipif(not denormal_flushing_supported(), reason="this CPU cannot flush denormals")
def test_training_and_evaluation_flush_denormals_and_the_mode_is_restored(monkeypatch):
    """Denormal operands slowed FAVOR+ delta steps 5x (37 → 155 ms of CPU over 3000 steps); the loop
    trains and evaluates with them flushed to zero, and leaves the caller's mode as it was."""
    seen = []
    task = tasks.TASKS["scripted"]
    monkeypatch.setattr(task, "train_batch", lambda config, generator: (seen.append(("train", _denormal_survives())),
                                                                      torch.ones(config.batch_size, 2))[1])
    evaluate = task.evaluate
    monkeypatch.setattr(task, "evaluate", lambda *a: (seen.append(("eval", _denormal_survives())), evaluate(*a))[1])
    assert _denormal_survives()
    fit("scripted", "linear", ScriptedConfig(eval_every=2, max_steps=4), 1, torch.device("cpu"))
    assert seen and not any(survives for _, survives in seen) and {kind for kind, _ in seen} == {"train", "eval"}
    assert _denormal_survives()  # restored
    torch.set_flush_denormal(True)
    try:
        fit("scripted", "linear", ScriptedConfig(eval_every=2, max_steps=4), 1, torch.device("cpu"))
        assert not _denormal_survives()  # a caller that had it on keeps it on
    finally:
        torch.set_flush_denormal(False)


def test_the_last_evaluation_after_the_budget_never_ends_the_run_on_a_plateau():
    """Patience 1, evaluations at steps 3 and 4 (the budget's end) with the same loss: the run ran
    out of budget, it did not stop on a plateau."""
    result = fit("scripted", "linear", ScriptedConfig(losses=(1.0,), eval_every=3, patience=1, max_steps=4), 1,
                 torch.device("cpu"))
    assert (result.status, result.steps, [p["step"] for p in result.curve]) == ("max_steps", 4, [3, 4])


def test_the_best_step_is_the_first_evaluation_that_reached_the_best_loss():
    result = fit("scripted", "linear", ScriptedConfig(losses=(1.0, 0.5, 0.5), max_steps=6), 1, torch.device("cpu"))
    assert (result.best_step, result.best_eval["loss"]) == (4, 0.5)


# --------------------------------------------------------------------------------------------
# What the loop hands the task, its checkpoints, and its data-parallel steps (issue 14 item 14:
# mutants of fwbench/run/training.py that no fast test saw)
# --------------------------------------------------------------------------------------------

STEP_SLEEP_S = 0.002


@dataclass(frozen=True)
class LoopConfig:
    batch_size: int = 4
    lr: float = 0.05
    eval_every: int = 2
    patience: int = 100
    target_loss: float = 0.0
    max_steps: int = 4
    checkpoint_every: int = 0
    schedule: str = "noam"
    warmup_steps: int = 3
    grad_clip: float = 0.0


class Net(nn.Module):
    """y = W x + b (6 parameters) beside a FAVOR+ map whose Ω the loop redraws every step."""

    def __init__(self):
        super().__init__()
        self.lin, self.phi = nn.Linear(2, 2), Favor(4, m=2)

    def forward(self, x):
        return self.lin(x)


class Wrapped(nn.Module):
    """What the stand-in data-parallel group wraps the model in."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class RecordingTask:
    """Records what the loop gives it: streams' draws, batches, devices, the module trained, Ω."""

    name: ClassVar[str] = "recording"
    config_class: ClassVar[type] = LoopConfig
    seen: ClassVar[dict] = {}

    def validate(self, config):
        pass

    def build_model(self, config, variant):
        self.seen.clear()
        self.seen.update(batches=[], eval_inputs=[], omegas=[], trained=[], devices=[], global_rng=[])
        return Net()

    def train_batch(self, config, generator):
        self.seen["global_rng"].append(torch.get_rng_state())
        return torch.randn(config.batch_size, 2, generator=generator)

    def loss(self, model, x, config):
        time.sleep(STEP_SLEEP_S)
        self.seen["batches"].append(x.clone())
        self.seen["trained"].append(model)
        self.seen["omegas"].append((model.inner if isinstance(model, Wrapped) else model).phi.omega.clone())
        return model(x).pow(2).mean()

    def evaluate(self, model, config, generator, device):
        self.seen["devices"].append(device)
        x = torch.randn(4, 2, generator=generator)
        self.seen["eval_inputs"].append(x)
        with torch.no_grad():
            return {"loss": float(model(x).pow(2).mean())}

    def final_evaluation(self, model, config, device, seed):
        self.seen["devices"].append(device)
        return {"seed": float(seed)}


@pytest.fixture
def recording_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "recording", RecordingTask())
    return RecordingTask.seen


def draws(generator: torch.Generator, n: int, *shape: int) -> list[torch.Tensor]:
    return [torch.randn(*shape, generator=generator) for _ in range(n)]


def test_the_task_gets_the_runs_own_streams_devices_and_timings(recording_task):
    progress = []
    result = fit("recording", "linear", LoopConfig(), 3, torch.device("cpu"), lambda *a: progress.append(a))
    seen = recording_task
    for got, expected in zip(seen["batches"], draws(torch.Generator().manual_seed(3), 4, 4, 2), strict=True):
        assert torch.equal(got, expected)
    eval_stream = torch.Generator().manual_seed(3 + training.EVAL_SEED_OFFSET)
    for got, expected in zip(seen["eval_inputs"], draws(eval_stream, 2, 4, 2), strict=True):
        assert torch.equal(got, expected)
    reference, feature_stream = Favor(4, m=2), torch.Generator().manual_seed(3 + training.FEATURE_SEED_OFFSET)
    for omega in seen["omegas"]:  # Ω of every step: the run's own feature stream, redrawn before the step
        redraw_random_features(nn.Sequential(reference), feature_stream)
        assert torch.equal(omega, reference.omega)
    assert seen["devices"] == [torch.device("cpu")] * 3 and result.final_evaluation == {"seed": 3.0}
    assert [step for step, _ in progress] == [1, 2, 3, 4]
    assert [(p["step"], p["train_loss"]) for p in result.curve] == [progress[1], progress[3]]
    assert (result.parameters, result.distributed, result.resumed_at) == (6, None, None)
    assert 4 * STEP_SLEEP_S <= result.train_s <= result.wall_s < 60


def test_gradients_are_clipped_to_grad_clip_before_the_optimiser_step(recording_task):
    """Clipped to a norm of 1e-12, a gradient falls far below Adam's eps (1e-8), so the first step of
    lr 1 moves the weights by ~1e-4 instead of ~1."""
    moved = {}
    for clip in (0.0, 1e-12):
        torch.manual_seed(3)
        before = Net().lin.weight.detach().clone()
        fit("recording", "linear", LoopConfig(lr=1.0, max_steps=1, eval_every=1, schedule="constant", grad_clip=clip), 3,
            torch.device("cpu"))
        moved[clip] = (recording_task["trained"][0].lin.weight.detach() - before).abs().max().item()
    assert moved[0.0] > 0.5 and moved[1e-12] < 1e-2


def test_a_run_stopped_and_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(recording_task, tmp_path):
    """Checkpoints every 2 steps (model, Adam's moments, the Noam schedule, the streams): a run stopped
    during step 5 resumes from step 4 and ends with the same weights and curve, bit for bit."""
    config = LoopConfig(max_steps=8, checkpoint_every=2)
    whole = fit("recording", "linear", config, 3, torch.device("cpu"), checkpoint_path=tmp_path / "whole.pt")
    whole_weights = recording_task["trained"][0].state_dict()

    def stop_at_5(step, loss):
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit("recording", "linear", config, 3, torch.device("cpu"), stop_at_5, tmp_path / "cut.pt")
    saved = load_checkpoint(tmp_path / "cut.pt")
    assert (saved["loop"]["step"], saved["loop"]["finished"]) == (4, False)
    assert len(saved["optimizer"]["state"]) == 2 and saved["schedule"]["last_epoch"] == 4
    assert saved["rng"]["ranks"] is None
    resumed = fit("recording", "linear", config, 3, torch.device("cpu"), checkpoint_path=tmp_path / "cut.pt")
    assert resumed.resumed_at == 4 and resumed.curve == whole.curve and resumed.steps == whole.steps == 8
    for name, tensor in recording_task["trained"][0].state_dict().items():
        assert torch.equal(tensor, whole_weights[name]), name
    final = load_checkpoint(tmp_path / "cut.pt")
    assert final["loop"]["finished"] and final["optimizer"] is None and final["schedule"] is None


@dataclass(frozen=True)
class StandInRanks(DistributedContext):
    """A data-parallel group simulated in one process: the other ranks agree with this one (their
    loss is this rank's, their states ``others_rng``) unless one fails at step ``other_fails_at``."""

    other_fails_at: int | None = None
    others_rng: dict | None = None
    calls: list = field(default_factory=list, compare=False)

    def wrap(self, model, device):
        self.calls.append(("wrap", model, device))
        return Wrapped(model)

    def any_rank(self, flag, value, device):
        self.calls.append(("any_rank", flag, value, device))
        steps = sum(call[0] == "any_rank" for call in self.calls)
        return flag or steps == self.other_fails_at, value

    def gather(self, value):
        self.calls.append(("gather", value))
        return [value if rank == self.rank else (self.others_rng or value) for rank in range(self.world_size)]


def test_a_rank_trains_its_wrapped_model_on_its_slice_with_its_own_global_stream(recording_task):
    ranks = StandInRanks(rank=1, local_rank=1, world_size=2, backend="gloo")
    result = fit("recording", "linear", LoopConfig(), 3, torch.device("cpu"), distributed=ranks)
    seen = recording_task
    model = ranks.calls[0][1]
    assert ranks.calls[0] == ("wrap", model, torch.device("cpu")) and isinstance(model, Net)
    assert all(isinstance(trained, Wrapped) and trained.inner is model for trained in seen["trained"])
    for got, batch in zip(seen["batches"], draws(torch.Generator().manual_seed(3), 4, 4, 2), strict=True):
        assert torch.equal(got, batch[2:])  # rank 1 of 2: the second half of the global batch
    steps = [call[1:] for call in ranks.calls if call[0] == "any_rank"]  # one call a step
    assert [(flag, device) for flag, _, device in steps] == [(False, torch.device("cpu"))] * 4
    assert [loss for _, loss, _ in steps][1::2] == [p["train_loss"] for p in result.curve]
    torch.manual_seed(3 + training.RANK_SEED_OFFSET)
    assert torch.equal(seen["global_rng"][0], torch.get_rng_state())
    digest = parameter_digest(model)
    assert result.distributed == {"world_size": 2, "backend": "gloo", "parameter_sha256": [digest, digest]}
    assert result.final_evaluation == {}  # rank 0's job


def test_a_failure_on_another_rank_stops_this_one_at_the_same_step(recording_task):
    ranks = StandInRanks(rank=0, local_rank=0, world_size=2, backend="gloo", other_fails_at=2)
    result = fit("recording", "linear", LoopConfig(), 3, torch.device("cpu"), distributed=ranks)
    assert (result.status, result.diverged_at) == ("diverged", 2)
    assert result.diverged_reason == "training: a non-finite loss or tensor on one of the ranks"


def test_a_batch_that_does_not_split_across_the_ranks_is_refused_in_one_line(recording_task):
    ranks = StandInRanks(rank=0, local_rank=0, world_size=2, backend="gloo")
    with pytest.raises(FwbenchError, match="batch_size: got 3 with 2 processes"):
        fit("recording", "linear", LoopConfig(batch_size=3), 3, torch.device("cpu"), distributed=ranks)


def test_each_ranks_global_stream_is_saved_and_restored_to_that_rank(recording_task, tmp_path):
    """Rank 0 saves every rank's global RNG state; rank 1 resumes with its own; a single process can
    still resume the checkpoint (it has no rank state to restore)."""
    torch.manual_seed(99)
    other = {"torch": torch.get_rng_state()}
    path = tmp_path / "ranks.pt"
    config = LoopConfig(checkpoint_every=2)
    fit("recording", "linear", config, 3, torch.device("cpu"), checkpoint_path=path,
        distributed=StandInRanks(rank=0, local_rank=0, world_size=2, backend="gloo", others_rng=other))
    ranks = load_checkpoint(path)["rng"]["ranks"]
    assert len(ranks) == 2 and set(ranks[0]) == {"torch"} and torch.equal(ranks[1]["torch"], other["torch"])
    fit("recording", "linear", config, 3, torch.device("cpu"), checkpoint_path=path,
        distributed=StandInRanks(rank=1, local_rank=1, world_size=2, backend="gloo"))
    assert torch.equal(torch.get_rng_state(), other["torch"])
    assert fit("recording", "linear", config, 3, torch.device("cpu"), checkpoint_path=path).resumed_at == 4


def test_rank_rng_adds_the_cuda_stream_of_the_ranks_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: ("cuda state of", device))
    device = torch.device("cuda", 1)
    states = training._rank_rng(device)
    assert set(states) == {"torch", "cuda"} and states["cuda"] == ("cuda state of", device)
    assert torch.equal(states["torch"], torch.get_rng_state())
    assert set(training._rank_rng(torch.device("cpu"))) == {"torch"}


class FailingEvaluationTask(RecordingTask):
    """Its second evaluation finds a NaN in an attention input."""

    def evaluate(self, model, config, generator, device):
        if len(self.seen["devices"]) == 1:
            raise NonFiniteError("q holds NaN")
        return super().evaluate(model, config, generator, device)


def test_a_non_finite_tensor_met_in_an_evaluation_ends_the_run_there_as_diverged(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "recording", FailingEvaluationTask())
    result = fit("recording", "linear", LoopConfig(max_steps=8), 3, torch.device("cpu"))
    assert (result.status, result.steps, result.diverged_at) == ("diverged", 4, 4)
    assert result.diverged_reason == "evaluation: q holds NaN"


def test_a_record_keeps_no_absolute_path_of_this_machine(tmp_path, monkeypatch):
    """`--results-dir /abs/…` under the working directory is recorded relative to it, one under the
    home directory as ~/…; other arguments are untouched."""
    home = tmp_path / "home"
    work = home / "repo"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    argv = ["run", "setting2", "--results-dir", str(work / "results" / "paper"), "--data-dir", str(home / "data"),
            "--out", "/elsewhere/reports", "--jobs", "2"]
    assert portable_argv(argv) == ["run", "setting2", "--results-dir", "results/paper", "--data-dir",
                                   str(Path("~") / "data"), "--out", "/elsewhere/reports", "--jobs", "2"]
