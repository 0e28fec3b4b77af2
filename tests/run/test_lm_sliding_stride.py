"""Sliding strides that score the same windows name one computation (issue 14 kind 12, found by h-break14q).

The sliding window over N validation characters ends at min(context, N − 1), then every ``sliding_stride``
characters, and last at N − 1 (:func:`tasks.lm_evaluation.sliding_window_ends`). A stride of at least the
D = N − 1 − min(context, N − 1) characters between the first and the last end leaves only those two ends
(every stride leaves one window where D = 0). With ``stream_eval = false`` and ``stream_characters = 100``
at ``context = 64`` (D = 35), ``sliding_stride = [36, 64]`` trained and scored the same numbers (stride 35
too) under two run ids, which the grid loader accepted.
"""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import expand, load_grid
from fwbench.tasks import TASKS
from fwbench.tasks.lm_evaluation import sliding_window_ends
from fwbench.tasks.shakespeare import ShakespeareConfig

GRID = ('name = "lm"\ntask = "shakespeare"\n[defaults]\ncontext = 64\nstream_eval = false\n'
        'stream_characters = 100\n[profiles.quick]\nvariant = "linear"\nseed = 1\n')
SMALL = dict(d_model=8, n_heads=2, n_layers=1, d_ff=16, context=64, batch_size=2, max_steps=2, eval_every=2,
             eval_segments=2, sample_tokens=0, stream_eval=False, stream_characters=100, checkpoint_every=0)


@pytest.mark.parametrize(("characters", "context"), [(100, 64), (65, 64), (66, 64), (200, 64), (1000, 16)])
def test_strides_act_as_the_windows_they_end(characters, context):
    """Two strides end the same windows exactly where they act as the same value."""
    task = TASKS["shakespeare"]

    def acts_as(stride):
        config = ShakespeareConfig(context=context, stream_eval=False, stream_characters=characters,
                                   sliding_stride=stride)
        return task.values_as_they_act(config).get("sliding_stride", (stride, ""))[0]

    for a in range(1, context + 1):
        for b in range(a + 1, context + 1):
            same_windows = sliding_window_ends(characters, context, a) == sliding_window_ends(characters, context, b)
            assert same_windows == (acts_as(a) == acts_as(b)), (a, b)


def test_strides_scoring_the_same_windows_are_refused(tmp_path):
    path = tmp_path / "lm.toml"
    path.write_text(GRID + "sliding_stride = [36, 64]\n")
    with pytest.raises(FwbenchError, match=r"appears twice: sliding_stride 36 and 64 act alike \(the sliding window "
                                           r"over the 100-character validation text ends at 64 and then at 99, the "
                                           r"last character, for every stride of at least 35\)"):
        load_grid(path)
    path.write_text(GRID + "sliding_stride = [34, 35]\n")  # 34 ends a window at 98 too
    assert len(expand(load_grid(path), "quick")) == 2
    path.write_text(GRID.replace("stream_characters = 100", "stream_characters = 0") + "sliding_stride = [36, 64]\n")
    assert len(expand(load_grid(path), "quick")) == 2  # the whole split: every stride ends its own windows


@pytest.mark.slow
def test_strides_refused_together_record_the_same_numbers():
    from fwbench.run.training import fit
    from fwbench.tasks.corpus import CorpusError, locate_corpus

    try:
        locate_corpus(None, download=False)
    except CorpusError:
        pytest.skip("the Tiny Shakespeare corpus is not available here")
    torch.set_num_threads(1)
    results = {stride: fit("shakespeare", "linear", ShakespeareConfig(**SMALL, sliding_stride=stride), 1,
                           torch.device("cpu")) for stride in (35, 64, 34)}
    metrics = {stride: result.final_evaluation["metrics"] for stride, result in results.items()}
    assert metrics[35] == metrics[64]
    assert metrics[35]["sliding_ppl"] != metrics[34]["sliding_ppl"]
