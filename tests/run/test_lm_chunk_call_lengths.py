"""Two LM chunk sizes below ``context`` that cut every attention call of the run alike name one
computation (issue 14 kind 12, found by h-break14k).

The chunk forms balance their chunks, and the LM's calls have a few known lengths on the verified
corpus: ``context`` (training, full segments, sliding windows, carried lengths), the last segment of
each stream scored segment by segment, and the prompt's last piece. At ``context = 16``,
``chunk_size = [6, 7]`` both cut 16 tokens into 3 chunks of 6 and leave the 3-token last segment of the
validation split and the 5-token prompt whole: equal records under two run ids, which the grid loader
accepted (it compared sizes below ``context`` as written).
"""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import expand, load_grid
from fwbench.tasks import TASKS
from fwbench.tasks.shakespeare import ShakespeareConfig

GRID = 'name = "lm"\ntask = "shakespeare"\n[defaults]\ncontext = 16\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
SMALL = dict(d_model=8, n_heads=2, n_layers=1, d_ff=16, context=16, batch_size=4, max_steps=2, eval_every=2,
             eval_segments=4, stream_characters=1000, sliding_stride=8, sample_tokens=5,
             prompt="It is the cause, my s")


def test_the_lengths_of_the_lm_calls():
    task = TASKS["shakespeare"]
    # 111,540 validation characters: segments of 16 inputs, the last of 3; the prompt's 5
    assert task.chunked_call_lengths(ShakespeareConfig(context=16)) == {3, 5, 16}
    # a 1000-character stream ends with a 7-token segment; the 21-character prompt with a 5-token piece
    assert task.chunked_call_lengths(ShakespeareConfig(**SMALL)) == {3, 5, 7, 16}


def test_chunk_sizes_cutting_every_call_alike_are_refused(tmp_path):
    path = tmp_path / "lm.toml"
    path.write_text(GRID + "chunk_size = [6, 7]\n")
    with pytest.raises(FwbenchError, match=r"appears twice: chunk_size 6 and 7 both cut each attention call of the "
                                           r"run \(3, 5, 16 tokens\) into chunks of one length"):
        load_grid(path)
    path.write_text(GRID + "chunk_size = [5, 6]\n")  # 16 tokens: 4 chunks of 4, or 3 of 6
    assert len(expand(load_grid(path), "quick")) == 2
    path.write_text(GRID + "chunk_size = [3, 4]\n")  # the 3-token segment: one chunk for both; 16: 6 or 4
    assert len(expand(load_grid(path), "quick")) == 2
    path.write_text(GRID + "chunk_size = [16, 64]\n")  # at least the longest call: as before
    with pytest.raises(FwbenchError, match=r"chunk_size 16 and 64 both leave every attention call of at most 16 "
                                           r"tokens in one chunk"):
        load_grid(path)


@pytest.mark.slow
def test_chunk_sizes_refused_together_record_the_same_numbers():
    from fwbench.run.training import fit
    from fwbench.tasks.corpus import CorpusError, locate_corpus

    try:
        locate_corpus(None, download=False)
    except CorpusError:
        pytest.skip("the Tiny Shakespeare corpus is not available here")
    torch.set_num_threads(1)
    # lengths 3, 5, 7, 16: sizes 8 to 15 cut them alike (3, 5, 7 whole, 16 in two); 7 cuts 16 in three
    results = {size: fit("shakespeare", "linear-delta", ShakespeareConfig(**SMALL, chunk_size=size), 1,
                         torch.device("cpu")) for size in (8, 15, 7)}
    assert results[8].curve == results[15].curve
    assert results[8].final_evaluation == results[15].final_evaluation
    assert results[8].final_evaluation != results[7].final_evaluation
