"""Values of ``variants/feature_maps.py`` that the last mutation pass left unchecked (issue 14 item
14): the per-token power-of-two scale of :func:`unit_scaled` at the edges of the float range, the
ELU+1 shift at its threshold, the maps' declared default sizes, and the checks of their integer
arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fwbench.variants import VariantError
from fwbench.variants.feature_maps import DPFP, ELU_SHIFT_BELOW, EluPlusOne, Favor, positive_int, unit_scaled

TINY32 = torch.finfo(torch.float32).tiny  # 2^-126, the smallest normal float32


def test_unit_scaled_multiplies_each_token_by_its_own_normal_power_of_two():
    """Each token (row) times 2^-e, e the frexp exponent of its largest |x| (max |x| = m·2^e with
    m in [0.5, 1)), e clipped to [-125, 125] so that 2^-e is a normal float32. By hand:
    3 = 0.75·2^2; 0.01 = 0.64·2^-6; 2^-126 = 0.5·2^-125; 1.5·2^124 = 0.75·2^125;
    2^127 = 0.5·2^128 (clipped to 125); 2^-140 = 0.5·2^-139 (clipped to -125)."""
    x = torch.tensor([[3.0, -1.0], [0.01, 0.002], [TINY32, TINY32 / 2], [1.5 * 2.0**124, 1.0],
                      [2.0**127, -2.0**126], [2.0**-140, 2.0**-141]], dtype=torch.float32)
    exponents = torch.tensor([2, -6, -125, 125, 125, -125], dtype=torch.float64)
    expected = x.double() * torch.exp2(-exponents)[:, None]
    y = unit_scaled(x)
    assert y.dtype == torch.float32
    assert torch.equal(y.double(), expected)
    # where the scale can reach it, the token's largest entry lands in [0.5, 1)
    top = y[:4].abs().amax(dim=-1)
    assert bool(((top >= 0.5) & (top < 1)).all())


def test_unit_scaled_keeps_float64_range_and_low_precision_dtypes():
    """float64: 2^-200 = 0.5·2^-199 is scaled by 2^199 (normal in float64, inf in float32);
    fp16 and bf16 stay in their dtype."""
    x = torch.tensor([[2.0**-200, 2.0**-201]], dtype=torch.float64)
    assert torch.equal(unit_scaled(x), torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    for dtype in (torch.float16, torch.bfloat16):
        y = unit_scaled(torch.tensor([[3.0, 1.0]], dtype=dtype))
        assert y.dtype == dtype and torch.equal(y, torch.tensor([[0.75, 0.25]], dtype=dtype))


def test_elu_plus_one_is_not_shifted_when_the_largest_coordinate_equals_the_threshold():
    """A token whose largest coordinate is exactly ELU_SHIFT_BELOW (-5) is not "every coordinate
    below" it: its features are φ(x) = elu(x) + 1 itself, not φ(x)·e^5."""
    x = torch.tensor([[ELU_SHIFT_BELOW, ELU_SHIFT_BELOW - 1.0]])
    assert torch.equal(EluPlusOne(2).for_queries(x), unit_scaled(F.elu(x) + 1.0))


def test_favor_declares_the_size_of_its_default_map():
    """FAVOR+ with the default m = 64 random features has d_dot = 2·64 = 128, declared and built."""
    assert Favor.output_size(8) == 128 == Favor(8).d_dot


def test_dpfp_declares_the_size_of_its_default_map():
    """DPFP with the default ν = 1 has d_dot = 2·d_key·1 = 16 at d_key 8, declared and built."""
    assert DPFP.output_size(8) == 16 == DPFP(8).d_dot


def test_favor_drops_the_overflowed_norm_of_one_token_whatever_the_other_tokens_hold():
    """A finite token with an entry of 1e20 (‖x‖² overflows in fp32) beside a NaN token and an
    ordinary one: each token's φ̂ = φ / Σφ is what it is for that token alone (no feature depends on
    another token), so the huge token's row is finite and sums to 1; only the NaN token is NaN."""
    torch.manual_seed(0)
    favor = Favor(4, m=8)
    x = torch.tensor([[[1e20, 0.0, 0.0, 0.0], [float("nan"), 0.0, 0.0, 0.0], [0.5, -0.2, 0.1, 0.3]]])
    features = favor.normalized(x)
    for token in (0, 2):
        alone = favor.normalized(x[:, token : token + 1])
        assert torch.equal(features[:, token : token + 1], alone)
        assert bool(torch.isfinite(alone).all()) and abs(float(alone.sum()) - 1.0) < 1e-6
    assert bool(features[0, 1].isnan().all())


@pytest.mark.parametrize("value", [0, -1, 2.5, 2.0, True, "3", None])
def test_positive_int_refuses_anything_but_an_integer_of_at_least_one(value):
    """Zero, negatives, floats (even 2.0), bools and strings: a one-line error naming the argument."""
    with pytest.raises(VariantError) as error:
        positive_int("chunk", value)
    assert str(error.value) == f"chunk: got {value!r}; expected a positive integer (>= 1)"


def test_positive_int_returns_python_ints_from_integers_from_one_on():
    for value in (1, 2, np.int64(3)):
        result = positive_int("chunk", value)
        assert result == int(value) and type(result) is int


def test_a_map_checks_d_key_and_dpfp_its_nu_by_name():
    """d_key 0 is refused as d_key; DPFP's default ν is 1 (d_dot 2·8); ν 0 and ν ≥ 2·d_key are
    refused as nu, the latter with the allowed range [1, 2·d_key − 1] = [1, 15] at d_key 8."""
    with pytest.raises(VariantError, match=r"^d_key: got 0; expected a positive integer \(>= 1\)$"):
        Favor(0)
    assert DPFP(8).nu == 1 and DPFP(8, nu=15).d_dot == 2 * 8 * 15
    with pytest.raises(VariantError, match=r"^nu: got 0; expected a positive integer \(>= 1\)$"):
        DPFP(8, nu=0)
    with pytest.raises(VariantError) as error:
        DPFP(8, nu=16)
    assert str(error.value) == "nu: got 16; expected an integer in [1, 15] (< 2·d_key)"


def test_favor_checks_its_m_by_name():
    with pytest.raises(VariantError, match=r"^m: got 0; expected a positive integer \(>= 1\)$"):
        Favor(8, m=0)
