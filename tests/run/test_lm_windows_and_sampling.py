"""Language-model training windows reach the end of the training split, and sampling at any
temperature the command accepts (issue 14 items 9 and 10)."""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.sampling import sample_from_checkpoint
from fwbench.tasks.corpus import CorpusError
from fwbench.tasks.lm_model import DecoderConfig, DecoderLM, sample_next
from fwbench.tasks.shakespeare import CharCorpus, ShakespeareConfig, ShakespeareTask


def task_with_training_split(monkeypatch, characters: int) -> ShakespeareTask:
    """A Shakespeare task whose training split is ``characters`` ids 0, 1, 2, … (so a window's first id is its start)."""
    task = ShakespeareTask()
    corpus = CharCorpus("".join(chr(32 + i) for i in range(characters)), torch.arange(characters), torch.arange(20))
    monkeypatch.setattr(task, "corpus", lambda train_fraction=0.9: corpus)
    return task


def test_every_window_start_is_drawn_the_last_one_included(monkeypatch):
    """180 training characters, context 8: windows of 9 start at 0 … 171 (the issue's split)."""
    task = task_with_training_split(monkeypatch, 180)
    config = ShakespeareConfig(context=8, batch_size=512)
    generator = torch.Generator().manual_seed(0)
    starts = torch.cat([task.train_batch(config, generator)[:, 0] for _ in range(8)])
    assert starts.min().item() == 0 and starts.max().item() == 171
    assert set(starts.tolist()) == set(range(172))
    window = task.train_batch(config, generator)[0]
    assert torch.equal(window, torch.arange(window[0].item(), window[0].item() + 9))


def test_a_split_holding_exactly_one_window_is_accepted_and_one_character_less_is_refused(monkeypatch):
    config = ShakespeareConfig(context=8, batch_size=3)
    batch = task_with_training_split(monkeypatch, 9).train_batch(config, torch.Generator().manual_seed(0))
    assert torch.equal(batch, torch.arange(9).expand(3, 9))
    with pytest.raises(CorpusError, match=r"the training split has only 8 characters, expected at least 9 \(one window\)"):
        task_with_training_split(monkeypatch, 8).train_batch(config, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("temperature", [1e-46, 5e-324, 1e-300, 1e-8])
def test_a_tiny_temperature_samples_greedily(temperature):
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.999], [3.0, -3.0, 0.0, 2.0]])
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert sample_next(logits, temperature, generator).flatten().tolist() == [1, 0]


def test_a_huge_temperature_samples_every_token():
    logits = torch.tensor([[0.0, 5.0, -5.0]])
    generator = torch.Generator().manual_seed(0)
    drawn = {sample_next(logits, 1e300, generator).item() for _ in range(60)}
    assert drawn == {0, 1, 2}


def test_generation_at_temperature_1e_46_is_the_greedy_text():
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=7, d_model=16, n_heads=2, n_layers=1, d_ff=32, context=8)
    model = DecoderLM("linear-delta", config, "abcdefg")
    prompt = torch.tensor([[1, 2, 3]])
    tiny, _ = model.generate(prompt, 12, 1e-46, torch.Generator().manual_seed(1))
    greedy, _ = model.generate(prompt, 12, 0.0, torch.Generator().manual_seed(1))
    assert torch.equal(tiny, greedy)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf")])
def test_sample_refuses_a_temperature_that_is_not_a_finite_number(tmp_path, temperature):
    with pytest.raises(FwbenchError, match=r"^--temperature: got (nan|inf); expected a finite number >= 0 \(0 = greedy\)$"):
        sample_from_checkpoint(tmp_path / "none.pt", "It", 5, temperature, 0, torch.device("cpu"))
