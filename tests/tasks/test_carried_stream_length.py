"""The long-context evaluation's longest carried length must fit in the validation stream it reads.

``validate`` refuses a ``stream_characters`` shorter than 16 × context × train_segments + 1, but 0 (the
whole split) or a value beyond the split read the split itself, which may be shorter: the carried
evaluation then read the whole (short) stream at every length and recorded ``carried_ppl_16x`` for a
length it never carried (found by h-break14g: 100 validation characters at context 16 recorded a
16× = 256-character carried perplexity). ``build_model``, which has the corpus, now refuses it.
"""

from __future__ import annotations

import hashlib

import pytest

from fwbench.tasks.corpus import CorpusError
from fwbench.tasks.shakespeare import ShakespeareConfig, ShakespeareTask

TEXT = "".join(f"It is line {i % 7}: the quick brown fox jumps.\n" for i in range(100))  # 4,100 characters


@pytest.fixture
def task(tmp_path) -> ShakespeareTask:
    (tmp_path / "input.txt").write_text(TEXT)
    return ShakespeareTask(data_dir=tmp_path, sha256=hashlib.sha256(TEXT.encode()).hexdigest())


def leaving(n: int) -> float:
    """The train_fraction whose split leaves exactly ``n`` validation characters."""
    return (len(TEXT) - n + 0.5) / len(TEXT)


def config(**fields) -> ShakespeareConfig:
    return ShakespeareConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16, context=16, **fields)


@pytest.mark.parametrize("stream_characters", [0, 100_000])
def test_a_validation_split_shorter_than_the_longest_carried_length_is_refused(task, stream_characters):
    short = leaving(200)  # < 16 × 16 + 1 = 257
    assert task.corpus(short).valid.numel() == 200
    with pytest.raises(CorpusError, match=r"leaves 200 validation characters .*needs at least 16 × context × "
                                          r"train_segments \+ 1 = 257 \(or stream_eval = false\)"):
        task.build_model(config(train_fraction=short, stream_characters=stream_characters), "linear")
    task.build_model(config(train_fraction=short, stream_characters=stream_characters, stream_eval=False), "linear")


def test_a_split_that_holds_the_longest_carried_length_builds(task):
    enough = leaving(257)
    assert task.corpus(enough).valid.numel() == 257
    task.build_model(config(train_fraction=enough), "linear")
    # one character fewer is refused: 256 characters predict only 255 of the 16× = 256-token length
    # (without this side of the boundary, the check could read `< 16 × context × train_segments` unseen)
    one_short = leaving(256)
    assert task.corpus(one_short).valid.numel() == 256
    with pytest.raises(CorpusError, match=r"leaves 256 validation characters .*\+ 1 = 257"):
        task.build_model(config(train_fraction=one_short), "linear")
    with pytest.raises(CorpusError, match="train_segments \\+ 1 = 513"):  # two segments carried: 16 × 32 + 1
        task.build_model(config(train_fraction=enough, train_segments=2), "linear")
