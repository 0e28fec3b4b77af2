"""A patience no run can exhaust names one run (issue 14 kind 12, found by h-break14k).

A plateau is declared only at a scheduled evaluation, after ``patience`` of them in a row without a
new best, and the first evaluation is always a best: with n = max_steps // eval_every scheduled
evaluations, every patience of at least n never stops the run. ``patience = [5, 50]`` at
``max_steps = 20``, ``eval_every = 10`` trained one run twice under two ids; the grid loader now
refuses the pair (the run id is unchanged: every stored record keeps its id).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import expand, load_grid
from fwbench.run.training import fit
from fwbench.tasks import RetrievalConfig

CONFIG = RetrievalConfig(setting=1, S=4, d_key=4, batch_size=2, eval_sequences=2, max_steps=4, eval_every=2,
                         target_loss=0.0)
HEAD = ('name = "pat"\ntask = "{task}"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
        "max_steps = 4\neval_every = 2\n")


def test_patience_of_at_least_the_scheduled_evaluations_computes_one_record():
    torch.set_num_threads(1)
    results = [fit("retrieval", "linear", replace(CONFIG, patience=patience), 1, torch.device("cpu"))
               for patience in (2, 50)]
    assert [point["step"] for point in results[0].curve] == [2, 4]
    assert results[0].curve == results[1].curve
    assert results[0].status == results[1].status == "max_steps"
    assert results[0].best_eval == results[1].best_eval


@pytest.mark.parametrize("task", ["retrieval", "mqar"])
def test_a_grid_listing_two_patiences_no_run_exhausts_is_refused(tmp_path, task):
    path = tmp_path / "pat.toml"
    path.write_text(HEAD.format(task=task) + "patience = [2, 50]\n")
    with pytest.raises(FwbenchError, match=r"grid pat profile quick: the run .* appears twice: patience 2 and 50 act "
                                           r"alike \(max_steps=4 with eval_every=2 schedules 2 evaluations, so a "
                                           r"patience of 2 or more never stops the run\)"):
        load_grid(path)


def test_patiences_a_run_can_exhaust_stay_two_runs(tmp_path):
    path = tmp_path / "pat.toml"
    path.write_text(HEAD.format(task="retrieval") + "patience = [1, 2]\n")
    assert len(expand(load_grid(path), "quick")) == 2
    # no scheduled evaluation (eval_every beyond the budget): no patience acts
    path.write_text(HEAD.format(task="retrieval").replace("eval_every = 2", "eval_every = 5") + "patience = [1, 3]\n")
    with pytest.raises(FwbenchError, match=r"patience 1 and 3 act alike \(max_steps=4 with eval_every=5 schedules 0 "
                                           r"evaluations"):
        load_grid(path)
