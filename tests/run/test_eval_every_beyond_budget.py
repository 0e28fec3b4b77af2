"""``eval_every`` beyond ``max_steps`` names one run (issue 14.12, found by h-break14g).

No value above the budget reaches a scheduled evaluation: the loop evaluates the model it ends with
at its last step, and that is all. ``eval_every = [7, 1000]`` with ``max_steps = 6`` trained the same
run twice under two ids (records equal but for the config); the run id now hashes every such value as
``max_steps + 1`` and the grid loader refuses the pair. ``eval_every = max_steps`` stays a run of its
own: its evaluation is the scheduled one, whose curve point holds the step's training loss.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec, expand, load_grid
from fwbench.run.training import fit
from fwbench.tasks import MQARConfig, RetrievalConfig

RETRIEVAL = RetrievalConfig(setting=1, S=4, d_key=4, batch_size=2, eval_sequences=2, max_steps=6, target_loss=0.0)


def run_id(task: str, config) -> str:
    return RunSpec("g", task, "linear", 1, asdict(config)).run_id


@pytest.mark.parametrize(("task", "config"), [
    ("retrieval", RETRIEVAL),
    ("mqar", MQARConfig(vocab_size=16, seq_len=8, num_kv_pairs=2, d_model=8, max_steps=6)),
])
def test_every_eval_every_beyond_the_budget_has_one_run_id(task, config):
    beyond = {run_id(task, replace(config, eval_every=every)) for every in (7, 8, 1000, 2**40)}
    assert len(beyond) == 1
    assert run_id(task, replace(config, eval_every=6)) not in beyond
    assert run_id(task, replace(config, eval_every=5)) != run_id(task, replace(config, eval_every=6))


def test_runs_with_eval_every_beyond_the_budget_compute_the_same_record():
    torch.set_num_threads(1)
    results = [fit("retrieval", "linear", replace(RETRIEVAL, eval_every=every), 1, torch.device("cpu"))
               for every in (7, 1000)]
    assert results[0].curve == results[1].curve
    assert [point["step"] for point in results[0].curve] == [6]
    assert results[0].best_eval == results[1].best_eval and results[0].status == results[1].status == "max_steps"
    on_schedule = fit("retrieval", "linear", replace(RETRIEVAL, eval_every=6), 1, torch.device("cpu"))
    assert "train_loss" in on_schedule.curve[-1] and "train_loss" not in results[0].curve[-1]


def test_a_grid_varying_eval_every_beyond_the_budget_is_refused(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\ntask = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nS = 4\n'
                    "max_steps = 6\neval_every = [6, 7, 1000]\n")
    with pytest.raises(FwbenchError, match=r"eval_every \(7 and 1000\) has no effect: both exceed max_steps=6"):
        load_grid(grid)
    grid.write_text(grid.read_text().replace("[6, 7, 1000]", "[5, 6, 7]"))
    assert [spec.config["eval_every"] for spec in expand(load_grid(grid), "quick")] == [5, 6, 7]
