"""The LM protocol the claims read: carried-state training with truncated backpropagation equals the
unrolled computation, the sliding-window evaluation equals a naive loop, and the carried-length
evaluation (1×, 4×, 16× the carried length seen in training) equals reading each window token by token."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close

from fwbench.tasks.lm_evaluation import (
    CARRIED_MULTIPLES,
    carried_length_evaluation,
    sliding_window_ends,
    sliding_window_losses,
    token_losses,
)
from fwbench.tasks.lm_model import DecoderConfig, DecoderLM
from fwbench.tasks.shakespeare import ShakespeareConfig, ShakespeareTask
from fwbench.variants import using_form

VOCAB = 11
#: fp32 relative RMSE between two orders of the same computation (chunked vs token by token).
RTOL = 1e-5
CPU = torch.device("cpu")


def tiny_model(spec: str, positional: str = "none", context: int = 8) -> DecoderLM:
    """A small random model; weights perturbed so that every layer matters to the logits."""
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, d_ff=32, context=context,
                           positional=positional)
    model = DecoderLM(spec, config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def lm_config(**fields) -> ShakespeareConfig:
    return ShakespeareConfig(d_model=16, n_heads=2, n_layers=2, d_ff=32, **fields)


@pytest.mark.parametrize("spec", ["linear", "linear-delta", "dpfp-delta:nu=1"])
def test_truncated_bptt_loss_is_the_token_by_token_loss_and_its_gradient_the_per_segment_sum(spec):
    model = tiny_model(spec, context=8)
    config = lm_config(context=8, train_segments=3, truncated_bptt=True)
    batch = torch.randint(0, VOCAB, (2, 3 * 8 + 1), generator=torch.Generator().manual_seed(1))
    loss = ShakespeareTask().loss(model, batch, config)
    loss.backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}

    # reference 1, the value: one token at a time in the recurrent form, the state never reset
    with torch.no_grad(), using_form(model, "recurrent"):
        states, steps = None, []
        for t in range(batch.shape[1] - 1):
            logits, states = model(batch[:, t : t + 1], states)
            steps.append(logits)
        unrolled = F.cross_entropy(torch.cat(steps, 1).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    assert_close(loss.detach(), unrolled, RTOL)

    # reference 2, the gradient: segment j's loss differentiated alone, its incoming state computed
    # without gradients (a constant), summed with each segment's share of the tokens
    model.zero_grad()
    tokens = batch.shape[0] * (batch.shape[1] - 1)
    states = None
    for start in range(0, 24, 8):
        logits, new_states = model(batch[:, start : start + 8], states)
        part = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, start + 1 : start + 9].reshape(-1), reduction="sum")
        (part / tokens).backward()
        with torch.no_grad():
            _, states = model(batch[:, start : start + 8], states)
    for name, parameter in model.named_parameters():
        assert_close(got[name], parameter.grad, RTOL)

    # and the flag matters: full backpropagation through the carried state gives another gradient
    model.zero_grad()
    ShakespeareTask().loss(model, batch, lm_config(context=8, train_segments=3)).backward()
    query = "blocks.1.attention.k_proj.weight"
    assert (dict(model.named_parameters())[query].grad - got[query]).abs().max() > 1e-4


@pytest.mark.parametrize("stride", [1, 3, 8])
@pytest.mark.parametrize("spec", ["softmax", "linear-delta"])
def test_sliding_window_losses_equal_a_naive_loop(spec, stride):
    context = 8
    model = tiny_model(spec, positional="learned", context=context).eval()
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(2))
    got = sliding_window_losses(model, ids, context, stride, CPU, batch_size=4)
    assert got.shape == (ids.numel() - 1,)
    last = ids.numel() - 1
    expected = []
    with torch.no_grad():
        for p in range(1, ids.numel()):  # predict ids[p]
            # the window that scores p ends at the first of context, context + stride, … (or the last
            # input) at or after p, and holds the context inputs before that end
            end = context if p <= context else min(context + math.ceil((p - context) / stride) * stride, last)
            start = max(0, end - context)
            logits, _ = model(ids[None, start:end])
            expected.append(F.cross_entropy(logits[0, p - 1 - start][None], ids[p][None]))
            assert end - context <= p - 1 and p - start >= min(p, context - stride + 1)
    assert_close(got, torch.stack(expected), RTOL)


def test_sliding_window_with_stride_equal_to_context_is_the_independent_segment_evaluation():
    model = tiny_model("linear", positional="learned").eval()
    ids = torch.randint(0, VOCAB, (8 * 5 + 1,), generator=torch.Generator().manual_seed(3))
    assert_close(sliding_window_losses(model, ids, 8, 8, CPU), token_losses(model, ids, 8, CPU, carry=False), RTOL)


def test_sliding_window_ends_cover_every_target_once():
    assert sliding_window_ends(30, 8, 3) == [8, 11, 14, 17, 20, 23, 26, 29]
    assert sliding_window_ends(31, 8, 3) == [8, 11, 14, 17, 20, 23, 26, 29, 30]
    assert sliding_window_ends(5, 8, 3) == [4]
    with pytest.raises(ValueError, match="stride: got 9"):
        sliding_window_losses(tiny_model("linear"), torch.zeros(20, dtype=torch.int64), 8, 9, CPU)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["linear", "linear-delta"])
def test_carried_length_evaluation_reads_each_window_token_by_token_from_an_empty_memory(spec):
    context, train_length = 4, 8  # trained on 2 segments of 4 carried
    model = tiny_model(spec, context=context).eval()
    ids = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(4))
    result = carried_length_evaluation(model, ids, train_length, context, CPU)
    longest = max(CARRIED_MULTIPLES) * train_length
    assert result["lengths"] == [m * train_length for m in CARRIED_MULTIPLES]
    assert result["tokens"] == longest * ((ids.numel() - 1) // longest)  # whole windows of the longest length
    for length, loss in zip(result["lengths"], result["loss"], strict=True):
        losses = []
        with torch.no_grad(), using_form(model, "recurrent"):
            for start in range(0, result["tokens"], length):
                states = None
                for t in range(start, start + length):
                    logits, states = model(ids[None, t : t + 1], states)
                    losses.append(F.cross_entropy(logits[0], ids[t + 1][None]))
        assert loss == pytest.approx(torch.stack(losses).double().mean().item(), rel=1e-5)
    assert result["ppl_ratio"][0] == 1.0
    # the state does change the predictions once carried beyond the training length
    assert abs(result["ppl_ratio"][-1] - 1.0) > 1e-4


def test_softmax_scores_the_same_at_every_carried_length():
    model = tiny_model("softmax", context=4).eval()
    ids = torch.randint(0, VOCAB, (300,), generator=torch.Generator().manual_seed(5))
    result = carried_length_evaluation(model, ids, 8, 4, CPU)
    assert result["ppl_ratio"] == pytest.approx([1.0, 1.0, 1.0], rel=1e-6)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"sliding_stride": 65}, "sliding_stride: got 65"),
    ({"sliding_stride": -1}, "sliding_stride: got -1"),
    ({"train_segments": 4, "stream_characters": 2048}, "stream_characters: got 2048"),
])
def test_protocol_fields_are_checked_with_one_clear_line(fields, expected):
    with pytest.raises(ValueError, match=expected):
        ShakespeareTask().validate(ShakespeareConfig(context=64, **fields))


@pytest.mark.parametrize(("where_inactive", "where_active", "key", "value"), [
    ({"train_segments": 1}, {"train_segments": 2}, "truncated_bptt", True),
    ({"schedule": "constant"}, {"schedule": "noam"}, "warmup_steps", 7),
    ({"stream_eval": False, "sliding_stride": 0}, {"stream_eval": False, "sliding_stride": 8}, "stream_characters", 4096),
    ({"sample_tokens": 0}, {"sample_tokens": 5}, "temperature", 1.3),
])
def test_run_id_hashes_a_key_only_where_it_acts(where_inactive, where_active, key, value):
    """truncated_bptt at one segment, warmup_steps under a constant schedule, stream_characters
    with no stream evaluation and temperature with no character sampled change nothing a run
    computes: such a run has the id of the one with the key at its default (so runs at the default
    keep their ids); where the key acts, the id changes."""
    from dataclasses import asdict

    from fwbench.run.grid import RunSpec

    def run_id(**config):
        return RunSpec("g", "shakespeare", "linear", 1, asdict(ShakespeareConfig(**config))).run_id

    assert run_id(**where_inactive, **{key: value}) == run_id(**where_inactive)
    assert run_id(**where_active, **{key: value}) != run_id(**where_active)


def test_noam_warmup_of_zero_and_one_steps_is_one_run():
    """The noam factor warms up over max(warmup_steps, 1) steps, so 0 and 1 train alike: one run id
    (found by h-break14g: warmup_steps = [0, 1] trained it twice); 2 differs."""
    from dataclasses import asdict

    from fwbench.run.grid import RunSpec
    from fwbench.run.optimization import noam_factor

    assert [noam_factor(step, 0) for step in range(1, 6)] == [noam_factor(step, 1) for step in range(1, 6)]

    def run_id(**config):
        return RunSpec("g", "shakespeare", "linear", 1, asdict(ShakespeareConfig(**config))).run_id

    assert run_id(warmup_steps=0) == run_id(warmup_steps=1) != run_id(warmup_steps=2)
    assert run_id(warmup_steps=100) == RunSpec("g", "shakespeare", "linear", 1, asdict(ShakespeareConfig())).run_id
