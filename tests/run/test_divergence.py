"""A run that goes non-finite is recorded as diverged, with the step and the reason, and the
optimiser never applies a non-finite update; the grid goes on (see also ``test_bad_input[H01]``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

from fwbench import tasks, variants
from fwbench.run.training import fit


@dataclass(frozen=True)
class FaultConfig:
    """``fault`` at training step ``at``: nan_loss | inf_grad | nan_eval | nan_input."""

    fault: str = "nan_loss"
    at: int = 3
    batch_size: int = 2
    lr: float = 0.01
    eval_every: int = 2
    patience: int = 10
    target_loss: float = 0.0
    max_steps: int = 8


class FaultTask:
    name: ClassVar[str] = "fault"
    config_class: ClassVar[type] = FaultConfig

    def validate(self, config):
        pass

    def build_model(self, config, variant):
        model = nn.Module()
        model.proj = nn.Linear(4, 4)
        model.attention = variants.build_attention(variant, 4)
        model.steps = 0
        return model

    def train_batch(self, config, generator):
        return torch.randn(config.batch_size, 1, 3, 4, generator=generator)

    def loss(self, model, x, config):
        model.steps += 1
        hit = model.steps >= config.at
        q = model.proj(x)
        if hit and config.fault == "nan_input":
            q = q * float("nan")
        y, _ = model.attention(q, q, x, form="chunk")
        loss = y.pow(2).mean()
        if hit and config.fault == "nan_loss":
            return loss * float("nan")
        if hit and config.fault == "inf_grad":
            # finite value, infinite gradient: d/dp sqrt(p - p) at 0
            return loss + (model.proj.weight.sum() - model.proj.weight.sum().detach()).abs().sqrt()
        return loss

    def evaluate(self, model, config, generator, device):
        return {"loss": float("nan") if config.fault == "nan_eval" and model.steps >= config.at else 1.0}


@pytest.fixture(autouse=True)
def fault_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "fault", FaultTask())


@pytest.mark.parametrize(
    ("fault", "check_finite", "step", "reason"),
    [
        ("nan_loss", True, 3, "training loss is nan"),
        ("inf_grad", True, 3, "non-finite gradient (not applied)"),
        ("nan_eval", True, 4, "evaluation loss is nan"),  # evaluations at steps 2, 4, …
        ("nan_input", True, 3, "training: q: got nan at index"),
        ("nan_input", False, 3, "training loss is nan"),  # without the check the loss still catches it
    ],
)
def test_non_finite_run_is_diverged_with_step_and_reason(fault, check_finite, step, reason):
    result = fit("fault", "linear", FaultConfig(fault=fault, at=3), seed=1, device=torch.device("cpu"),
                 check_finite=check_finite)
    assert result.status == "diverged"
    assert result.diverged_at == step and result.steps == step
    assert result.diverged_reason.startswith(reason)


def test_non_finite_gradient_is_never_applied(monkeypatch):
    models = []
    build = FaultTask.build_model
    monkeypatch.setattr(FaultTask, "build_model", lambda self, c, v: models.append(build(self, c, v)) or models[-1])
    config = FaultConfig(fault="inf_grad", at=3)
    fit("fault", "linear", config, seed=1, device=torch.device("cpu"))
    after_diverging = {k: v.clone() for k, v in models[0].state_dict().items()}
    fit("fault", "linear", FaultConfig(fault="none", max_steps=2), seed=1, device=torch.device("cpu"))
    after_two_good_steps = models[1].state_dict()
    for name, value in after_diverging.items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(value, after_two_good_steps[name]), name  # step 3's update was dropped


def test_healthy_run_is_not_diverged():
    result = fit("fault", "linear", FaultConfig(fault="none"), seed=1, device=torch.device("cpu"))
    assert result.status == "max_steps" and result.diverged_at is None and result.diverged_reason is None


def test_the_finite_check_passes_a_sum_that_overflows_on_finite_values_and_names_a_nan():
    """The check's fast path reads one sum per tensor; a sum that overflows on finite values must
    not be reported, and a NaN anywhere must be found and located exactly."""
    import pytest

    from fwbench.variants.checks import check_finite
    from fwbench.variants.errors import NonFiniteError

    check_finite(q=torch.full((8,), 3e38), k=torch.full((4,), 6e4, dtype=torch.float16), beta=None)
    x = torch.zeros(2, 3, 4)
    x[1, 2, 3] = float("-inf")
    with pytest.raises(NonFiniteError, match=r"v: got -inf at index \(1, 2, 3\)"):
        check_finite(q=torch.zeros(2), v=x)


def test_gradient_check_finds_nan_and_inf_and_passes_sums_that_overflow():
    from fwbench.run.training import _gradients_finite

    model = nn.Linear(3, 2)
    assert _gradients_finite(model)  # no gradients yet
    for weight in (1.0, 3.0e38):  # 3e38: finite, but the sum overflows fp32 (the exact check decides)
        for bad, finite in [(float("nan"), False), (float("inf"), False), (-float("inf"), False), (2.0, True)]:
            model.weight.grad = torch.full((2, 3), weight)
            model.bias.grad = torch.tensor([1.0, bad])
            assert _gradients_finite(model) is finite, (weight, bad)
    sparse = nn.Embedding(4, 3, sparse=True)
    sparse(torch.tensor([1, 2])).sum().backward()
    assert _gradients_finite(sparse)
    sparse.weight.grad = torch.sparse_coo_tensor([[1]], [[float("nan"), 0.0, 0.0]], (4, 3), check_invariants=True)
    assert not _gradients_finite(sparse)


def test_a_diverged_runs_final_evaluation_is_the_last_before_diverged_at_or_the_non_finite_one():
    """As the module docstring says: a run diverged by its training loss keeps its last evaluation
    before ``diverged_at`` as the final one; a run whose evaluation loss went non-finite ends on that
    evaluation, at ``diverged_at`` (evaluations at steps 2, 4, …)."""
    by_loss = fit("fault", "linear", FaultConfig(fault="nan_loss", at=3), seed=1, device=torch.device("cpu"))
    assert by_loss.diverged_at == 3 and by_loss.curve[-1]["step"] == 2 and by_loss.final_eval == {"loss": 1.0}
    by_eval = fit("fault", "linear", FaultConfig(fault="nan_eval", at=3), seed=1, device=torch.device("cpu"))
    assert by_eval.diverged_at == 4 and by_eval.curve[-1]["step"] == 4
    assert math.isnan(by_eval.final_eval["loss"]) and by_eval.best_eval == {"loss": 1.0}
