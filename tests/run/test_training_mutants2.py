"""The device the training loop puts its model, batches and checkpoints on (issue 14 item 14:
surviving mutants of ``fwbench/run/training.py`` left them where they were, which only a GPU run
notices). No GPU is needed: the meta device stands in for one where a run is only built (its tensors
have a device and a shape but no data), and a recorder of the device the loop asks for where it
steps or resumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

from fwbench import tasks
from fwbench.run import training
from fwbench.run.training import LoopState, _Training


@dataclass(frozen=True)
class _Config:
    """What building a run reads: the optimiser's rate (no schedule, no checkpoints)."""

    lr: float = 0.01


@dataclass(frozen=True)
class _CheckpointedConfig(_Config):
    checkpoint_every: int = 2


class _BuildOnlyTask:
    """Task double that builds a model (on the CPU, as every task's ``build_model`` does) and
    trains it on a batch of ones."""

    name: ClassVar[str] = "build_only"
    config_class: ClassVar[type] = _Config

    def validate(self, config):
        pass

    def build_model(self, config, variant):
        return nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3))

    def train_batch(self, config, generator):
        return torch.ones(4, 2)

    def loss(self, model, batch, config):
        return model(batch).pow(2).mean()


@pytest.fixture
def build_only_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "build_only", _BuildOnlyTask())


def test_the_run_moves_its_model_to_the_device_it_was_given(build_only_task):
    """Every parameter and buffer of the built model, and the module the loss runs through, are on
    the run's device (meta here), with their shapes; the optimiser holds those parameters."""
    run = _Training("build_only", "x", _Config(), 0, torch.device("meta"), True, None, None)
    tensors = [*run.model.parameters(), *run.model.buffers()]
    assert {t.device.type for t in tensors} == {"meta"}
    assert [tuple(p.shape) for p in run.model.parameters()] == [(3, 2), (3,), (3,), (3,)]
    assert run.trained is run.model
    assert [p for group in run.optimizer.param_groups for p in group["params"]] == list(run.model.parameters())


def test_a_step_moves_its_batch_and_a_resume_maps_its_checkpoint_to_the_runs_device(build_only_task, monkeypatch,
                                                                                     tmp_path):
    """The batch of a step goes to the run's device, and a checkpoint is loaded onto it (its
    ``map_location``): the loop asks for exactly that device ("cpu", index 0 here) each time."""
    device = torch.device("cpu", 0)
    asked = []

    def recording_to_device(batch, to):
        asked.append(("batch", to))
        return batch.to(to)

    def recording_load_checkpoint(path, map_location="default", remedy=""):
        asked.append(("checkpoint", map_location))
        return None  # no checkpoint yet: a fresh loop

    monkeypatch.setattr(training, "to_device", recording_to_device)
    monkeypatch.setattr(training, "load_checkpoint", recording_load_checkpoint)
    run = _Training("build_only", "x", _CheckpointedConfig(), 0, device, True, None, tmp_path / "run.pt")
    loop = run.resume()
    loss = run.train_step(loop)
    assert asked == [("checkpoint", device), ("batch", device)]
    assert loop.step == 1 and loss is not None and loss > 0


class _TwoBranchTask(_BuildOnlyTask):
    """Its loss reads both layers of the model on the first step and only the first layer after."""

    name: ClassVar[str] = "two_branch"

    def __init__(self):
        self.steps = 0

    def build_model(self, config, variant):
        return nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})

    def loss(self, model, batch, config):
        self.steps += 1
        out = model["a"](batch) + (model["b"](batch) if self.steps == 1 else 0.0)
        return out.pow(2).mean()


def test_a_step_leaves_a_layer_without_a_gradient_where_it_is(monkeypatch):
    """Gradients are cleared to none before each backward: a layer the second step's loss does not
    read has no gradient then, so Adam skips it and it keeps its weights (zeroed gradients instead
    would let Adam's first-step momentum move it again)."""
    monkeypatch.setitem(tasks.TASKS, "two_branch", _TwoBranchTask())
    run = _Training("two_branch", "x", _Config(), 0, torch.device("cpu"), True, None, None)
    loop = LoopState()
    run.train_step(loop)
    after_first = {name: p.detach().clone() for name, p in run.model.named_parameters()}
    run.train_step(loop)
    for name, p in run.model.named_parameters():
        assert torch.equal(p, after_first[name]) == name.startswith("b."), name
