"""The device the training loop builds its model on (issue 14 item 14: a surviving mutant of
``fwbench/run/training.py`` moved the model to no device). No GPU is needed: the meta device stands
in for one (its tensors have a device and a shape but no data, so the run is built, never stepped)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

from fwbench import tasks
from fwbench.run.training import _Training


@dataclass(frozen=True)
class _Config:
    """What building a run reads: the optimiser's rate (no schedule, no checkpoints)."""

    lr: float = 0.01


class _BuildOnlyTask:
    """Task double that only builds a model (on the CPU, as every task's ``build_model`` does)."""

    name: ClassVar[str] = "build_only"
    config_class: ClassVar[type] = _Config

    def validate(self, config):
        pass

    def build_model(self, config, variant):
        return nn.Sequential(nn.Linear(2, 3), nn.LayerNorm(3))


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
