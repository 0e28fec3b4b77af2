"""Non-finite values stay causal (issue 14.13): a NaN or ±inf at token t of a chunk leaves every
output before t as it was, in every form of every variant.

Inside a chunk the kernels multiply by masked matrices (tril(QKᵀ), the delta rule's T_c) whose
zeros meet the later tokens' rows; 0·NaN = NaN, so before the fix one NaN value at token t turned
the outputs of every earlier token of its chunk NaN. The outputs from t on may be anything.
"""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import FORMS, SPECS

from fwbench import variants

ALL_SPECS = [*SPECS, "tanh-fwm"]
T, BAD, D_KEY, D_V = 12, 7, 8, 5


@functools.cache
def module(spec: str) -> variants.Attention:
    torch.manual_seed(0)
    return variants.build_attention(spec, d_key=D_KEY).eval()


def forms_of(spec: str) -> tuple[str, ...]:
    return ("recurrent",) if variants.parse_spec(spec).info.rule == "fwm" else FORMS


def clean_inputs(attention: variants.Attention) -> dict[str, torch.Tensor | None]:
    g = torch.Generator().manual_seed(1)
    return {
        "q": torch.randn(2, 2, T, D_KEY, generator=g),
        "k": torch.randn(2, 2, T, D_KEY, generator=g),
        "v": torch.randn(2, 2, T, D_V, generator=g),
        "beta": torch.rand(2, 2, T, generator=g) if attention.uses_beta else None,
    }


def assert_earlier_outputs_unchanged(spec: str, where: str, value: float, whole_token: bool,
                                     rtol: float, atol: float) -> None:
    """Put ``value`` at token BAD of sequence 0, head 1 of input ``where`` (one entry, or every entry
    of the token with ``whole_token``) and check, in every form and with the token inside the one
    chunk and in the middle of a later one, that the outputs before it are as without it and that
    the other sequences and heads do not see it at all."""
    attention = module(spec)
    inputs = clean_inputs(attention)
    if inputs[where] is None:
        pytest.skip(f"{spec} takes no {where}")
    changed = dict(inputs)
    changed[where] = inputs[where].clone()
    if where == "beta" or whole_token:
        changed[where][0, 1, BAD] = value
    else:
        changed[where][0, 1, BAD, 2] = value  # one entry of one head of one sequence
    for form in forms_of(spec):
        for chunk_size in (T, 5):
            y, _ = attention(**inputs, form=form, chunk_size=chunk_size)
            y_changed, _ = attention(**changed, form=form, chunk_size=chunk_size)
            assert torch.isfinite(y_changed[:, :, :BAD]).all(), f"{form}, chunk {chunk_size}: non-finite before t"
            torch.testing.assert_close(y_changed[:, :, :BAD], y[:, :, :BAD], rtol=rtol, atol=atol)
            torch.testing.assert_close(y_changed[1], y[1], rtol=rtol, atol=atol)
            torch.testing.assert_close(y_changed[0, 0], y[0, 0], rtol=rtol, atol=atol)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["q", "k", "v", "beta"])
@pytest.mark.parametrize("spec", ALL_SPECS)
def test_a_non_finite_value_at_token_t_leaves_every_earlier_output_unchanged(spec, where, bad):
    assert_earlier_outputs_unchanged(spec, where, bad, whole_token=False, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", ["softmax", "linear", "dpfp-delta:nu=2"])
def test_a_nan_token_makes_the_later_outputs_non_finite_as_in_the_recurrent_form(spec, form):
    """Kept causal, not hidden: what the recurrent form makes non-finite after t, every form does."""
    attention = module(spec)
    inputs = clean_inputs(attention)
    inputs["v"][0, 1, BAD, 2] = float("nan")
    y_recurrent, _ = attention(**inputs, form="recurrent")
    y, _ = attention(**inputs, form=form, chunk_size=5)
    assert torch.equal(torch.isfinite(y), torch.isfinite(y_recurrent))
    assert not torch.isfinite(y[0, 1, BAD:]).all()


@pytest.mark.parametrize("spec", ["linear-fwm", "tanh-fwm", "dpfp-fwm:nu=1"])
def test_a_finite_value_that_overflows_inside_a_chunk_leaves_the_fwm_rule_causal(spec):
    """A value near 1e19 is finite, but its square overflows fp32 inside the chunked scan: the reads
    before it must still be the token-by-token recurrence's (break-it finding: all six were NaN)."""
    attention = module(spec)
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 6, D_KEY).unbind(0)
    v = torch.randn(1, 1, 6, 4)
    v[0, 0, 3, 0] = 1e19
    beta = torch.ones(1, 1, 6)
    y, _ = attention(q, k, v, beta=beta)
    steps, state = [], None
    for t in range(6):
        y_t, state = attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], beta=beta[:, :, t : t + 1],
                               state=state)
        steps.append(y_t)
    assert torch.isfinite(y[:, :, :3]).all()
    torch.testing.assert_close(y[:, :, :3], torch.cat(steps, dim=2)[:, :, :3], rtol=1e-5, atol=1e-6)


UNNORM_SPECS = ["linear-delta-unnorm", "favor-delta-unnorm:m=4", "dpfp-delta-unnorm:nu=1"]


@pytest.mark.parametrize("scale", [1e10, 1e20, 1e38, -1e38, 3e38, -3e38])
@pytest.mark.parametrize("where", ["q", "k", "v", "beta"])
@pytest.mark.parametrize("spec", [*ALL_SPECS, *UNNORM_SPECS])
def test_a_finite_value_whose_products_overflow_leaves_every_earlier_output_unchanged(spec, where, scale):
    """A finite but huge value at token t (break-it finding: a key of 1e20 into ``linear-delta-unnorm``
    made K Kᵀ inf in the parallel and chunk forms, and every output of the sequence NaN, while the
    recurrent form stayed finite before t): the outputs before t are those without it, in every form,
    and no other sequence or head sees it."""
    # every entry of one token: ‖k‖² = 8·scale² overflows fp32 from about 1e19
    assert_earlier_outputs_unchanged(spec, where, scale, whole_token=True, rtol=1e-5, atol=1e-6)
