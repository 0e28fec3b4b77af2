"""The decoder language model: teacher forcing equals generation token by token, carried state
across segments, constant-memory generation, sampling, and its input errors."""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
from helpers import SPECS, assert_close

from fwbench.tasks.lm_model import DecoderConfig, DecoderLM, sample_next, states_nbytes
from fwbench.variants import VariantError, using_form

#: The acceptance tolerance: relative RMSE between teacher-forced and token-by-token logits in fp32.
GENERATION_RTOL = 1e-5
VOCAB = 11


def tiny_model(spec: str, positional: str = "none", context: int = 8, n_layers: int = 2) -> DecoderLM:
    """A small random model; weights are perturbed so that every layer matters to the logits."""
    config = DecoderConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=n_layers, d_ff=32, context=context,
                           positional=positional)
    model = DecoderLM(spec, config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize("positional", ["none", "learned"])
@pytest.mark.parametrize("spec", SPECS)
def test_teacher_forced_logits_equal_token_by_token_generation(spec, positional):
    model = tiny_model(spec, positional)
    tokens = torch.randint(0, VOCAB, (2, 21))  # 21 tokens: two segment boundaries of context 8
    with torch.no_grad():
        teacher_forced, _ = model(tokens)
        states, steps = None, []
        with using_form(model, "recurrent"):
            for t in range(tokens.shape[1]):
                logits, states = model(tokens[:, t : t + 1], states)
                steps.append(logits)
    assert_close(torch.cat(steps, dim=1), teacher_forced, GENERATION_RTOL)


@pytest.mark.parametrize("spec", ["softmax", "linear", "dpfp-delta:nu=2"])
def test_a_stream_split_anywhere_equals_one_call(spec):
    model = tiny_model(spec, "learned")
    tokens = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        whole, _ = model(tokens)
        with using_form(model, "parallel"):
            first, states = model(tokens[:, :5])
        with using_form(model, "chunk"):
            second, states = model(tokens[:, 5:19], states)
        third, _ = model(tokens[:, 19:], states)
    assert_close(torch.cat([first, second, third], dim=1), whole, GENERATION_RTOL)


@pytest.mark.parametrize("spec", ["softmax", "linear", "tanh-fwm"])
def test_a_stream_split_at_its_start_continues(spec):
    """A call of no token on a new stream returns the states [] (no layer ran), which the next call
    refused: "states: got '0 states'; expected one per layer (2)" (also generate(..., states=[]))."""
    model = tiny_model(spec, "learned")
    tokens = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        whole, _ = model(tokens)
        empty, states = model(tokens[:, :0])
        assert empty.shape == (2, 0, VOCAB) and states == []
        continued, _ = model(tokens, states)
        sampled, _ = model.generate(tokens[:, :3], 4, temperature=0, states=states)
    torch.testing.assert_close(continued, whole, rtol=0, atol=0)
    assert torch.equal(sampled, model.generate(tokens[:, :3], 4, temperature=0)[0])


@pytest.mark.parametrize("spec", ["softmax", "linear", "tanh-fwm"])
def test_states_of_other_calls_or_none_beside_each_other_are_refused(spec):
    """The stream is cut into segments at the first layer's position: a None in the list raised
    "AttributeError: 'NoneType' object has no attribute 'position'" (first layer) or silently started
    that layer's memory afresh (a later layer), and states of two calls were carried on together."""
    model = tiny_model(spec)
    tokens = torch.randint(0, VOCAB, (2, 5))
    with torch.no_grad():
        _, after_3 = model(tokens[:, :3])
        _, after_2 = model(tokens[:, :2])
        cases = {"positions [None, None]": [None, None], "positions [3, None]": [after_3[0], None],
                 "positions [2, 3]": [after_2[0], after_3[1]],
                 "positions [[3], 3]": [dataclasses.replace(after_3[0], position=[3]), after_3[1]]}  # unhashable
        for got, states in cases.items():
            with pytest.raises(VariantError, match=rf"^states: got '{re.escape(got)}'; expected the per-layer states "
                                                   r"of one call, all at one position$"):
                model(tokens[:, 3:], states)


@pytest.mark.parametrize("spec", ["softmax", "linear", "tanh-fwm"])
def test_states_whose_position_is_not_a_token_count_are_refused_before_the_segments_are_cut(spec):
    """The segments are cut at the first layer's position before any layer checks its state: 3.0 raised
    "TypeError: slice indices must be integers or None or have an __index__ method", '3' "TypeError: can
    only concatenate str (not "int") to str"; a call of no token returned them unchecked."""
    model = tiny_model(spec)
    tokens = torch.randint(0, VOCAB, (2, 9))  # the 6 tokens after 3 cross the boundary at 8: a cut at 8 - 3.0
    with torch.no_grad():
        _, states = model(tokens[:, :3])
        for position, got in ((3.0, "3.0"), ("3", "'3'")):
            bad = [dataclasses.replace(state, position=position) for state in states]
            for rest in (tokens[:, 3:], tokens[:, :0]):
                with pytest.raises(VariantError, match=rf"^state.position: got {re.escape(got)}; expected the number "
                                                       r"of tokens the state has seen \(an integer >= 0\)$"):
                    model(rest, bad)


@pytest.mark.parametrize("spec", ["softmax", "linear"])
def test_every_layers_position_is_checked_by_a_call_of_no_token(spec):
    """Only the first layer's position was checked before the segments: a second layer's 3.0 (equal to 3)
    came back unchecked from a call of no token, while a call of tokens refused it in that layer."""
    model = tiny_model(spec)
    tokens = torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        _, states = model(tokens[:, :3])
        bad = [states[0], dataclasses.replace(states[1], position=3.0)]
        for rest in (tokens[:, :0], tokens[:, 3:]):
            with pytest.raises(VariantError, match=r"^state.position: got 3.0; expected the number of tokens the "
                                                   r"state has seen \(an integer >= 0\)$"):
                model(rest, bad)


def test_a_position_of_several_counts_is_refused_as_no_count():
    """A tensor or array position (every layer's, or the second's) raised "RuntimeError: Boolean value of
    Tensor with more than one value is ambiguous" (NumPy: "ValueError: The truth value of an array with more
    than one element is ambiguous") from the comparison of the layers' positions."""
    model = tiny_model("linear")
    tokens = torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        _, states = model(tokens[:, :3])
        for position in (torch.tensor([3, 3]), np.array([3, 3])):
            for layers in ((0, 1), (1,)):
                bad = [dataclasses.replace(state, position=position) if i in layers else state
                       for i, state in enumerate(states)]
                message = f"state.position: got {position!r}; expected the number of tokens the state has seen"
                with pytest.raises(VariantError, match=f"^{re.escape(message)} \\(an integer >= 0\\)$"):
                    model(tokens[:, 3:], bad)


@pytest.mark.parametrize(("spec", "positional"), [("softmax", "none"), ("linear", "learned")])
def test_a_position_held_in_a_narrow_numpy_integer_counts_past_its_width(spec, positional):
    """A count held as np.uint8(250) (a NumPy integer counts, d41f698) was added to in uint8: the segments
    were cut at a wrapped offset (logits off by up to 1.1 for learned positions, 5.2 for softmax's cache) and
    the states came back at position 44 after 50 more tokens instead of 300 (softmax: 2 instead of 6)."""
    model = tiny_model(spec, positional, context=6)
    tokens = torch.randint(0, VOCAB, (1, 300))
    with torch.no_grad():
        expected, expected_states = model(tokens)
        _, states = model(tokens[:, :250])
        narrow = [dataclasses.replace(state, position=np.uint8(250)) for state in states]
        logits, states = model(tokens[:, 250:], narrow)
    assert_close(logits, expected[:, 250:], GENERATION_RTOL)
    assert [state.position for state in states] == [state.position for state in expected_states]


@pytest.mark.parametrize("spec", ["softmax", "linear"])
def test_token_ids_outside_the_vocabulary_are_refused(spec):
    """An id outside [0, vocab_size) raised "IndexError: index out of range in self" from the embedding
    (a device-side assert on CUDA), in the forward and in generate's prompt."""
    model = tiny_model(spec)
    for ids, got in (([[1, VOCAB, 2]], f"[1, {VOCAB}]"), ([[-1, 0]], "[-1, 0]")):
        message = rf"^tokens: got ids in {re.escape(got)}; expected ids in \[0, vocab_size={VOCAB}\)$"
        with pytest.raises(VariantError, match=message):
            model(torch.tensor(ids))
        with pytest.raises(VariantError, match=message):
            model.generate(torch.tensor(ids), 2)


@pytest.mark.parametrize("spec", ["softmax", "linear"])
def test_tokens_on_another_device_are_refused(spec):
    """Ids on another device than the model: meta ids into a CPU model read the CPU embedding and
    returned logits of garbage, no error (before the range check), then "RuntimeError: Tensor.item()
    cannot be called on meta tensors" from it, in the forward and in generate's prompt."""
    model = tiny_model(spec)
    tokens = torch.tensor([[1, 2, 3]], device="meta")
    message = r"^tokens.device: got 'meta'; expected the model's device \(cpu\)$"
    with pytest.raises(VariantError, match=message):
        model(tokens)
    with pytest.raises(VariantError, match=message):
        model.generate(tokens, 2)


def test_a_model_on_meta_reads_meta_ids_unchecked():
    """A dry run of a softmax model on meta (shapes only) ran before the range check, which read
    the ids' values: "RuntimeError: Tensor.item() cannot be called on meta tensors"."""
    model = tiny_model("softmax").to("meta")
    logits, states = model(torch.tensor([[1, 2, 3]], device="meta"))
    assert (logits.shape, logits.device.type, states[0].position) == ((1, 3, VOCAB), "meta", 3)


@pytest.mark.parametrize("spec", ["softmax", "linear"])
def test_states_that_are_not_a_list_are_refused(spec):
    """One layer's state instead of the list (or an int, a generator) raised "TypeError: object of type
    'FastWeightState' has no len()"."""
    model = tiny_model(spec)
    tokens = torch.randint(0, VOCAB, (1, 4))
    with torch.no_grad():
        _, states = model(tokens[:, :2])
        for bad in (states[0], 3, (state for state in states)):
            message = rf"^states: got '{type(bad).__name__}'; expected the list of per-layer states the previous call returned$"
            with pytest.raises(VariantError, match=message):
                model(tokens[:, 2:], bad)
        continued, _ = model(tokens[:, 2:], tuple(states))  # a tuple is a list of states
        assert torch.equal(continued, model(tokens[:, 2:], states)[0])


def test_fast_weight_state_crosses_segments_and_softmax_cache_does_not():
    tokens = torch.randint(0, VOCAB, (1, 16))
    with torch.no_grad():
        for spec, carries in (("linear-delta", True), ("softmax", False)):
            model = tiny_model(spec)
            stream, _ = model(tokens)
            fresh, _ = model(tokens[:, 8:])  # the second segment read from an empty memory
            same = torch.allclose(stream[:, 8:], fresh, atol=1e-6)
            assert same != carries, spec


@pytest.mark.slow
@pytest.mark.parametrize("spec", [s for s in SPECS if s != "softmax"])
def test_generation_memory_is_constant_per_token_for_fast_weights(spec):
    model = tiny_model(spec, n_layers=1)
    prompt = torch.tensor([[1, 2, 3]])
    generator = torch.Generator().manual_seed(0)
    _, short_states = model.generate(prompt, 10, temperature=1.0, generator=generator)
    sampled, long_states = model.generate(prompt, 500, temperature=1.0, generator=generator)
    assert sampled.shape == (1, 500)
    assert states_nbytes(long_states) == states_nbytes(short_states) > 0


@pytest.mark.slow
def test_softmax_generation_memory_is_bounded_by_its_segment():
    model = tiny_model("softmax", n_layers=1, context=8)
    _, states = model.generate(torch.tensor([[1]]), 500, temperature=1.0, generator=torch.Generator().manual_seed(0))
    # at most one segment of keys and values: 8 tokens × 2 heads × (8 + 8) fp32 numbers
    assert states_nbytes(states) <= 8 * 2 * 16 * 4


def test_greedy_generation_follows_the_argmax_of_the_teacher_forced_logits():
    model = tiny_model("dpfp-delta:nu=1")
    prompt = torch.tensor([[4, 5]])
    sampled, _ = model.generate(prompt, 12, temperature=0.0)
    sequence = torch.cat([prompt, sampled], dim=1)
    with torch.no_grad():
        logits, _ = model(sequence[:, :-1])
    assert torch.equal(logits[:, 1:].argmax(-1), sampled)


def test_sampling_is_reproducible_from_its_seed_and_top_k_restricts_it():
    model = tiny_model("linear")
    prompt = torch.tensor([[1, 2]])
    a, _ = model.generate(prompt, 40, temperature=1.0, generator=torch.Generator().manual_seed(3))
    b, _ = model.generate(prompt, 40, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    draws = torch.cat([sample_next(logits, 1.0, torch.Generator().manual_seed(i), top_k=2) for i in range(50)])
    assert set(draws.flatten().tolist()) <= {1, 2}


def test_tied_output_shares_the_embedding_and_untied_does_not():
    tied = DecoderLM("linear", DecoderConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    untied = DecoderLM("linear", DecoderConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                               tied_output=False))
    assert tied.output.weight is tied.embedding.weight
    assert untied.num_parameters() == tied.num_parameters() + VOCAB * 16


def test_vocabulary_travels_with_the_weights():
    config = DecoderConfig(vocab_size=3, d_model=8, n_heads=2, n_layers=1, d_ff=8)
    model = DecoderLM("softmax", config, vocabulary="ab\n")
    copy = DecoderLM("softmax", config)
    copy.load_state_dict(model.state_dict())
    assert copy.vocabulary == "ab\n" and DecoderLM("softmax", config).vocabulary is None


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: DecoderConfig(vocab_size=0), "vocab_size: got 0"),
        (lambda: DecoderConfig(vocab_size=5, d_model=10, n_heads=4), "d_model: got 10"),
        (lambda: DecoderConfig(vocab_size=5, positional="rotary"), "positional: got 'rotary'"),
        (lambda: DecoderConfig(vocab_size=5, dropout=1.0), "dropout: got 1.0"),
        (lambda: tiny_model("linear")(torch.zeros(2, 3)), "tokens: got"),
        (lambda: tiny_model("linear")(torch.zeros(2, 3, dtype=torch.int64), states=[None]), "states: got"),
        (lambda: tiny_model("linear").generate(torch.zeros(1, 0, dtype=torch.int64), 5), "prompt: got"),
        (lambda: tiny_model("linear").generate(torch.zeros(1, 1, dtype=torch.int64), 5, temperature=-1), "temperature"),
        (lambda: tiny_model("linear").generate(torch.zeros(1, 1, dtype=torch.int64), 5, top_k=99), "top_k: got 99"),
    ],
)
def test_bad_input_is_a_clear_error(build, expected):
    with pytest.raises(VariantError, match=expected):
        build()


@pytest.mark.parametrize(("change", "message"), [
    ({"prompt": [[1, 2]]}, "prompt: got 'list'; expected ids of shape (B, P) with P >= 1"),
    ({"n_tokens": 2.5}, "n_tokens: got 2.5; expected an integer >= 0"),
    ({"n_tokens": True}, "n_tokens: got True; expected an integer >= 0"),
    ({"n_tokens": None}, "n_tokens: got None; expected an integer >= 0"),
    ({"temperature": "1"}, "temperature: got '1'; expected a finite number >= 0 (0 = greedy)"),
    ({"top_k": 2.5}, f"top_k: got 2.5; expected an integer in [1, {VOCAB}] or None"),
    ({"top_k": True}, f"top_k: got True; expected an integer in [1, {VOCAB}] or None"),
])
def test_generate_arguments_of_another_type_are_refused_naming_them(change, message):
    """A float count or top_k raised a bare TypeError from range() or topk() (after the prompt's read), a
    string or None one from '<', a list prompt "AttributeError: 'list' object has no attribute 'dim'";
    a bool count (True) sampled one token."""
    arguments = {"prompt": torch.zeros(1, 1, dtype=torch.int64), "n_tokens": 2, **change}
    with pytest.raises(VariantError, match=f"^{re.escape(message)}$"):
        tiny_model("linear").generate(**arguments)


def test_a_temperature_of_any_real_type_samples_as_its_float():
    """numbers.Real passed the check, but a Fraction raised "TypeError: unsupported operand type(s) for
    /: 'Tensor' and 'Fraction'" dividing the logits, and an int past float's range "OverflowError: int
    too large to convert to float" from the check's math.isfinite."""
    model = tiny_model("linear")
    prompt = torch.tensor([[1, 2]])
    sampled = [model.generate(prompt, 4, t, torch.Generator().manual_seed(0))[0] for t in (Fraction(7, 10), 0.7)]
    assert torch.equal(*sampled)
    message = "temperature: got an integer of 401 digits; expected a finite number >= 0 (0 = greedy)"
    with pytest.raises(VariantError, match=f"^{re.escape(message)}$"):
        model.generate(prompt, 4, 10**400)


def test_a_refused_generation_leaves_the_model_in_training_mode():
    """generate switched the model to eval mode and back only when it returned: a refused prompt (an id
    outside the vocabulary) or non-finite logits left a training model in eval mode (dropout off)."""
    model = tiny_model("linear").train()
    with pytest.raises(VariantError, match="^tokens: got ids in"):
        model.generate(torch.tensor([[VOCAB]]), 2)
    assert model.training
    with torch.no_grad():
        model.output.weight.fill_(float("nan"))
    with pytest.raises(VariantError, match="^logits: got non-finite values"):
        model.generate(torch.tensor([[1]]), 2)
    assert model.training


def test_sampling_at_a_tiny_temperature_is_greedy_and_finite():
    logits = torch.tensor([[2.0, 5.0, -1.0], [0.5, 0.1, 0.4]])
    generator = torch.Generator().manual_seed(0)
    assert sample_next(logits, 1e-45, generator).tolist() == [[1], [0]]
    assert sample_next(logits, 0.0).tolist() == [[1], [0]]


def test_sampling_from_non_finite_logits_names_them():
    with pytest.raises(VariantError, match="logits: got non-finite values"):
        sample_next(torch.tensor([[0.0, float("nan")]]), 0.8, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dropout", [Fraction(1, 2), np.float32(0.5), np.float64(0.5), 0.5],
                         ids=["Fraction", "numpy float32", "numpy float64", "float"])
def test_a_real_dropout_the_config_accepts_trains_as_its_float(dropout):
    """numbers.Real passed the dropout check, but DecoderConfig(dropout=Fraction(1, 2)) then raised torch's
    bare TypeError at the first training forward (dropout(): argument 'p' (position 2) must be float, not
    Fraction). Every accepted real is kept as the float torch reads: the model drops as at 0.5."""
    config = DecoderConfig(vocab_size=VOCAB, d_model=8, n_heads=2, n_layers=1, d_ff=16, dropout=dropout)
    assert type(config.dropout) is float and config.dropout == 0.5
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    logits = []
    for _ in range(2):  # the same weights and the same dropout stream: the same logits as at 0.5
        torch.manual_seed(0)
        model = DecoderLM("linear", dataclasses.replace(config, dropout=0.5) if logits else config).train()
        torch.manual_seed(1)
        logits.append(model(tokens)[0])
    assert torch.equal(logits[0], logits[1])
