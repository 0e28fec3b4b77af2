"""Numerical robustness of every variant, through the public interface
(``variants.build_attention(spec, d_key)(q, k, v, beta, form=...)``):

- fp32, fp16 and bf16 inputs up to T = 8192, in every form: finite outputs in the input dtype, a
  fp32 state, and a bounded error against fp32 (the T = 8192 cases are marked slow);
- FAVOR+ stays causal at large input norms: no stabiliser computed over the sequence;
- φ(0) is finite for every feature map, also sum-normalised and in low precision;
- the delta rule's fast weight stays bounded over long random sequences (sum-normalised keys,
  β in (0, 1)), where the sum rule's grows without bound.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from helpers import assert_close

from fwbench import variants
from fwbench.variants import DPFP, EluPlusOne, Favor, Tanh, sum_normalize

SPECS = ["softmax", "linear", "favor:m=16", "dpfp:nu=2", "linear-delta", "favor-delta:m=16", "dpfp-delta:nu=2"]
DELTA_SPECS = [s for s in SPECS if variants.parse_spec(s).info.rule == "delta"]
FORMS = ("parallel", "chunk", "recurrent")
D_KEY = D_V = 16

#: Relative RMSE allowed against the fp32 computation on the same (rounded) inputs. fp32: the forms
#: agree to ~2e-6 at T = 8192. fp16/bf16: outputs are rounded once to the input dtype (unit roundoff
#: 4.9e-4 / 3.9e-3) and φ may run in it; the measured worst cases at T = 8192 are 6e-4 / 5e-3. A state
#: or normaliser accumulated in the low dtype would miss by orders of magnitude (a bf16 running sum
#: of ~1-sized terms stops growing at 256).
REL_RMSE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@functools.cache
def module(spec: str) -> variants.Attention:
    torch.manual_seed(0)  # FAVOR+ draws Ω here, once per spec, shared by test and reference
    return variants.build_attention(spec, d_key=D_KEY).eval()


def inputs(T: int, dtype: torch.dtype, seed: int = 1) -> dict[str, torch.Tensor]:
    """q, k, v ~ N(0, 1), β ~ U(0, 1) of one sequence, rounded to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(1, 1, T, D_KEY, generator=g).to(dtype),
        "k": torch.randn(1, 1, T, D_KEY, generator=g).to(dtype),
        "v": torch.randn(1, 1, T, D_V, generator=g).to(dtype),
        "beta": torch.rand(1, 1, T, generator=g).to(dtype),
    }


@functools.cache
def fp32_reference(spec: str, dtype: torch.dtype, T: int):
    """fp32 chunk-form output and state on the ``dtype``-rounded inputs cast up to fp32."""
    upcast = {name: x.float() for name, x in inputs(T, dtype).items()}
    with torch.no_grad():
        return module(spec)(**upcast, form="chunk")


def check_precision(spec: str, form: str, dtype: torch.dtype, T: int) -> None:
    with torch.no_grad():
        y, state = module(spec)(**inputs(T, dtype), form=form)
    y_ref, state_ref = fp32_reference(spec, dtype, T)
    assert y.dtype == dtype and y.shape == (1, 1, T, D_V)
    assert torch.isfinite(y).all()
    assert_close(y.float(), y_ref, REL_RMSE[dtype])
    if isinstance(state, variants.FastWeightState):
        assert state.W.dtype == torch.float32 and (state.z is None or state.z.dtype == torch.float32)
        assert_close(state.W, state_ref.W, REL_RMSE[dtype])
        if state.z is not None:
            assert_close(state.z, state_ref.z, REL_RMSE[dtype])
    else:  # a KV cache keeps the inputs as they came
        assert state.k.dtype == dtype and torch.equal(state.k.float(), state_ref.k)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS)
def test_low_precision_inputs_give_finite_outputs_close_to_fp32(spec, form, dtype):
    check_precision(spec, form, dtype, T=300)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS)
def test_low_precision_inputs_give_finite_outputs_close_to_fp32_at_T_8192(spec, form, dtype):
    check_precision(spec, form, dtype, T=8192)


# ------------------------------------------------------------------------------------------------
# FAVOR+ stabilisation and causality.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("past_scale", [1.0, 2.0])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", ["favor:m=16", "favor-delta:m=16"])
def test_favor_outputs_ignore_future_tokens_even_of_huge_norm(spec, form, past_scale):
    """A stabiliser taken over the whole sequence (max of ωᵀk over all keys, as some Performer code
    does) would let one huge future key shrink every past key's features to 0 and change the past."""
    T, t0 = 48, 20
    x = inputs(T, torch.float32, seed=3)
    x["q"], x["k"] = x["q"] * past_scale, x["k"] * past_scale
    future = inputs(T, torch.float32, seed=4)
    perturbed = dict(x)
    for name in ("q", "k", "v"):
        perturbed[name] = x[name].clone()
        perturbed[name][:, :, t0:] = future[name][:, :, t0:] * 100.0
    perturbed["beta"] = x["beta"].clone()
    perturbed["beta"][:, :, t0:] = 1.0 - x["beta"][:, :, t0:]
    attention = module(spec)
    y, _ = attention(**x, form=form, chunk_size=16)
    y_perturbed, _ = attention(**perturbed, form=form, chunk_size=16)
    assert torch.isfinite(y).all() and torch.isfinite(y_perturbed).all()
    torch.testing.assert_close(y_perturbed[:, :, :t0], y[:, :, :t0], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(y_perturbed[:, :, t0:], y[:, :, t0:])  # the perturbation did reach the future


@pytest.mark.parametrize("scale", [1.0, 4.0, 10.0, 1e3])
@pytest.mark.parametrize("spec", ["favor:m=16", "favor-delta:m=16"])
def test_favor_is_finite_for_large_inputs_in_every_dtype(spec, scale):
    """The per-token offset ‖x‖²/2 and the exponent window keep exp from overflowing, and from
    underflowing to an all-zero feature vector at large norms: finite, never NaN, in every dtype."""
    attention = module(spec)
    for dtype in DTYPES.values():
        x = {name: (t * scale if name in "qk" else t) for name, t in inputs(64, torch.float32, seed=6).items()}
        x = {name: t.to(dtype) for name, t in x.items()}
        features = attention.feature_map(x["k"])
        assert torch.isfinite(features).all() and (features >= 0).all()
        for form in FORMS:
            y, state = attention(**x, form=form, chunk_size=16)
            assert torch.isfinite(y).all() and torch.isfinite(state.W).all()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", ["favor:m=64", "favor-delta:m=64"])
def test_favor_does_not_overflow_for_keys_along_its_random_features_at_large_d_key(spec, form):
    """x along a column ω of Ω gives the exponent ωᵀx − ‖x‖²/2 = ‖ω‖²/2 ≈ d_key/2: e^128 at d_key 256."""
    torch.manual_seed(0)
    attention = variants.build_attention(spec, d_key=256).eval()
    aligned = attention.feature_map.omega[:, :6].T.reshape(1, 1, 6, 256).contiguous()
    assert (aligned.pow(2).sum(-1) / 2).max() > 100  # the plain formula would overflow fp32 here
    v, beta = torch.randn(1, 1, 6, 4), torch.rand(1, 1, 6)
    y, state = attention(aligned, aligned, v, beta=beta, form=form, chunk_size=4)
    assert torch.isfinite(y).all() and torch.isfinite(state.W).all()
    assert y.abs().max() <= v.abs().max() * (1 + 1e-5)  # still a mixture of the values


def test_favor_overflow_guard_leaves_ordinary_tokens_exactly_as_the_estimator_defines_them():
    favor = module("favor:m=16").feature_map
    x = torch.randn(2, 3, 50, D_KEY)
    projection = x @ favor.omega
    offset = 0.5 * x.pow(2).sum(-1, keepdim=True) + 0.5 * math.log(2 * favor.m)
    plain = torch.cat([torch.exp(projection - offset), torch.exp(-projection - offset)], dim=-1)
    assert torch.equal(favor(x), plain)


# ------------------------------------------------------------------------------------------------
# φ(0).
# ------------------------------------------------------------------------------------------------

FEATURE_MAPS = {
    "elu+1": lambda: EluPlusOne(D_KEY),
    "favor": lambda: Favor(D_KEY, m=8),
    "dpfp-nu1": lambda: DPFP(D_KEY, nu=1),
    "dpfp-nu3": lambda: DPFP(D_KEY, nu=3),
    "tanh": lambda: Tanh(D_KEY),
}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_feature_map_of_zero_vector_is_finite(name, dtype):
    feature_map = FEATURE_MAPS[name]()
    zero = torch.zeros(1, 1, 3, D_KEY, dtype=dtype)
    phi = feature_map(zero)
    assert phi.shape[-1] == feature_map.d_dot
    assert torch.isfinite(phi).all()
    assert torch.isfinite(sum_normalize(phi)).all()


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("spec", [s for s in SPECS if s != "softmax"])
def test_every_variants_phi_of_zero_is_finite(spec, dtype):
    attention = module(spec)
    assert torch.isfinite(attention.phi(torch.zeros(1, 1, 2, D_KEY, dtype=dtype))).all()


# ------------------------------------------------------------------------------------------------
# The delta rule's fast weight stays bounded.
# ------------------------------------------------------------------------------------------------


def fast_weight_sizes(spec: str, pieces: int = 8, piece: int = 2048) -> tuple[list[float], float]:
    """max |W| after each piece of a long random stream (carried state), and max |v| seen."""
    attention = module(spec)
    g = torch.Generator().manual_seed(5)
    state, sizes, v_max = None, [], 0.0
    with torch.no_grad():
        for _ in range(pieces):
            q, k = (3.0 * torch.randn(1, 2, piece, D_KEY, generator=g) for _ in range(2))
            v = torch.randn(1, 2, piece, D_V, generator=g)
            beta = torch.rand(1, 2, piece, generator=g).clamp(1e-3, 1 - 1e-3)
            _, state = attention(q, k, v, beta=beta, state=state, form="chunk")
            sizes.append(state.W.abs().max().item())
            v_max = max(v_max, v.abs().max().item())
    return sizes, v_max


@pytest.mark.parametrize("spec", DELTA_SPECS)
def test_delta_rule_fast_weight_stays_bounded_over_long_random_sequences(spec):
    """With Σφ(k) = 1 and β ∈ (0, 1), each write moves W's response to k a β-fraction of the way to v,
    so W stores mixtures of values: it stays within the values' range and does not grow with T."""
    sizes, v_max = fast_weight_sizes(spec)
    assert all(size == size and size < float("inf") for size in sizes)
    assert max(sizes) <= v_max
    half = len(sizes) // 2
    assert max(sizes[half:]) <= 1.5 * max(sizes[:half])  # no growth with the sequence length


def test_sum_rule_fast_weight_grows_where_the_delta_rules_does_not():
    """The control: the same stream written with the sum rule makes ‖W‖ grow with T."""
    sizes, v_max = fast_weight_sizes("linear", pieces=4)
    assert sizes[-1] > 2 * sizes[0] and sizes[-1] > 10 * v_max
