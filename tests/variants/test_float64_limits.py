"""float64 computes with float64's numeric limits, fp32 with fp32's (issue 14, items 1 and 2).

The normalisers' floor and FAVOR+'s exponent window keep values away from the edges of the dtype
they are computed in (:mod:`variants.kernels.limits`). Before, float64 used fp32's (floor 1e-30,
window [−40, 30]):

- FAVOR+ (``favor:m=16``, d_key 64) with keys N(0, 1)·64^-1/4·6 (largest exponents ≈ −90 … −145,
  below fp32's window, far inside float64's range) had its keys moved into the window, and output
  rows differed from the exact float64 estimator by up to 0.99;
- DPFP with N(0, 1)·1e-16 queries and keys gave rows summing to ≈ 1e-3 (mass below 1e-30), and
  ≈ 1e-11 at 1e-20.

Here: those rows against the exact float64 estimator and against scale 1, in every form with a
carried state; fp32 (and fp16/bf16, which compute in fp32) bit for bit what the old constants give;
gradcheck through float64's window.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import FORMS

from fwbench import variants
from fwbench.variants import feature_maps
from fwbench.variants.kernels import limits
from fwbench.variants.kernels.limits import FLOAT64_LIMITS, NumericLimits, numeric_limits

#: The constants every dtype used before (fp32's): floor 1e-30, FAVOR+ window [−40, 30], range 20.
OLD_LIMITS = NumericLimits(floor=1e-30, favor_max_exponent=30.0, favor_min_exponent=-40.0, favor_feature_range=20.0)
D_KEY, T, PREFIX = 64, 6, 3


def build(spec: str, d_key: int, dtype: torch.dtype = torch.float64) -> variants.Attention:
    torch.manual_seed(0)  # FAVOR+ draws Ω here
    return variants.build_attention(spec, d_key=d_key).to(dtype).eval()


def with_carried_state(attention: variants.Attention, q, k, v, form: str) -> torch.Tensor:
    """Outputs of the whole sequence, run as a prefix and a rest that starts from its state."""
    y_prefix, state = attention(q[:, :, :PREFIX], k[:, :, :PREFIX], v[:, :, :PREFIX], form=form, chunk_size=2)
    y_rest, _ = attention(q[:, :, PREFIX:], k[:, :, PREFIX:], v[:, :, PREFIX:], state=state, form=form,
                          chunk_size=2)
    return torch.cat([y_prefix, y_rest], dim=2)


def favor_features_by_definition(omega: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """φ(x) = [exp(Ωᵀx − ‖x‖²/2), exp(−Ωᵀx − ‖x‖²/2)] / √(2m), no window, no stabiliser."""
    projection = x @ omega
    half_norm = 0.5 * x.pow(2).sum(-1, keepdim=True)
    return torch.cat([torch.exp(projection - half_norm), torch.exp(-projection - half_norm)], -1) / math.sqrt(
        omega.shape[1] * 2)


def repro_inputs(T: int = T, d_key: int = D_KEY, key_scale: float = 6.0):
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 1, T, d_key, generator=g, dtype=torch.float64) * d_key**-0.25
    k = torch.randn(1, 1, T, d_key, generator=g, dtype=torch.float64) * d_key**-0.25 * key_scale
    return q, k


@pytest.mark.parametrize("form", FORMS)
def test_favor_float64_rows_are_the_exact_estimators_for_keys_below_fp32s_window(form):
    attention = build("favor:m=16", D_KEY)
    q, k = repro_inputs()
    top = attention.feature_map.exponents(k).amax(-1)
    # below fp32's window (where they used to be moved), inside float64's
    assert (top < OLD_LIMITS.favor_min_exponent).all() and (top > FLOAT64_LIMITS.favor_min_exponent).all()
    weights = (favor_features_by_definition(attention.feature_map.omega, q)
               @ favor_features_by_definition(attention.feature_map.omega, k).mT).tril()
    exact = weights / weights.sum(-1, keepdim=True)                  # (1, 1, T, T): the attention rows
    y = with_carried_state(attention, q, k, torch.eye(T, dtype=torch.float64).expand(1, 1, T, T), form)
    torch.testing.assert_close(y, exact, rtol=1e-10, atol=1e-13)


def test_favor_float64_write_then_read_and_one_hot_read_are_the_exact_estimators():
    """The reads without a causal mask (every key written, then read): write_read, read from a state,
    and the retrieval task's one-hot read, which divides by the floor itself."""
    from fwbench.tasks.one_hot_read import one_hot_write_read

    attention = build("favor:m=16", D_KEY)
    q, k = repro_inputs()
    weights = (favor_features_by_definition(attention.feature_map.omega, q)
               @ favor_features_by_definition(attention.feature_map.omega, k).mT)
    exact = weights / weights.sum(-1, keepdim=True)
    identity = torch.eye(T, dtype=torch.float64).expand(1, 1, T, T)
    torch.testing.assert_close(attention.write_read(k, identity, q), exact, rtol=1e-10, atol=1e-13)
    _, state = attention(k, k, identity, form="chunk", chunk_size=2)       # writes every key
    torch.testing.assert_close(attention.read(q, state), exact, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(one_hot_write_read(attention, k, torch.arange(T)[None], q, T), exact,
                               rtol=1e-10, atol=1e-13)


DPFP_SPECS = ["dpfp:nu=1", "dpfp:nu=2"]


@pytest.mark.parametrize("scale", [1e-16, 1e-20, 1e-100])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", DPFP_SPECS)
def test_dpfp_float64_rows_sum_to_one_and_equal_scale_one_at_tiny_scales(spec, form, scale):
    """φ(ck) = c²φ(k) for every key and the query's factor cancels: the rows at scale c are those at
    scale 1 (float64 holds the masses c²·φ(k)·φ(q) down to c ≈ 1e-140)."""
    attention = build(spec, 32)
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 16, 32, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.eye(16, dtype=torch.float64).expand(1, 2, 16, 16)
    y = with_carried_state(attention, q * scale, k * scale, v, form)
    torch.testing.assert_close(y.sum(-1), torch.ones(1, 2, 16, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(y, with_carried_state(attention, q, k, v, form), rtol=1e-10, atol=1e-14)


def test_fp32_and_narrower_dtypes_keep_the_old_limits_and_float64_gets_its_own():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert numeric_limits(dtype) == OLD_LIMITS
    wide = numeric_limits(torch.float64)
    assert wide.floor == 1e-300 and (wide.favor_min_exponent, wide.favor_max_exponent) == (-600.0, 300.0)
    # the margins of the module docstring: products and 10^6-token sums of 1024 features finite, the
    # smallest out-of-window product above the floor and above float64's smallest normal number
    assert 2 * wide.favor_max_exponent + math.log(1e6 * 1024) < math.log(torch.finfo(torch.float64).max)
    edge = wide.favor_min_exponent - wide.favor_feature_range
    assert edge > math.log(wide.floor) and edge > math.log(torch.finfo(torch.float64).tiny)


def _old_limits_everywhere(monkeypatch) -> None:
    monkeypatch.setattr(limits, "numeric_limits", lambda dtype: OLD_LIMITS)
    monkeypatch.setattr(feature_maps, "numeric_limits", lambda dtype: OLD_LIMITS)


FP32_SPECS = ["favor:m=16", "favor-delta:m=16", "dpfp:nu=2", "dpfp-delta:nu=2", "linear"]


@pytest.mark.parametrize("scale", [1e-20, 1e-3, 1.0, 10.0, 1e3, 1e20])
@pytest.mark.parametrize("spec", FP32_SPECS)
def test_fp32_outputs_are_bit_for_bit_those_of_the_old_constants(spec, scale, monkeypatch):
    attention = build(spec, 32, torch.float32)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 12, 32, generator=g) * s for s in (scale, scale, 1.0))
    beta = torch.rand(1, 2, 12, generator=g) if attention.uses_beta else None
    # at scale 1e3 FAVOR+ keys lie above fp32's window and at 10 (d_key 32) below it: both guards act
    now = [attention(q, k, v, beta=beta, form=form, chunk_size=4) for form in FORMS]
    now_read = attention.write_read(k, v, q) if not attention.uses_beta else None
    with monkeypatch.context() as patch:
        _old_limits_everywhere(patch)
        old = [attention(q, k, v, beta=beta, form=form, chunk_size=4) for form in FORMS]
        old_read = attention.write_read(k, v, q) if not attention.uses_beta else None
    for (y, state), (y_old, state_old) in zip(now, old, strict=True):
        assert same_bits(y, y_old) and same_bits(state.W, state_old.W)
        assert state.z is None or same_bits(state.z, state_old.z)
    assert now_read is None or same_bits(now_read, old_read)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal where NaN counts as equal to NaN (at scale 1e20 fp32 products overflow)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


def test_fp32_favor_features_are_the_old_window_formula_bit_for_bit():
    favor = feature_maps.Favor(32, m=16)
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(4, 32, generator=g) * s for s in (1e-3, 1.0, 10.0, 1e3)])
    exponent = favor.exponents(x)
    top = exponent.amax(-1, keepdim=True)
    shift = top - top.clamp(-40.0, 30.0)
    floor = torch.where(shift != 0, top - 20.0, float("-inf"))
    assert (shift != 0).any() and (shift == 0).any()
    assert torch.equal(favor(x), torch.exp(torch.maximum(exponent, floor) - shift))


def test_float64_favor_window_edges_and_floor_are_float64s():
    """Keys below float64's window are scaled to its edge e^-600, the others kept within e^-50."""
    favor = build("favor:m=16", 32).feature_map
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 10.0
    exponent = favor.exponents(x)                       # ‖x‖²/2 ≈ 1600: below float64's window too
    top = exponent.amax(-1, keepdim=True)
    assert (top < -600).all() and ((exponent - top) < -50).any()
    phi = favor(x)
    torch.testing.assert_close(phi.amax(-1), torch.full((3,), math.exp(-600.0), dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(phi / phi.amax(-1, keepdim=True), torch.exp((exponent - top).clamp(min=-50.0)),
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("key_scale", [6.0, 20.0])   # inside float64's window, and below it
def test_favor_gradcheck_in_float64_at_the_window(key_scale):
    attention = build("favor:m=4", D_KEY)
    q, k = repro_inputs(T=4, key_scale=key_scale)
    v = torch.randn(1, 1, 4, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    for form in FORMS:
        assert torch.autograd.gradcheck(
            lambda q, k, v, form=form: attention(q, k, v, form=form, chunk_size=2)[0],
            (q.clone().requires_grad_(True), k.clone().requires_grad_(True), v.clone().requires_grad_(True)),
            eps=1e-7)


@pytest.mark.parametrize("spec", DPFP_SPECS + ["dpfp-delta:nu=2", "favor-delta:m=4"])
def test_gradcheck_in_float64_small_shapes(spec):
    attention = build(spec, 3)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 1, 5, d, generator=g, dtype=torch.float64) for d in (3, 3, 2))
    beta = torch.rand(1, 1, 5, generator=g, dtype=torch.float64) if attention.uses_beta else None
    for form in FORMS:
        assert torch.autograd.gradcheck(
            lambda q, k, v, form=form: attention(q, k, v, beta=beta, form=form, chunk_size=2)[0],
            (q.clone().requires_grad_(True), k.clone().requires_grad_(True), v.clone().requires_grad_(True)))
