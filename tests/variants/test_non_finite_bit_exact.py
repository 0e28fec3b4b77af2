"""The outputs a NaN/inf never reaches are those of the clean inputs bit for bit, on any BLAS.

Found on a 2-core AMD EPYC (MKL's AVX2 path), where 15 causality tests failed that pass on an Intel
Xeon: the masked products zeroed the bad entries with ``masked_fill``, which returns a row-major copy
of a column-major operand (``solve_triangular``'s result), and this BLAS sums a row-major and a
column-major operand in different orders (the parallel delta rule: 0.125 apart on outputs of 1e8, in
a sequence holding no bad value); softmax's non-finite path replaced the fused kernel by an explicit
product for every row (1 ulp apart before t). Both agreed to the ulp on the Intel machine only.
"""

from __future__ import annotations

import pytest
import torch

from fwbench import variants
from fwbench.variants.kernels.precision import causal_matmul, masked_matmul, zeroed_in_layout

T, BAD = 12, 7


def column_major(x: torch.Tensor) -> torch.Tensor:
    return x.mT.contiguous().mT


def test_zeroing_keeps_the_operands_layout():
    x = column_major(torch.randn(2, 3, T, 5))
    bad = torch.zeros_like(x, dtype=torch.bool)
    bad[0, 1, BAD, 2] = True
    zeroed = zeroed_in_layout(x, bad)
    assert zeroed.stride() == x.stride()
    assert zeroed[0, 1, BAD, 2] == 0 and torch.equal(zeroed[~bad], x[~bad])
    assert torch.equal(x[0, 1, BAD, 2], x[0, 1, BAD, 2])  # x itself untouched (no in-place write)


@pytest.mark.parametrize("layout", [lambda x: x, column_major], ids=["row-major", "column-major"])
def test_masked_products_equal_the_plain_product_where_nothing_bad_reaches(layout):
    g = torch.Generator().manual_seed(0)
    lower = (torch.randn(2, 3, T, T, generator=g) * 1e4).tril()
    x = layout(torch.randn(2, 3, T, 5, generator=g) * 1e4)
    dirty = x.clone()
    dirty[0, 1, BAD, 2] = float("nan")
    plain = lower @ x
    out = causal_matmul(lower, dirty)
    assert torch.equal(out[:, :, :BAD], plain[:, :, :BAD])
    assert torch.equal(out[1], plain[1]) and torch.equal(out[0, 0], plain[0, 0])
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    weights = lower.abs() / lower.abs().sum(-1, keepdim=True)
    out = masked_matmul(weights, dirty, allowed)
    assert torch.equal(out[:, :, :BAD], (weights @ x)[:, :, :BAD])


def _inputs(d_key: int = 8, d_v: int = 5):
    g = torch.Generator().manual_seed(1)
    # (B, T, H, D) projections viewed as (B, H, T, D), as a layer hands them over: not contiguous
    q, k = (torch.randn(2, T, 2, d_key, generator=g).transpose(1, 2) for _ in range(2))
    v = torch.randn(2, T, 2, d_v, generator=g).transpose(1, 2)
    return {"q": q, "k": k, "v": v, "beta": torch.rand(2, 2, T, generator=g)}


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("form", ["parallel", "chunk"])
def test_softmax_rows_before_a_nan_are_the_fused_kernels(form, where):
    attention = variants.build_attention("softmax", d_key=8).eval()
    inputs = _inputs()
    inputs.pop("beta")
    dirty = dict(inputs)
    dirty[where] = inputs[where].clone()
    dirty[where][0, 1, BAD, 2] = float("nan")
    y, _ = attention(**inputs, form=form, chunk_size=5)
    y_dirty, _ = attention(**dirty, form=form, chunk_size=5)
    assert torch.equal(y_dirty[:, :, :BAD], y[:, :, :BAD])
    assert torch.equal(y_dirty[1], y[1]) and torch.equal(y_dirty[0, 0], y[0, 0])
    assert not torch.isfinite(y_dirty[0, 1, BAD:]).all()


@pytest.mark.parametrize("where", ["k", "v", "beta"])
def test_the_parallel_delta_rule_before_an_overflowing_key_is_the_plain_product(where):
    attention = variants.build_attention("linear-delta-unnorm", d_key=8).eval()
    inputs = _inputs()
    dirty = dict(inputs)
    dirty[where] = inputs[where].clone()
    dirty[where][0, 1, BAD] = 1e20  # finite, but K Kᵀ overflows fp32: the masked product is used
    y, _ = attention(**inputs, form="parallel")
    y_dirty, _ = attention(**dirty, form="parallel")
    assert torch.equal(y_dirty[:, :, :BAD], y[:, :, :BAD])
    assert torch.equal(y_dirty[1], y[1]) and torch.equal(y_dirty[0, 0], y[0, 0])
