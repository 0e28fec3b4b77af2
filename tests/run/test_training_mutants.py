"""Values the training loop hands on, checked one by one (issue 14 item 14: the surviving mutants
of ``fwbench/run/training.py``).

A recording task stands in for a real one, so that each test sees exactly what the loop passed
it (streams, device, batches, seed) and can script the evaluation losses; a data-parallel group is
stood in for by :class:`FakeRanks`, a :class:`DistributedContext` whose collective operations are
answered in-process, so that the loop's rank handling runs without a process group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch
from torch import nn

from fwbench import tasks
from fwbench.errors import FwbenchError
from fwbench.run.distributed import DistributedContext, parameter_digest
from fwbench.run.optimization import noam_factor
from fwbench.run.training import (
    EVAL_SEED_OFFSET,
    FEATURE_SEED_OFFSET,
    LoopState,
    _rank_rng,
    _Training,
    fit,
    rank_stream_seed,
    redraw_random_features,
)
from fwbench.variants import Favor, NonFiniteError, build_attention

CPU = torch.device("cpu")
SEED = 4


@dataclass(frozen=True)
class RecordingConfig:
    """Config of :class:`RecordingTask`; no ``checkpoint_every``, ``schedule`` or ``grad_clip`` field."""

    losses: tuple[float, ...] = (1.0,)
    fail_at_evaluation: int | None = None  # the evaluation (0-based) that raises NonFiniteError
    step_sleep_s: float = 0.0  # time the loss takes, so that train_s has something to add up
    batch_size: int = 4
    lr: float = 0.01
    eval_every: int = 2
    patience: int = 10
    target_loss: float = 0.0
    max_steps: int = 5


@dataclass(frozen=True)
class CheckpointedConfig(RecordingConfig):
    """The same with checkpoints every 2 steps and a warm-up schedule (the optional config fields)."""

    checkpoint_every: int = 2
    schedule: str = "noam"
    warmup_steps: int = 4


@dataclass(frozen=True)
class ClippedConfig(RecordingConfig):
    grad_clip: float = 1e-3
    lr: float = 1.0  # large, so that gradients of the squared output are far above the clip


class RecordingModel(nn.Module):
    """A 2 → 2 linear map and a FAVOR+ attention module (not called: it is there for the redraw and
    the NaN check the loop switches on)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.attention = build_attention("favor:m=4", d_key=2)
        self.evaluations = 0

    def forward(self, x):
        return self.linear(x)


@dataclass
class RecordingTask:
    """Task double: records every argument the loop passes and answers with scripted losses."""

    name: ClassVar[str] = "recording"
    config_class: ClassVar[type] = RecordingConfig
    models: list = field(default_factory=list)
    train_calls: list = field(default_factory=list)  # (generator, generator state before the draw)
    batches: list = field(default_factory=list)  # the batch each loss call got
    eval_calls: list = field(default_factory=list)  # (generator, device)
    final_calls: list = field(default_factory=list)  # (model, device, seed)

    def validate(self, config):
        if config.lr <= 0:
            raise ValueError(f"lr: got {config.lr}; expected > 0")

    def build_model(self, config, variant):
        self.models.append(RecordingModel())
        return self.models[-1]

    def train_batch(self, config, generator):
        self.train_calls.append((generator, generator.get_state()))
        return torch.randn(config.batch_size, 2, generator=generator)

    def loss(self, model, x, config):
        self.batches.append(x)
        time.sleep(config.step_sleep_s)
        return model(x).pow(2).mean()

    def evaluate(self, model, config, generator, device):
        self.eval_calls.append((generator, device))
        model = self.models[-1]
        if model.evaluations == config.fail_at_evaluation:
            raise NonFiniteError("attention: q holds a NaN")
        loss = config.losses[min(model.evaluations, len(config.losses) - 1)]
        model.evaluations += 1
        return {"loss": loss, "weight_sum": float(model.linear.weight.detach().sum())}

    def final_evaluation(self, model, config, device, seed):
        self.final_calls.append((model, device, seed))
        return {"metrics": {"final": 1.0}}


@pytest.fixture
def task(monkeypatch) -> RecordingTask:
    recording = RecordingTask()
    monkeypatch.setitem(tasks.TASKS, "recording", recording)
    return recording


@dataclass(frozen=True)
class FakeRanks(DistributedContext):
    """A data-parallel context answered in-process: every other rank reports what this one does
    (``gather`` repeats this rank's value, ``any_rank`` averages equal values), unless
    ``other_rank_fails``; ``wrap`` puts the model in a :class:`Wrapped` and records the call."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 2
    backend: str = "gloo"
    other_rank_fails: bool = False
    calls: dict = field(default_factory=lambda: {"wrap": [], "any_rank": [], "gather": []}, compare=False)

    def wrap(self, model, device):
        self.calls["wrap"].append((model, device))
        return Wrapped(model)

    def any_rank(self, flag, value, device):
        self.calls["any_rank"].append((flag, value, device))
        # the real mean over ranks: a failing rank contributes 0
        return bool(flag) or self.other_rank_fails, value / 2 if self.other_rank_fails else value

    def gather(self, value):
        self.calls["gather"].append(value)
        return [value] * self.world_size


class Wrapped(nn.Module):
    """Stands in for DistributedDataParallel: counts the forward calls made through it."""

    def __init__(self, module):
        super().__init__()
        self.module, self.forwards = module, 0

    def forward(self, x):
        self.forwards += 1
        return self.module(x)


# --- the loop's bookkeeping ---------------------------------------------------------------------


def test_progress_gets_every_step_and_its_loss_and_the_curve_keeps_that_loss(task):
    progress: list[tuple[int, float]] = []
    result = fit("recording", "x", RecordingConfig(max_steps=5), SEED, CPU,
                 on_progress=lambda step, loss: progress.append((step, loss)))
    assert [step for step, _ in progress] == [1, 2, 3, 4, 5]
    assert all(isinstance(loss, float) and loss > 0 for _, loss in progress)
    losses = dict(progress)
    assert [(p["step"], p.get("train_loss")) for p in result.curve] == [(2, losses[2]), (4, losses[4]), (5, None)]


def test_an_evaluation_equal_to_the_best_is_not_a_new_best(task):
    result = fit("recording", "x", RecordingConfig(losses=(1.0, 1.0, 1.0), max_steps=6), SEED, CPU)
    assert result.best_step == 2 and result.status == "max_steps"


def test_the_evaluation_after_the_budget_never_stops_the_run_as_a_plateau(task):
    """Best at step 2, worse at the budget's extra evaluation (step 3) with patience 1: still max_steps."""
    config = RecordingConfig(losses=(1.0, 2.0), patience=1, eval_every=2, max_steps=3)
    result = fit("recording", "x", config, SEED, CPU)
    assert result.status == "max_steps" and result.steps == 3
    assert [p["step"] for p in result.curve] == [2, 3] and result.best_step == 2


def test_a_non_finite_tensor_in_an_evaluation_ends_the_run_there(task):
    config = RecordingConfig(fail_at_evaluation=1, eval_every=2, max_steps=10)
    result = fit("recording", "x", config, SEED, CPU)
    assert (result.status, result.steps, result.diverged_at) == ("diverged", 4, 4)
    assert result.diverged_reason == "evaluation: attention: q holds a NaN"
    assert result.final_evaluation == {}  # a diverged run gets no final evaluation


def test_the_task_gets_the_runs_streams_device_and_seed(task):
    result = fit("recording", "x", RecordingConfig(max_steps=4), SEED, CPU)
    train_generators = {id(generator) for generator, _ in task.train_calls}
    eval_generators = {id(generator) for generator, _ in task.eval_calls}
    assert len(train_generators) == len(eval_generators) == 1 and train_generators != eval_generators
    assert task.train_calls[0][1].equal(torch.Generator().manual_seed(SEED).get_state())
    assert task.eval_calls[0][0].initial_seed() == SEED + EVAL_SEED_OFFSET
    assert {device for _, device in task.eval_calls} == {CPU}
    assert task.final_calls == [(task.models[0], CPU, SEED)]
    assert result.final_evaluation == {"metrics": {"final": 1.0}}


def test_features_are_redrawn_from_their_own_stream_not_torchs_global_one(task):
    run = _Training("recording", "x", RecordingConfig(), SEED, CPU, True, None, None)
    assert run.generators["features"].initial_seed() == SEED + FEATURE_SEED_OFFSET
    global_state = torch.get_rng_state()
    run.train_step(LoopState())
    assert torch.equal(torch.get_rng_state(), global_state)  # the loss draws nothing, neither may the redraw
    expected = Favor(2, m=4)
    redraw_random_features(nn.Sequential(expected), torch.Generator().manual_seed(SEED + FEATURE_SEED_OFFSET))
    assert torch.equal(run.model.attention.feature_map.omega, expected.omega)


def test_the_result_counts_parameters_and_adds_up_training_time(task):
    """Three steps of at least 30 ms each: train_s ≥ 90 ms and never more than the run's wall time."""
    result = fit("recording", "x", RecordingConfig(max_steps=3, eval_every=3, step_sleep_s=0.03), SEED, CPU)
    assert result.parameters == 2 * 2 + 2
    assert 0.09 <= result.train_s <= result.wall_s < 60
    assert result.distributed is None and result.resumed_at is None


def test_elapsed_adds_this_process_time_to_the_earlier_processes_time():
    loop = LoopState(wall_s=5.0)
    assert 5.0 <= loop.elapsed() < 6.0


def test_the_nan_check_of_every_attention_module_is_on_by_default(task):
    fit("recording", "x", RecordingConfig(max_steps=1), SEED, CPU)
    fit("recording", "x", RecordingConfig(max_steps=1), SEED, CPU, check_finite=False)
    assert [model.attention.check_finite for model in task.models] == [True, False]


def test_a_bad_config_built_in_code_is_one_error_naming_the_task(task):
    with pytest.raises(FwbenchError) as raised:
        fit("recording", "x", RecordingConfig(lr=-1.0), SEED, CPU)
    assert str(raised.value) == "recording config: lr: got -1.0; expected > 0"


def test_the_schedule_and_the_gradient_clip_reach_the_optimiser(task):
    scheduled = _Training("recording", "x", CheckpointedConfig(), SEED, CPU, True, None, None)
    lr = scheduled.optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(0.01 * noam_factor(1, 4))
    scheduled.train_step(LoopState())
    assert scheduled.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * noam_factor(2, 4))
    clipped = _Training("recording", "x", ClippedConfig(), SEED, CPU, True, None, None)
    clipped.train_step(LoopState())
    norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in clipped.model.parameters()]))
    assert norm <= 1e-3 * (1 + 1e-5)


# --- checkpoints ---------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def test_checkpoints_are_written_every_checkpoint_every_steps_and_slimmed_at_the_end(task, tmp_path):
    """checkpoint_every 2, budget 5: on_progress at step s sees the checkpoint of the last even step
    before s (saving follows the progress call); the final one is marked finished, without optimiser
    and schedule."""
    path = tmp_path / "run.pt"
    seen: list = []

    def look(step, loss):
        saved = torch.load(path, weights_only=True) if path.exists() else None
        seen.append(None if saved is None else (saved["loop"]["step"], saved["loop"]["finished"],
                                                saved["optimizer"] is not None, saved["schedule"] is not None))

    fit("recording", "x", CheckpointedConfig(eval_every=5, max_steps=5), SEED, CPU, on_progress=look,
        checkpoint_path=path)
    assert seen == [None, None, (2, False, True, True), (2, False, True, True), (4, False, True, True)]
    final = torch.load(path, weights_only=True)
    assert (final["loop"]["step"], final["loop"]["finished"], final["optimizer"], final["schedule"]) == (5, True, None, None)


def test_a_config_without_checkpoint_every_writes_no_checkpoint(task, tmp_path):
    fit("recording", "x", RecordingConfig(max_steps=3), SEED, CPU, checkpoint_path=tmp_path / "run.pt")
    assert not (tmp_path / "run.pt").exists()


def test_a_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(task, tmp_path):
    """Adam's moments and the warm-up schedule are restored: the weights (in each evaluation) agree
    exactly with a run that was never stopped."""
    config = CheckpointedConfig(eval_every=2, max_steps=7)
    whole = fit("recording", "x", config, SEED, CPU, checkpoint_path=tmp_path / "a.pt")

    def die_at_3(step, loss):
        if step == 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        fit("recording", "x", config, SEED, CPU, on_progress=die_at_3, checkpoint_path=tmp_path / "b.pt")
    resumed = fit("recording", "x", config, SEED, CPU, checkpoint_path=tmp_path / "b.pt")
    assert resumed.resumed_at == 2 and whole.resumed_at is None
    assert resumed.curve == whole.curve and resumed.final_eval == whole.final_eval


# --- data-parallel ranks ---------------------------------------------------------------------------


def test_a_rank_above_0_reseeds_its_dropout_stream_after_building_the_model(task):
    _Training("recording", "x", RecordingConfig(), SEED, CPU, True, FakeRanks(rank=1), None)
    assert torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(rank_stream_seed(SEED, 1)).get_state())
    assert torch.equal(task.models[0].linear.weight, _seeded_weight(SEED))  # the same initial weights on every rank


def _seeded_weight(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return RecordingModel().linear.weight


def test_a_global_batch_that_does_not_split_across_the_ranks_is_refused(task):
    with pytest.raises(FwbenchError, match="batch_size: got 3 with 2 processes"):
        _Training("recording", "x", RecordingConfig(batch_size=3), SEED, CPU, True, FakeRanks(), None)


def test_each_rank_trains_its_slice_of_the_global_batch_through_the_wrapped_model(task):
    ranks = FakeRanks(rank=1)
    run = _Training("recording", "x", RecordingConfig(), SEED, CPU, True, ranks, None)
    assert ranks.calls["wrap"] == [(run.model, CPU)] and isinstance(run.trained, Wrapped)
    loss = run.train_step(LoopState())
    assert run.trained.forwards == 1
    global_batch = torch.randn(4, 2, generator=torch.Generator().manual_seed(SEED))
    assert torch.equal(task.batches[0], global_batch[2:])
    assert ranks.calls["any_rank"] == [(False, loss, CPU)]


def test_a_failure_on_another_rank_stops_this_one_at_the_same_step(task):
    result = fit("recording", "x", RecordingConfig(), SEED, CPU, distributed=FakeRanks(other_rank_fails=True))
    assert (result.status, result.steps, result.diverged_at) == ("diverged", 1, 1)
    assert result.diverged_reason == "training: a non-finite loss or tensor on one of the ranks"


def test_a_data_parallel_result_names_the_group_and_each_ranks_parameters(task):
    result = fit("recording", "x", RecordingConfig(max_steps=2), SEED, CPU, distributed=FakeRanks())
    digest = parameter_digest(task.models[0])
    assert result.distributed == {"world_size": 2, "backend": "gloo", "parameter_sha256": [digest, digest]}


def test_a_checkpoint_keeps_every_ranks_dropout_stream(task, tmp_path):
    fit("recording", "x", CheckpointedConfig(max_steps=2), SEED, CPU, checkpoint_path=tmp_path / "run.pt",
        distributed=FakeRanks())
    rng = torch.load(tmp_path / "run.pt", weights_only=True)["rng"]
    assert len(rng["ranks"]) == 2
    for rank in rng["ranks"]:  # gathered at the moment of saving: the global stream of that moment
        assert rank.keys() == {"torch"} and torch.equal(rank["torch"], rng["torch"])


def _resume_with(task, tmp_path, ranks: list | None, distributed: FakeRanks | None) -> torch.Tensor:
    """The global RNG state after resuming from a checkpoint whose ``rng.ranks`` is ``ranks``."""
    path, config = tmp_path / "run.pt", CheckpointedConfig(max_steps=2, batch_size=6)  # splits over 2 or 3
    fit("recording", "x", config, SEED, CPU, checkpoint_path=path)
    saved = torch.load(path, weights_only=True)
    saved["rng"]["ranks"] = ranks
    saved["loop"]["finished"] = False
    torch.save(saved, path)
    run = _Training("recording", "x", config, SEED, CPU, True, distributed, path)
    loop = run.resume()
    assert loop.resumed_at == 2
    return torch.get_rng_state()


def test_a_resumed_rank_continues_its_own_dropout_stream(task, tmp_path):
    streams = [{"torch": torch.Generator().manual_seed(seed).get_state()} for seed in (10, 11)]
    assert torch.equal(_resume_with(task, tmp_path, streams, FakeRanks(rank=1)), streams[1]["torch"])


@pytest.mark.parametrize("distributed", [None, FakeRanks(rank=0, world_size=3)], ids=["one process", "rank 0"])
def test_rank_streams_of_another_group_size_are_not_restored(task, tmp_path, distributed):
    """Resumed on one process, or as rank 0 of 3 ranks from a 2-rank checkpoint: the saved global stream."""
    streams = [{"torch": torch.Generator().manual_seed(seed).get_state()} for seed in (10, 11)]
    path = tmp_path / "run.pt"
    after = _resume_with(task, tmp_path, streams, distributed)
    assert torch.equal(after, torch.load(path, weights_only=True)["rng"]["torch"])


@pytest.mark.parametrize("ranks, rank", [(None, 1), (2, 1), (2, 2)], ids=["one-process file", "2 to 3, rank 1", "2 to 3, rank 2"])
def test_a_rank_without_its_stream_in_the_checkpoint_starts_its_own_not_rank_0s(task, tmp_path, ranks, rank):
    """A checkpoint of one process (no rank streams), or of 2 ranks, resumed on 3 ranks: every rank
    took the file's global stream (rank 0's), so all ranks drew the same dropout masks from the resumed
    step on (6 of 6 equal in a 2-rank LM run resumed from a one-process checkpoint). A rank above 0
    starts the stream of its rank at the resumed step (2) instead."""
    streams = None if ranks is None else [{"torch": torch.Generator().manual_seed(s).get_state()} for s in range(ranks)]
    after = _resume_with(task, tmp_path, streams, FakeRanks(rank=rank, world_size=3))
    assert not torch.equal(after, torch.load(tmp_path / "run.pt", weights_only=True)["rng"]["torch"])
    assert torch.equal(after, torch.Generator().manual_seed(rank_stream_seed(SEED, rank, 2)).get_state())


def test_a_ranks_stream_is_no_stream_of_another_seed_or_rank():
    """``seed + rank · 3_000_017`` gave rank 1 of seed s the stream of seed s + 3_000_017 (its data and
    initial weights) and rank 2 of seed s that of rank 1 of seed s + 3_000_017. torch's CPU generator
    reads the seed's low 32 bits, so those are compared: rank streams of seeds 0-199, ranks 1-7 and
    steps 0-4 are all distinct and at least 2**31, above every stream of a run seeded below
    2**31 - 2_000_003."""
    low = [rank_stream_seed(seed, rank, step) % 2**32 for seed in range(200) for rank in range(1, 8) for step in range(5)]
    assert len(set(low)) == len(low) and min(low) >= 2**31
    one, two = torch.Generator(), torch.Generator()
    one.manual_seed(rank_stream_seed(1, 1))
    two.manual_seed(1 + 3_000_017)
    assert not torch.equal(torch.rand(8, generator=one), torch.rand(8, generator=two))
    assert rank_stream_seed(5, 1) != rank_stream_seed(5, 2) != rank_stream_seed(6, 1)
    with pytest.raises(ValueError, match="seed, rank, step: got 1, -1, 0"):
        rank_stream_seed(1, -1)


def test_rank_rng_adds_the_cuda_stream_of_the_ranks_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: ("cuda state of", device))
    device = torch.device("cuda", 1)
    states = _rank_rng(device)
    assert set(states) == {"torch", "cuda"} and states["cuda"] == ("cuda state of", device)
    assert torch.equal(states["torch"], torch.get_rng_state())
    assert set(_rank_rng(torch.device("cpu"))) == {"torch"}
