"""The LM's ``prompt`` acts only through the sample: with ``sample_tokens = 0`` nothing is sampled, so two
prompts are one computation and name one run, as two temperatures do there (issue 14 kind 12, found by
h-break14k: ``prompt = ["It is", "To be"]`` beside ``sample_tokens = 0`` trained one run under two ids,
with equal curves and metrics)."""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import RunSpec, expand, load_grid

GRID = 'name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'


def run_id(**config) -> str:
    return RunSpec("g", "shakespeare", "linear", 1, {"sample_tokens": 0, **config}).run_id


def test_prompts_name_one_run_where_nothing_is_sampled():
    assert run_id(prompt="To be") == run_id(prompt="It is") == run_id()
    assert run_id(prompt="To be", sample_tokens=5) != run_id(prompt="It is", sample_tokens=5)


def test_a_grid_varying_the_prompt_of_unsampled_runs_is_refused(tmp_path):
    path = tmp_path / "lm.toml"
    path.write_text(GRID + 'sample_tokens = 0\nprompt = ["It is", "To be"]\n')
    with pytest.raises(FwbenchError, match=r"appears twice: prompt \('It is' and 'To be'\) has no effect: "
                                           r"sample_tokens=0 samples no character"):
        load_grid(path)
    path.write_text(GRID + 'sample_tokens = 1\nprompt = ["It is", "To be"]\n')
    assert len(expand(load_grid(path), "quick")) == 2


@pytest.mark.slow
def test_unsampled_runs_with_two_prompts_record_the_same_numbers():
    from fwbench.run.training import fit
    from fwbench.tasks.corpus import CorpusError, locate_corpus
    from fwbench.tasks.shakespeare import ShakespeareConfig

    try:
        locate_corpus(None, download=False)
    except CorpusError:
        pytest.skip("the Tiny Shakespeare corpus is not available here")
    torch.set_num_threads(1)
    results = [fit("shakespeare", "linear", ShakespeareConfig(
        d_model=8, n_heads=2, n_layers=1, d_ff=16, context=16, batch_size=4, max_steps=2, eval_every=2,
        eval_segments=2, stream_eval=False, sample_tokens=0, prompt=prompt), 1, torch.device("cpu"))
        for prompt in ("It is", "To be")]
    assert results[0].curve == results[1].curve
    assert results[0].final_evaluation["metrics"] == results[1].final_evaluation["metrics"]
    assert [r.final_evaluation["sample"]["tokens"] for r in results] == [0, 0]
