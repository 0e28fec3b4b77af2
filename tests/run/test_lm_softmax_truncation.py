"""Truncated BPTT cuts nothing for softmax: the language model empties softmax's KV cache at every
segment boundary, so the segments of a training sequence share no state and no gradient crosses
them. ``truncated_bptt = [false, true]`` with ``train_segments = 2`` trained one softmax run under two
ids (bit-identical losses; issue 14 kind 12, found by h-break14k); it is inactive there now, as it is
at ``train_segments = 1``. For fast-weight variants it acts."""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec, expand, load_grid

GRID = 'name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "{variant}"\nseed = 1\ntrain_segments = 2\n'


def run_id(variant: str, truncated: bool, segments: int = 2) -> str:
    return RunSpec("g", "shakespeare", variant, 1, {"train_segments": segments, "truncated_bptt": truncated}).run_id


@pytest.mark.parametrize("variant", ["softmax", "softmax:window=8"])
def test_softmax_runs_name_one_run_whether_or_not_truncated(variant):
    assert run_id(variant, True) == run_id(variant, False)
    assert run_id(variant, False) != run_id(variant, False, segments=3)


def test_fast_weight_runs_keep_truncation_as_a_setting_of_their_own():
    assert run_id("linear", True) != run_id("linear", False)


def test_a_grid_varying_truncation_for_softmax_is_refused(tmp_path):
    path = tmp_path / "lm.toml"
    path.write_text(GRID.format(variant="softmax") + "truncated_bptt = [false, true]\n")
    with pytest.raises(FwbenchError, match=r"appears twice: truncated_bptt \(False and True\) has no effect: softmax's "
                                           r"KV cache does not cross a segment boundary"):
        load_grid(path)
    path.write_text(GRID.format(variant="linear") + "truncated_bptt = [false, true]\n")
    assert len(expand(load_grid(path), "quick")) == 2


@pytest.mark.slow
def test_softmax_losses_are_the_same_with_and_without_truncation():
    from fwbench.run.training import fit
    from fwbench.tasks.corpus import CorpusError, locate_corpus
    from fwbench.tasks.shakespeare import ShakespeareConfig

    try:
        locate_corpus(None, download=False)
    except CorpusError:
        pytest.skip("the Tiny Shakespeare corpus is not available here")
    torch.set_num_threads(1)
    results = [fit("shakespeare", "softmax", ShakespeareConfig(
        d_model=8, n_heads=2, n_layers=2, d_ff=16, context=8, train_segments=3, truncated_bptt=truncated,
        batch_size=4, max_steps=3, eval_every=3, eval_segments=4, stream_eval=False, sample_tokens=0),
        1, torch.device("cpu")) for truncated in (False, True)]
    assert results[0].curve == results[1].curve
