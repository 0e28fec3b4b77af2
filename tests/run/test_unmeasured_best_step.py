"""A run that diverged before its first evaluation has no best step: its record holds null there, as
for its best loss (issue 14 kind 5, found by h-break14k: ``lr = 1e12`` diverged at step 2 of an
every-2 schedule and the record said ``"best_eval_loss": null, "best_step": 0``, a step that was never
measured)."""

from __future__ import annotations

import json

import torch

from fwbench.run.execute import execute
from fwbench.run.grid import RunSpec
from fwbench.run.strict_json import strict_dumps

CONFIG = {"S": 3, "d_key": 4, "batch_size": 2, "eval_sequences": 2, "eval_every": 2, "max_steps": 4}


def test_a_run_diverged_before_its_first_evaluation_records_no_best_step():
    torch.set_num_threads(1)
    record = execute(RunSpec("g", "retrieval", "dpfp:nu=1", 1, {**CONFIG, "lr": 1e12}), torch.device("cpu"))
    assert record["status"] == "diverged" and record["diverged_at"] == 2 and record["curve"] == []
    metrics = json.loads(strict_dumps(record))["metrics"]
    assert metrics["best_eval_loss"] is None and metrics["best_step"] is None


def test_an_evaluated_run_records_its_best_step():
    torch.set_num_threads(1)
    record = execute(RunSpec("g", "retrieval", "linear", 1, {**CONFIG, "lr": 1e-3}), torch.device("cpu"))
    assert record["status"] == "max_steps"
    best = min(record["curve"], key=lambda point: point["eval_loss"])
    assert record["metrics"]["best_step"] == best["step"] in (2, 4)
