"""Property tests (hypothesis) of every variant's kernels, through the public interface: for random
shapes, chunk sizes and split points,

- the parallel, chunk and recurrent forms agree (outputs and carried state);
- the carried state is associative: a sequence processed in k pieces, each in any form, with the
  state handed from piece to piece, equals one pass over it.

Example counts are modest (25 per property) and derandomised, so that CI is repeatable; run with
``--hypothesis-seed`` or change ``derandomize`` to explore further.
"""

from __future__ import annotations

import itertools

import torch
from helpers import assert_close, assert_states_close
from hypothesis import given, settings
from hypothesis import strategies as st

from fwbench import variants

SPECS = ["softmax", "linear", "favor:m=5", "dpfp:nu=2", "linear-delta", "favor-delta:m=5", "dpfp-delta:nu=2",
         "softmax:window=3"]
FORMS = ("parallel", "chunk", "recurrent")
TOL = 1e-4

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True)


@st.composite
def problems(draw, max_T: int = 70):
    """A variant, random (B, H, T, d_key, d_v), a seed for the tensors and a chunk size."""
    return {
        "spec": draw(st.sampled_from(SPECS)),
        "B": draw(st.integers(1, 2)),
        "H": draw(st.integers(1, 3)),
        "T": draw(st.integers(0, max_T)),
        "d_key": draw(st.integers(2, 7)),
        "d_v": draw(st.integers(1, 5)),
        "chunk_size": draw(st.integers(1, 40)),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def random_inputs(problem, T: int) -> dict[str, torch.Tensor]:
    B, H = problem["B"], problem["H"]
    return {
        "q": torch.randn(B, H, T, problem["d_key"]),
        "k": torch.randn(B, H, T, problem["d_key"]),
        "v": torch.randn(B, H, T, problem["d_v"]),
        "beta": torch.rand(B, H, T),
    }


def build(problem) -> tuple[variants.Attention, dict[str, torch.Tensor]]:
    torch.manual_seed(problem["seed"])
    attention = variants.build_attention(problem["spec"], d_key=problem["d_key"]).eval()
    return attention, random_inputs(problem, problem["T"])


def piece(inputs: dict[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
    return {name: x[:, :, start:stop] for name, x in inputs.items()}


@PROPERTY
@given(problems(), st.booleans())
def test_parallel_chunk_and_recurrent_forms_agree(problem, carried):
    attention, inputs = build(problem)
    state = None
    if carried:  # start from the state a random prefix leaves
        _, state = attention(**random_inputs(problem, 5), form="recurrent")
    y_rec, s_rec = attention(**inputs, state=state, form="recurrent")
    for form in ("parallel", "chunk"):
        y, s = attention(**inputs, state=state, form=form, chunk_size=problem["chunk_size"])
        assert y.shape == y_rec.shape == (problem["B"], problem["H"], problem["T"], problem["d_v"])
        assert_close(y, y_rec, TOL)
        assert_states_close(s, s_rec, TOL)


@PROPERTY
@given(problems(), st.data())
def test_carried_state_is_associative_over_any_split(problem, data):
    attention, inputs = build(problem)
    T = problem["T"]
    cuts = sorted(data.draw(st.lists(st.integers(0, T), max_size=4), label="split points"))
    forms = data.draw(st.lists(st.sampled_from(FORMS), min_size=len(cuts) + 1, max_size=len(cuts) + 1),
                      label="form of each piece")
    y_one, s_one = attention(**inputs, form="chunk", chunk_size=problem["chunk_size"])
    bounds = [0, *cuts, T]
    outputs, state = [], None
    for (start, stop), form in zip(itertools.pairwise(bounds), forms, strict=True):
        y, state = attention(**piece(inputs, start, stop), state=state, form=form, chunk_size=problem["chunk_size"])
        outputs.append(y)
    assert_close(torch.cat(outputs, dim=2), y_one, TOL)
    assert_states_close(state, s_one, TOL)
