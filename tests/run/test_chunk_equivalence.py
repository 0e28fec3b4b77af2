"""Chunk sizes that give the same balanced chunks compute the same numbers, so a grid listing two of
them for one run (two run ids, one computation: issue 14's kind 12) is refused; chunk sizes that
give other chunks are kept."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import expand, load_grid
from fwbench.tasks import MQARConfig, RetrievalConfig
from fwbench.tasks.mqar import MQARTask
from fwbench.tasks.retrieval import RetrievalTask

GRID = 'name = "g"\ntask = "retrieval"\n[defaults]\nsetting = 2\nS = 60\nseed = 1\n'  # T = 2S = 120 tokens


def grid(tmp_path, profile: str):
    path = tmp_path / "g.toml"
    path.write_text(GRID + profile)
    return path


def losses_and_grads(task, config, variant: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = task.build_model(config, variant)
    loss = task.loss(model, task.train_batch(config, torch.Generator().manual_seed(0)), config)
    loss.backward()
    return [loss.detach(), *(p.grad for p in model.parameters() if p.grad is not None)]


@pytest.mark.parametrize(("task", "config", "sizes"), [
    (RetrievalTask(), RetrievalConfig(setting=2, S=60, d_key=8, batch_size=4), (60, 64, 119)),  # T=120: 2 × 60
    (RetrievalTask(), RetrievalConfig(setting=1, S=10, d_key=8, batch_size=4), (10, 24)),       # one chunk of 10
    (MQARTask(), MQARConfig(vocab_size=32, seq_len=16, num_kv_pairs=2, d_model=16), (8, 9, 15)),  # 2 × 8
])
def test_chunk_sizes_with_equal_chunk_lengths_compute_the_same_numbers(task, config, sizes):
    results = [losses_and_grads(task, replace(config, chunk_size=size), "linear-delta") for size in sizes]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_a_grid_listing_two_chunk_sizes_with_equal_chunks_is_refused(tmp_path):
    with pytest.raises(FwbenchError, match=r"chunk_size 60 and 64 both cut its T=120 tokens into 2 chunks of at "
                                           r"most 60 tokens .* list one of them"):
        load_grid(grid(tmp_path, '[profiles.quick]\nvariant = "linear-delta"\nchunk_size = [60, 64]\n'))


def test_the_refusal_spans_the_blocks_of_a_profile(tmp_path):
    blocks = ('[[profiles.quick]]\nvariant = "linear-delta"\nchunk_size = 60\n'
              '[[profiles.quick]]\nvariant = "linear-delta"\nchunk_size = 100\n')
    with pytest.raises(FwbenchError, match=r"profile quick: the run linear-delta .* chunk_size 60 and 100"):
        load_grid(grid(tmp_path, blocks))


def test_chunk_sizes_with_other_chunks_and_other_runs_are_kept(tmp_path):
    profile = '[profiles.quick]\nvariant = ["linear-delta", "dpfp-delta:nu=1"]\nchunk_size = [32, 64]\nseed = [1, 2]\n'
    specs = expand(load_grid(grid(tmp_path, profile)), "quick")  # 30 vs 60 tokens per chunk
    assert len(specs) == 8 and len({spec.run_id for spec in specs}) == 8


LM_GRID = 'name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "linear-delta"\nseed = 1\ncontext = 32\n'


def test_an_lm_grid_listing_chunk_sizes_of_at_least_its_context_is_refused(tmp_path):
    """Every LM attention call covers at most one segment of ``context`` tokens: chunk sizes of at least
    ``context`` leave each call in one chunk (the default 32 beside 64 at context 32 too)."""
    path = tmp_path / "lm.toml"
    for sizes in ("[32, 64]", "[40, 1000]"):
        path.write_text(LM_GRID + f"chunk_size = {sizes}\n")
        first, second = sizes.strip("[]").split(", ")
        with pytest.raises(FwbenchError, match=rf"chunk_size {first} and {second} both leave every attention call "
                                               r"of at most 32 tokens in one chunk, .* list one of them"):
            load_grid(path)
    path.write_text(LM_GRID.replace("[profiles.quick]", "[[profiles.quick]]")
                    + '[[profiles.quick]]\nvariant = "linear-delta"\nseed = 1\ncontext = 32\nchunk_size = 64\n')
    with pytest.raises(FwbenchError, match=r"chunk_size 32 and 64 both leave every attention call"):
        load_grid(path)  # no chunk_size (the default, 32) in one block, 64 in the other
    for sizes in ("[16, 31]", "[31, 32]"):  # a call of 17 (32) tokens is cut in two by 16 (31), once by 31 (32)
        path.write_text(LM_GRID + f"chunk_size = {sizes}\n")
        assert len(expand(load_grid(path), "quick")) == 2


def test_lm_chunk_sizes_of_at_least_the_context_compute_the_same_numbers():
    """Through the model, whatever the length of the call (a segment, or part of one, carried)."""
    from fwbench.tasks.lm_model import DecoderConfig, DecoderLM

    tokens = torch.randint(0, 20, (2, 45), generator=torch.Generator().manual_seed(1))

    def carried(chunk_size: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = DecoderLM("linear-delta", DecoderConfig(vocab_size=20, d_model=8, n_heads=2, n_layers=1, context=16,
                                                        form="chunk", chunk_size=chunk_size))
        first, states = model(tokens[:, :21])
        second, _ = model(tokens[:, 21:], states)
        logits = torch.cat([first, second], dim=1)
        logits.square().sum().backward()
        return [logits.detach(), *(p.grad for p in model.parameters() if p.grad is not None)]

    plain = carried(16)
    for a, b in zip(plain, carried(1000)):
        assert torch.equal(a, b)
    assert not torch.equal(carried(15)[0], plain[0])


def test_a_grid_refuses_chunk_sizes_and_values_that_act_alike_together(tmp_path):
    """Two cells differing in both a chunk size with equal chunks and a value that acts as another
    compute one run: each refusal alone compared the other key as written, and let them through."""
    path = tmp_path / "lm.toml"
    blocks = "".join(f'[[profiles.quick]]\nvariant = "linear"\nseed = 1\nchunk_size = {size}\ncheckpoint_every = {every}\n'
                     for size, every in ((32, 0), (64, 100)))
    path.write_text(f'name = "lm"\ntask = "shakespeare"\n[defaults]\ncontext = 32\n{blocks}')
    with pytest.raises(FwbenchError, match=r"chunk_size 32 and 64 both leave every attention call of at most 32 "
                                           r"tokens in one chunk; checkpoint_every 0 and 100 act alike"):
        load_grid(path)
    retrieval = ('[[profiles.quick]]\nvariant = "linear-delta"\nchunk_size = 60\nembedding_factor = 2.2\n'
                 '[[profiles.quick]]\nvariant = "linear-delta"\nchunk_size = 64\nembedding_factor = 2.21\n')
    with pytest.raises(FwbenchError, match=r"chunk_size 60 and 64 both cut its T=120 tokens .*; embedding_factor "
                                           r"2.2 and 2.21 act alike \(a key embedding of int\(embedding_factor × S=60\) "
                                           r"= 132 features\)"):
        load_grid(grid(tmp_path, retrieval))
    path.write_text(path.read_text().replace("chunk_size = 64", "chunk_size = 31"))  # 31 cuts a call of 32 in two
    assert len(expand(load_grid(path), "quick")) == 2
