"""More of the validation split than it holds scores all of it, as 0 does: a grid listing both is
refused (issue 14 kind 12)."""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec, expand, load_grid


@pytest.mark.parametrize("axis, message", [
    ("eval_segments = [0, 100000]", r"eval_segments 0 and 100000 act alike \(the validation split has 872 segments "),
    ("stream_characters = [200000, 0]", r"stream_characters 200000 and 0 act alike \(the validation split has 111540 "),
    ("train_fraction = [0.9, 0.9000001]", r"train_fraction 0.9 and 0.9000001 act alike \(a training split of "
                                          r"int\(train_fraction × 1115394\) = 1003854 characters\)"),
])
def test_an_lm_grid_asking_for_more_of_the_validation_split_than_it_holds_is_refused(tmp_path, axis, message):
    """On the Tiny Shakespeare corpus (known by its checksum: 111,540 validation characters, 872 segments of
    128) more segments or characters than the split holds score all of it, as 0 does: two ids, one run."""
    path = tmp_path / "lm.toml"
    head = 'name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
    path.write_text(head + axis + "\n")
    with pytest.raises(FwbenchError, match=message):
        load_grid(path)
    path.write_text(head + "eval_segments = [0, 64]\nstream_characters = [0, 8192]\n")
    assert len(expand(load_grid(path), "quick")) == 4
    path.write_text(head + "train_fraction = [0.9, 0.9000005]\n")  # splits at 1003854 and 1003855
    assert len(expand(load_grid(path), "quick")) == 2


def test_train_fractions_that_round_to_one_split_read_the_same_characters():
    from fwbench.tasks.corpus import CorpusError, locate_corpus
    from fwbench.tasks.shakespeare import ShakespeareTask

    try:
        locate_corpus(None, download=False)
    except CorpusError:
        pytest.skip("the Tiny Shakespeare corpus is not available here")
    task = ShakespeareTask()
    first, second, third = (task.corpus(f) for f in (0.9, 0.9000001, 0.9000005))
    assert first.train.numel() == 1003854
    assert torch.equal(first.train, second.train) and torch.equal(first.valid, second.valid)
    assert third.train.numel() == 1003855


@pytest.mark.slow
def test_more_evaluation_segments_than_the_split_holds_score_what_0_scores():
    from fwbench.run.execute import execute
    from fwbench.tasks.corpus import CorpusError, locate_corpus

    try:
        locate_corpus(None, download=False)
    except CorpusError:
        pytest.skip("the Tiny Shakespeare corpus is not available here")
    config = {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16, "context": 64, "batch_size": 4, "max_steps": 2,
              "eval_every": 2, "stream_eval": False, "sample_tokens": 0, "checkpoint_every": 0}
    records = [execute(RunSpec("g", "shakespeare", "linear", 1, {**config, "eval_segments": n}), torch.device("cpu"))
               for n in (0, 10**6)]
    assert records[0]["curve"] == records[1]["curve"] and records[0]["metrics"] == records[1]["metrics"]
