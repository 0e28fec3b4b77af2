"""Specification of the functional kernels (``variants.kernels``) and the feature maps φ.

- The sum-rule and delta-rule kernels, in all three forms, match fla-core's pure-PyTorch
  reference implementations (loaded from their files; fla's package ``__init__`` needs triton).
- The delta rule with β = 1 and a unit-norm key written twice stores, and reads back, the
  second value.
- DPFP follows the paper's definition (a hand-written loop), has d_dot = 2·d_key·ν; every φ is
  finite at 0, also after sum normalisation; FAVOR+ and elu+1 are non-negative, and FAVOR+
  estimates exp(q·k).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close
from torch import nn

from fwbench import variants
from fwbench.variants import DPFP, EluPlusOne, Favor, FeatureMap, Tanh, sum_normalize
from fwbench.variants.kernels import (
    delta_rule_chunk,
    delta_rule_parallel,
    delta_rule_read,
    delta_rule_recurrent,
    sum_rule_chunk,
    sum_rule_parallel,
    sum_rule_recurrent,
)

TOL = 1e-5
B, H, D_K, D_V = 2, 3, 8, 6

SUM_FORMS = {
    "parallel": lambda q, k, v, W0, z0, normalize: sum_rule_parallel(q, k, v, W0, z0, normalize=normalize),
    "chunk-16": lambda q, k, v, W0, z0, normalize: sum_rule_chunk(q, k, v, W0, z0, normalize=normalize, chunk_size=16),
    "chunk-32": lambda q, k, v, W0, z0, normalize: sum_rule_chunk(q, k, v, W0, z0, normalize=normalize, chunk_size=32),
    "recurrent": lambda q, k, v, W0, z0, normalize: sum_rule_recurrent(q, k, v, W0, z0, normalize=normalize),
}
DELTA_FORMS = {
    "parallel": lambda q, k, v, beta, W0: delta_rule_parallel(q, k, v, beta, W0),
    "chunk-16": lambda q, k, v, beta, W0: delta_rule_chunk(q, k, v, beta, W0, chunk_size=16),
    "chunk-32": lambda q, k, v, beta, W0: delta_rule_chunk(q, k, v, beta, W0, chunk_size=32),
    "recurrent": lambda q, k, v, beta, W0: delta_rule_recurrent(q, k, v, beta, W0),
}


# --------------------------------------------------------------------------------------------
# fla-core references, loaded from their files.
# --------------------------------------------------------------------------------------------


def _load_fla_reference(relative_path: str):
    """Load one of fla-core's ``naive.py`` files without importing ``fla`` (which needs triton)."""
    pytest.importorskip("einops", reason="fla-core's reference kernels need einops")
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (pip install fla-core==0.6.0; triton is not needed)")
    path = Path(spec.submodule_search_locations[0]) / relative_path
    if not path.is_file():
        pytest.skip(f"fla-core has no {relative_path} (tested against fla-core 0.6.0)")
    module_spec = importlib.util.spec_from_file_location(f"fla_reference_{path.parent.name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fla_linear_attn():
    return _load_fla_reference("ops/linear_attn/naive.py")


@pytest.fixture(scope="module")
def fla_delta_rule():
    return _load_fla_reference("ops/delta_rule/naive.py")


def _bthd(x):
    """(B, H, T, D) ↔ (B, T, H, D): fla's linear-attention layout."""
    return x.transpose(1, 2)


def _positive_features(*shape):
    """φ-mapped inputs as the modules produce them: elu+1 of Gaussians, strictly positive."""
    return F.elu(torch.randn(*shape)) + 1.0


@pytest.mark.parametrize("carried", [False, True], ids=["from_zero_state", "with_carried_state"])
@pytest.mark.parametrize("T", [1, 33, 64])
@pytest.mark.parametrize("form", list(SUM_FORMS))
def test_sum_rule_normalized_matches_fla_naive_recurrent_linear_attn(fla_linear_attn, form, T, carried):
    """fla adds 1e-10 to the normaliser where we add 1e-6; with positive features of size ~1
    the normaliser is ≥ ~0.1 and the difference is far below the tolerance."""
    q, k = _positive_features(B, H, T, D_K), _positive_features(B, H, T, D_K)
    v = torch.randn(B, H, T, D_V)
    W0 = torch.randn(B, H, D_V, D_K) if carried else None
    z0 = _positive_features(B, H, D_K) if carried else None
    y, W, z = SUM_FORMS[form](q, k, v, W0, z0, True)

    initial = (W0.mT, z0[:, None]) if carried else None
    y_ref, (S_ref, z_ref) = fla_linear_attn.naive_recurrent_linear_attn(
        _bthd(q), _bthd(k), _bthd(v), scale=1.0, initial_state=initial, output_final_state=True,
        normalize=True,
    )
    assert_close(y, _bthd(y_ref), TOL)
    assert_close(W, S_ref.mT, TOL)
    assert_close(z, z_ref[:, 0], TOL)


@pytest.mark.parametrize("carried", [False, True], ids=["from_zero_state", "with_carried_state"])
@pytest.mark.parametrize("T", [1, 33, 64])
@pytest.mark.parametrize("form", list(SUM_FORMS))
def test_sum_rule_unnormalized_matches_fla_naive_recurrent_linear_attn(fla_linear_attn, form, T, carried):
    q, k, v = torch.randn(B, H, T, D_K), torch.randn(B, H, T, D_K), torch.randn(B, H, T, D_V)
    W0 = torch.randn(B, H, D_V, D_K) if carried else None
    y, W, _ = SUM_FORMS[form](q, k, v, W0, None, False)
    y_ref, S_ref = fla_linear_attn.naive_recurrent_linear_attn(
        _bthd(q), _bthd(k), _bthd(v), scale=1.0, initial_state=None if W0 is None else W0.mT,
        output_final_state=True, normalize=False,
    )
    assert_close(y, _bthd(y_ref), TOL)
    assert_close(W, S_ref.mT, TOL)


def _delta_inputs(T):
    """Random queries, L2-normalised keys, values and β ∈ (0, 1), in (B, H, T, D)."""
    q = torch.randn(B, H, T, D_K)
    k = F.normalize(torch.randn(B, H, T, D_K), dim=-1)
    v = torch.randn(B, H, T, D_V)
    beta = torch.rand(B, H, T) * 0.98 + 0.01
    return q, k, v, beta


@pytest.mark.parametrize("carried", [False, True], ids=["from_zero_state", "with_carried_state"])
@pytest.mark.parametrize("T", [1, 33, 64])
@pytest.mark.parametrize("form", list(DELTA_FORMS))
def test_delta_rule_matches_fla_delta_rule_recurrence(fla_delta_rule, form, T, carried):
    """fla scales q by d_k^-½ inside and keeps S = Wᵀ (B, H, d_k, d_v); we feed it the unscaled q."""
    q, k, v, beta = _delta_inputs(T)
    W0 = torch.randn(B, H, D_V, D_K) if carried else None
    y, W = DELTA_FORMS[form](q * D_K**-0.5, k, v, beta, W0)
    y_ref, S_ref = fla_delta_rule.delta_rule_recurrence(
        q, k, v, beta, initial_state=None if W0 is None else W0.mT.clone(), output_final_state=True
    )
    assert_close(y, y_ref, TOL)
    assert_close(W, S_ref.mT, TOL)


@pytest.mark.parametrize("T", [32, 96])
@pytest.mark.parametrize("form", list(DELTA_FORMS))
def test_delta_rule_matches_fla_delta_rule_chunkwise(fla_delta_rule, form, T):
    q, k, v, beta = _delta_inputs(T)
    y, W = DELTA_FORMS[form](q * D_K**-0.5, k, v, beta, None)
    y_ref, S_ref = fla_delta_rule.delta_rule_chunkwise(q, k, v, beta, chunk_size=32)
    assert_close(y, y_ref, TOL)
    assert_close(W, S_ref.mT, TOL)


@pytest.mark.parametrize("t", [0, 4, 5, 9])
@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_chunk_kernels_are_causal_even_when_later_tokens_are_huge(rule, t):
    """Outputs up to t are unchanged when every later token is scaled by 1e4. (A chunk's
    starting state computed as inclusive cumsum − own write fails this: the cancellation lets
    the chunk's later tokens leak into its earlier outputs.)"""
    T, C = 12, 4
    q, k = _positive_features(B, H, T, D_K), _positive_features(B, H, T, D_K)
    v = torch.randn(B, H, T, D_V)
    k2, v2 = k.clone(), v.clone()
    v2[:, :, t + 1:] *= 1e4
    if rule == "sum":
        k2[:, :, t + 1:] *= 1e4
        y, _, _ = sum_rule_chunk(q, k, v, chunk_size=C)
        y2, _, _ = sum_rule_chunk(q, k2, v2, chunk_size=C)
    else:
        beta = torch.rand(B, H, T)
        y, _ = delta_rule_chunk(q, sum_normalize(k), v, beta, chunk_size=C)
        y2, _ = delta_rule_chunk(q, sum_normalize(k2), v2, beta, chunk_size=C)
    assert (y2[:, :, : t + 1] - y[:, :, : t + 1]).abs().max() <= 1e-6


def test_delta_rule_pure_write_state_equals_forward_state():
    q, k, v, beta = _delta_inputs(41)
    W0 = torch.randn(B, H, D_V, D_K)
    _, W_forward = delta_rule_recurrent(q, k, v, beta, W0)
    y, W_write = delta_rule_chunk(None, k, v, beta, W0, chunk_size=16)
    assert y is None
    assert_close(W_write, W_forward, TOL)


# --------------------------------------------------------------------------------------------
# The delta rule overwrites: β = 1 and a unit-norm key written twice stores the second value.
# --------------------------------------------------------------------------------------------

OVERWRITE_FORMS = {
    "parallel": lambda q, k, v, beta, W0: delta_rule_parallel(q, k, v, beta, W0),
    "chunk-1": lambda q, k, v, beta, W0: delta_rule_chunk(q, k, v, beta, W0, chunk_size=1),
    "chunk-2": lambda q, k, v, beta, W0: delta_rule_chunk(q, k, v, beta, W0, chunk_size=2),
    "recurrent": lambda q, k, v, beta, W0: delta_rule_recurrent(q, k, v, beta, W0),
}


@pytest.mark.parametrize("carried", [False, True], ids=["from_zero_state", "with_carried_state"])
@pytest.mark.parametrize("form", list(OVERWRITE_FORMS))
def test_delta_rule_key_written_twice_with_beta_one_reads_second_value(form, carried):
    """W ← W + (v − W k) kᵀ with ‖k‖ = 1 gives W k = v whatever W held before."""
    key = F.normalize(torch.randn(B, H, D_K), dim=-1)
    k = torch.stack([key, key], dim=2)
    v1, v2 = torch.randn(B, H, D_V), torch.randn(B, H, D_V)
    v = torch.stack([v1, v2], dim=2)
    beta = torch.ones(B, H, 2)
    W0 = torch.randn(B, H, D_V, D_K) if carried else None
    y, W = OVERWRITE_FORMS[form](k, k, v, beta, W0)
    assert_close(y[:, :, 0], v1, TOL)
    assert_close(y[:, :, 1], v2, TOL)
    assert_close(delta_rule_read(key[:, :, None], W)[:, :, 0], v2, TOL)


def test_delta_rule_with_beta_zero_writes_nothing():
    q, k, v, _ = _delta_inputs(20)
    W0 = torch.randn(B, H, D_V, D_K)
    for form in DELTA_FORMS.values():
        y, W = form(q, k, v, torch.zeros(B, H, 20), W0)
        assert_close(W, W0, TOL)
        assert_close(y, q @ W0.mT, TOL)


# --------------------------------------------------------------------------------------------
# Feature maps.
# --------------------------------------------------------------------------------------------


def dpfp_reference(x: torch.Tensor, nu: int) -> torch.Tensor:
    """The paper's DPFP (Eq. 27–28) as a loop: r = [relu(x), relu(−x)] ∈ R^{2d} and, for
    i = 1..ν and j = 0..2d−1, φ_{(i−1)·2d + j} = r_j · r_{(j−i) mod 2d}."""
    r = torch.cat([torch.relu(x), torch.relu(-x)], dim=-1)
    two_d = r.shape[-1]
    phi = torch.empty(*x.shape[:-1], two_d * nu)
    for i in range(1, nu + 1):
        for j in range(two_d):
            phi[..., (i - 1) * two_d + j] = r[..., j] * r[..., (j - i) % two_d]
    return phi


@pytest.mark.parametrize("shift", [1, 2, 5])
def test_torch_roll_shifts_index_j_to_j_minus_i(shift):
    """torch.roll(r, shifts=i)[j] == r[(j − i) mod n], the direction DPFP's definition needs."""
    r = torch.arange(10)
    rolled = torch.roll(r, shifts=shift, dims=-1)
    assert rolled.tolist() == [(j - shift) % 10 for j in range(10)]


@pytest.mark.parametrize(("d_key", "nu"), [(1, 1), (3, 1), (4, 2), (8, 3), (5, 9)])
def test_dpfp_matches_the_papers_definition(d_key, nu):
    x = torch.randn(2, 3, 7, d_key)
    assert_close(DPFP(d_key, nu=nu)(x), dpfp_reference(x, nu), 1e-6)


@pytest.mark.parametrize(("d_key", "nu"), [(1, 1), (3, 1), (4, 2), (8, 3), (16, 5), (64, 2)])
def test_dpfp_output_size_is_two_d_key_nu(d_key, nu):
    feature_map = DPFP(d_key, nu=nu)
    phi = feature_map(torch.randn(2, 1, 3, d_key))
    assert feature_map.d_dot == phi.shape[-1] == 2 * d_key * nu
    assert variants.d_dot_of(f"dpfp:nu={nu}", d_key) == 2 * d_key * nu
    assert variants.build_attention(f"dpfp-delta:nu={nu}", d_key=d_key).d_dot == 2 * d_key * nu


def test_dpfp_keys_with_disjoint_support_are_orthogonal():
    x1 = torch.tensor([1.0, 2.0, 0.0, 0.0])
    x2 = torch.tensor([0.0, 0.0, 3.0, 1.0])
    phi = DPFP(4, nu=1)
    assert (phi(x1) * phi(x2)).sum() == 0


FEATURE_MAPS = {
    "elu+1": lambda: EluPlusOne(8),
    "tanh": lambda: Tanh(8),
    "favor": lambda: Favor(8, m=16),
    "dpfp-nu1": lambda: DPFP(8, nu=1),
    "dpfp-nu3": lambda: DPFP(8, nu=3),
}


@pytest.mark.parametrize("name", list(FEATURE_MAPS))
def test_feature_map_of_zero_is_finite_also_after_sum_normalisation(name):
    feature_map = FEATURE_MAPS[name]()
    phi = feature_map(torch.zeros(2, 3, 4, 8))
    assert phi.shape == (2, 3, 4, feature_map.d_dot)
    assert torch.isfinite(phi).all()
    assert torch.isfinite(sum_normalize(phi)).all()


def test_sum_normalize_makes_features_sum_to_one():
    phi = DPFP(8, nu=2)(torch.randn(3, 5, 8))
    assert_close(sum_normalize(phi).sum(-1), torch.ones(3, 5), 1e-5)
    assert torch.equal(sum_normalize(torch.zeros(3, 5)), torch.zeros(3, 5))


@pytest.mark.parametrize("name", ["elu+1", "favor", "dpfp-nu1", "dpfp-nu3"])
def test_feature_maps_are_non_negative(name):
    feature_map = FEATURE_MAPS[name]()
    x = torch.cat([torch.randn(2, 3, 50, 8), 10 * torch.randn(2, 3, 50, 8)], dim=2)
    assert (feature_map(x) >= 0).all()


def test_favor_estimates_exp_of_dot_product():
    """E[φ(q)·φ(k)] = exp(q·k); with m = 4096 orthogonal features each estimate is within 10%."""
    torch.manual_seed(1234)
    d_key = 8
    favor = Favor(d_key, m=4096).eval()
    q = F.normalize(torch.randn(32, d_key), dim=-1) * 0.5
    k = F.normalize(torch.randn(32, d_key), dim=-1) * 0.5
    estimate = (favor(q) * favor(k)).sum(-1)
    exact = torch.exp((q * k).sum(-1))
    ratio = estimate / exact
    assert ((ratio - 1).abs() <= 0.10).all(), ratio
    assert abs(ratio.mean().item() - 1) <= 0.02


def test_favor_projection_has_orthogonal_blocks():
    """Columns within each block of d_key are orthogonal (Choromanski et al. 2021, Sec. 2.4)."""
    omega = Favor(8, m=20).omega
    assert omega.shape == (8, 20)
    for start in range(0, 20, 8):
        block = omega[:, start:start + 8]
        gram = block.mT @ block
        off_diagonal = gram - torch.diag(torch.diagonal(gram))
        assert off_diagonal.abs().max() <= 1e-4 * gram.diagonal().max()


def test_favor_features_are_scaled_by_one_over_sqrt_two_m():
    favor = Favor(4, m=8)
    assert_close(favor(torch.zeros(4)), torch.full((16,), 1 / math.sqrt(16)), 1e-6)


class _RandomWidthMap(FeatureMap):
    """A map without its own ``output_size``: d_dot = d_key·width + extra, and building it draws from
    the global RNG (as a random-feature map does)."""

    def __init__(self, d_key: int, width: int = 1, extra: int = 0):
        super().__init__(d_key)
        self.mixing = nn.Parameter(torch.randn(d_key, d_key * width + extra))

    @property
    def d_dot(self) -> int:
        return self.mixing.shape[1]


def test_the_default_output_size_builds_the_map_with_its_parameters_and_leaves_the_global_rng():
    before = torch.get_rng_state()
    assert _RandomWidthMap.output_size(5) == 5
    assert _RandomWidthMap.output_size(5, width=3, extra=2) == 17
    assert torch.equal(torch.get_rng_state(), before)
