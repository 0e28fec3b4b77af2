"""``check_spec`` refuses, without building anything, exactly the specs whose feature map refuses
its parameters when built (found by h-break14g: a spec parses whatever its parameters' size, so a
grid naming ``favor:m=65537`` or ``dpfp:nu=16`` at d_key 8 loaded and every run failed when built)."""

from __future__ import annotations

import pytest

from fwbench.variants import VariantError, build_attention
from fwbench.variants.feature_maps import FAVOR_MAX_FEATURES
from fwbench.variants.registry import check_spec


def refusal(check, spec: str, d_key: int) -> str | None:
    """The VariantError message of ``check(spec, d_key)``, or ``None`` when it accepts."""
    try:
        check(spec, d_key)
    except VariantError as exc:
        return str(exc)
    return None


def refused_when_built(spec: str, d_key: int) -> str | None:
    return refusal(build_attention, spec, d_key)


def refused_by_check(spec: str, d_key: int) -> str | None:
    return refusal(check_spec, spec, d_key)


@pytest.mark.parametrize("d_key", [1, 2, 3, 8])
def test_dpfp_nu_is_refused_from_two_d_key_on_as_when_built(d_key):
    for nu in range(1, 2 * d_key + 3):
        spec = f"dpfp-delta:nu={nu}"
        assert refused_by_check(spec, d_key) == refused_when_built(spec, d_key)
        assert (refused_by_check(spec, d_key) is None) == (nu < 2 * d_key)


def test_favor_m_is_refused_above_the_window_bound_as_when_built():
    assert refused_by_check(f"favor:m={FAVOR_MAX_FEATURES}", 2) is None
    message = refused_by_check(f"favor:m={FAVOR_MAX_FEATURES + 1}", 2)
    assert message == refused_when_built(f"favor:m={FAVOR_MAX_FEATURES + 1}", 2)
    assert message.startswith(f"m: got {FAVOR_MAX_FEATURES + 1}; expected an integer in [1, {FAVOR_MAX_FEATURES}]")
    assert refused_by_check("favor:m=9223372036854775807", 64) is not None  # never builds Ω


@pytest.mark.parametrize("spec", ["softmax", "linear", "tanh-fwm", "dpfp:nu=1", "favor:m=4"])
def test_check_spec_refuses_a_key_size_below_one_and_returns_the_parsed_spec(spec):
    assert str(check_spec(spec, 4)) == str(check_spec(check_spec(spec, 4), 4))
    if spec != "softmax":  # softmax has no feature map; its d_key is checked when built
        assert refused_by_check(spec, 0) == refused_when_built(spec, 0) == "d_key: got 0; expected a positive integer (>= 1)"
