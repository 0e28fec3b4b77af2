"""The LM's ``checkpoint_every`` says where a run can resume from, not what it computes: two values
are one computation, so a grid listing both is refused (issue 14 kind 12)."""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec, expand, load_grid


def test_an_lm_grid_varying_only_checkpoint_every_is_refused(tmp_path):
    """The run id still hashes it (every stored LM record was keyed with it), so the grid refuses the pair."""
    path = tmp_path / "lm.toml"
    path.write_text('name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
                    "checkpoint_every = [0, 125]\n")
    with pytest.raises(FwbenchError, match=r"appears twice: checkpoint_every 0 and 125 act alike"):
        load_grid(path)
    path.write_text(path.read_text().replace("checkpoint_every = [0, 125]", "checkpoint_every = 125\nlr = [1e-3, 2e-3]"))
    assert len(expand(load_grid(path), "quick")) == 2


@pytest.mark.slow
def test_checkpoints_change_nothing_a_run_records(tmp_path):
    from fwbench.run.execute import execute
    from fwbench.tasks.corpus import CorpusError, locate_corpus

    try:
        locate_corpus(None, download=False)
    except CorpusError:
        pytest.skip("the Tiny Shakespeare corpus is not available here")
    config = {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "context": 16, "batch_size": 4, "max_steps": 5,
              "eval_every": 2, "eval_segments": 2, "stream_eval": False, "sample_tokens": 5, "dropout": 0.1}
    records = [execute(RunSpec("g", "shakespeare", "linear", 1, {**config, "checkpoint_every": every}),
                       torch.device("cpu"), checkpoint=tmp_path / f"{every}.pt") for every in (0, 2)]
    assert (tmp_path / "2.pt").is_file() and not (tmp_path / "0.pt").exists()
    assert records[0]["metrics"] == records[1]["metrics"] and records[0]["curve"] == records[1]["curve"]
    assert records[0]["final_evaluation"]["sample"] == records[1]["final_evaluation"]["sample"]
