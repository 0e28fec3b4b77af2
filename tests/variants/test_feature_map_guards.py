"""The feature maps' guards, value by value (survivors of a mutation-testing pass over
``variants/feature_maps.py`` and ``variants/kernels/``):

- FAVOR+ outside its exponent window: features relative to the largest are exactly
  exp(max(e − max e, −range)), and the largest sits at the window's edge (in float64, so with
  float64's window and range, :func:`~variants.kernels.limits.numeric_limits`);
- DPFP's sum normalisation below its floor: φ̂ = φ / floor, with the gradient of that;
- Ω's draw: a given generator makes it repeatable without touching the global RNG, and every
  column gets its own norm (a shared norm per block would keep the blocks orthogonal but give the
  columns the wrong distribution).
"""

from __future__ import annotations

import math

import torch

from fwbench.variants import Favor
from fwbench.variants.feature_maps import orthogonal_gaussian
from fwbench.variants.kernels.dpfp import dpfp
from fwbench.variants.kernels.limits import numeric_limits

#: These tests compute in float64: its window, range and floor apply.
LIMITS = numeric_limits(torch.float64)
FAVOR_MAX_EXPONENT, FAVOR_MIN_EXPONENT = LIMITS.favor_max_exponent, LIMITS.favor_min_exponent
FAVOR_FEATURE_RANGE = LIMITS.favor_feature_range


def test_favor_token_below_the_window_keeps_its_feature_ratios_down_to_the_floor():
    torch.manual_seed(0)
    favor = Favor(32, m=16).double()
    x = torch.randn(3, 32, dtype=torch.float64) * 10.0   # ‖x‖²/2 ≈ 1600: far below the window
    exponent = favor.exponents(x)
    top = exponent.amax(-1, keepdim=True)
    assert (top < FAVOR_MIN_EXPONENT).all() and ((exponent - top) < -FAVOR_FEATURE_RANGE).any()
    phi = favor(x)
    torch.testing.assert_close(phi.amax(-1), torch.full((3,), math.exp(FAVOR_MIN_EXPONENT), dtype=torch.float64))
    expected = torch.exp((exponent - top).clamp(min=-FAVOR_FEATURE_RANGE))
    torch.testing.assert_close(phi / phi.amax(-1, keepdim=True), expected, rtol=1e-12, atol=0)


def test_favor_token_above_the_window_is_scaled_to_its_edge_with_the_same_floor():
    torch.manual_seed(0)
    favor = Favor(1024, m=8).double()
    x = favor.omega[:, :2].T.contiguous()                 # along columns of Ω: exponent ≈ ‖ω‖²/2 ≈ 512
    exponent = favor.exponents(x)
    top = exponent.amax(-1, keepdim=True)
    assert (top > FAVOR_MAX_EXPONENT).all()
    phi = favor(x)
    torch.testing.assert_close(phi.amax(-1), torch.full((2,), math.exp(FAVOR_MAX_EXPONENT), dtype=torch.float64))
    expected = torch.exp((exponent - top).clamp(min=-FAVOR_FEATURE_RANGE))
    torch.testing.assert_close(phi / phi.amax(-1, keepdim=True), expected, rtol=1e-12, atol=0)


def _favor_outside_the_window(favor: Favor, x: torch.Tensor) -> torch.Tensor:
    """φ of tokens outside the window from its definition, every term differentiated: exponents
    e = ±Ωᵀx − ‖x‖²/2 − ½ log 2m, top = max e, φ = exp(max(e, top − R) − top + clamp(top))."""
    projection = x @ favor.omega
    e = torch.cat([projection, -projection], -1) - 0.5 * x.pow(2).sum(-1, keepdim=True) - 0.5 * math.log(2 * favor.m)
    top = e.amax(-1, keepdim=True)
    assert ((top < FAVOR_MIN_EXPONENT) | (top > FAVOR_MAX_EXPONENT)).all()
    return torch.exp(torch.maximum(e, top - FAVOR_FEATURE_RANGE) - top + top.clamp(FAVOR_MIN_EXPONENT, FAVOR_MAX_EXPONENT))


def test_favor_gradients_outside_the_window_are_those_of_the_features_computed():
    """A token outside the window is shifted by a factor of its own that no normalisation of a key
    cancels: its gradient must include the shift's. Detached, the gradient missed −∂top·φ (relative
    error ≈ 1 here) and the sum rule's float64 gradcheck failed in every form."""
    torch.manual_seed(0)
    for favor, x in ((Favor(32, m=16).double(), torch.randn(3, 32, dtype=torch.float64) * 10.0),  # below
                     (Favor(1024, m=8).double(), None)):                                              # above
        x = (favor.omega[:, :2].T.contiguous() if x is None else x).requires_grad_(True)
        x_ref = x.detach().clone().requires_grad_(True)
        cotangent = torch.randn(x.shape[0], favor.d_dot, dtype=torch.float64) * favor(x.detach()).reciprocal()
        (favor(x) * cotangent).sum().backward()
        (_favor_outside_the_window(favor, x_ref) * cotangent).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-9, atol=0)


def test_favor_sum_rule_gradcheck_with_keys_below_the_window():
    from fwbench import variants

    torch.manual_seed(0)
    attention = variants.build_attention("favor:m=4", d_key=64).double()
    g = torch.Generator().manual_seed(6)
    k = torch.randn(1, 1, 4, 64, generator=g, dtype=torch.float64) * 64**-0.25 * 20  # exponents ≈ −1300 … −1770
    assert (attention.feature_map.exponents(k).amax(-1) < FAVOR_MIN_EXPONENT).all()
    q = torch.randn(1, 1, 4, 64, generator=g, dtype=torch.float64) * 64**-0.25
    v = torch.randn(1, 1, 4, 2, generator=g, dtype=torch.float64)
    for form in ("parallel", "chunk", "recurrent"):
        assert torch.autograd.gradcheck(lambda k, form=form: attention(q, k, v, form=form, chunk_size=2)[0],
                                        (k.clone().requires_grad_(True),), eps=1e-7)


def test_dpfp_normalisation_below_the_floor_divides_by_the_floor_value_and_gradient():
    x = torch.tensor([[3e-151, 2e-151, -1e-151, 4e-151], [0.3, 0.2, -0.1, 0.4]], dtype=torch.float64,
                     requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    r = torch.cat([torch.relu(x_ref), torch.relu(-x_ref)], dim=-1)
    phi = torch.cat([r * r.roll(i, dims=-1) for i in (1, 2)], dim=-1)
    total = phi.sum(-1, keepdim=True)
    assert total[0] < LIMITS.floor < total[1]  # one row below float64's floor 1e-300, one above
    reference = phi / total.clamp(min=LIMITS.floor)
    y = dpfp(x, 2, normalize=True)
    torch.testing.assert_close(y, reference, rtol=1e-12, atol=0)
    cotangent = torch.randn(y.shape, dtype=torch.float64)
    (y * cotangent).sum().backward()
    (reference * cotangent).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=0)


def test_orthogonal_gaussian_with_a_generator_is_repeatable_and_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    first = orthogonal_gaussian(6, 14, generator=torch.Generator().manual_seed(3))
    second = orthogonal_gaussian(6, 14, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, second)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_orthogonal_gaussian_columns_have_their_own_norms():
    omega = orthogonal_gaussian(8, 64, generator=torch.Generator().manual_seed(1))
    norms = omega.norm(dim=0).view(8, 8)                  # 8 blocks of 8 orthogonal columns
    assert (norms.std(dim=1) > 0.05).all()
    # marginally N(0, I_8): E‖ω‖² = 8
    assert 6.0 < norms.pow(2).mean() < 10.0


def test_a_float64_favor_redraws_omega_orthogonal_to_float64_precision_from_the_fp32_stream():
    """Break-it pass AQ: a float64 FAVOR+ drew Ω's QR in fp32 and cast it, so its columns were orthogonal only to
    2e-7. Redrawn in float64, each block's columns are orthogonal to 1e-12, from the very Gaussians fp32 draws."""
    from fwbench.variants.feature_maps import Favor

    wide, narrow = Favor(8, 16).double(), Favor(8, 16)
    torch.manual_seed(5)
    wide.redraw_features()
    torch.manual_seed(5)
    narrow.redraw_features()
    assert wide.omega.dtype == torch.float64
    for block in wide.omega.split(8, dim=1):
        unit = block / block.norm(dim=0)
        assert (unit.T @ unit - torch.eye(8, dtype=torch.float64)).abs().max() < 1e-12
    assert torch.allclose(wide.omega, narrow.omega.double(), atol=1e-5)  # the same draw, factored more exactly
