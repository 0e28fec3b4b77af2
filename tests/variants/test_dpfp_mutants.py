"""Values of the DPFP feature map's op that its surviving mutants changed and no other test saw
(issue 14 item 14; ``docs/mutation.md`` lists them all)."""

from __future__ import annotations

import pytest
import torch

from fwbench.variants.kernels.dpfp import dpfp


def paper_dpfp(x: torch.Tensor, nu: int, normalize: bool, floor: float) -> torch.Tensor:
    """φ(x) by Eq. 27–28 (r = [relu(x), relu(−x)], block i = r ⊙ roll(r, i)), divided by
    max(Σφ, floor) if ``normalize``."""
    r = torch.cat([x.relu(), (-x).relu()], dim=-1)
    phi = torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)
    return phi / phi.sum(-1, keepdim=True).clamp(min=floor) if normalize else phi


@pytest.mark.parametrize(("normalize", "floor"), [(False, 1e-30), (True, 1e-30), (True, 0.5)])
def test_dpfp_second_derivatives_keep_the_normalisation_and_its_floor(normalize, floor):
    """Under create_graph=True the op's backward differentiates the features again: with the
    normalisation and the floor asked for (floor 0.5: the rows of the smaller inputs, Σφ < 0.5, are
    divided by it). First and second derivatives equal those of Eq. 27–28 by autograd, float64.
    Mutants ``_DPFP.backward`` 12 (normalize passed as None), 16 (the floor passed as normalize:
    a truthy 1e-30 normalises what should not be), 17 (the floor left at its default)."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(3, 5, 4, generator=g, dtype=torch.float64) * torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64)[:, None, None]
    x.requires_grad_()
    grad = torch.randn(3, 5, 8 * 2, generator=g, dtype=torch.float64)

    def first_and_second(features):
        (first,) = torch.autograd.grad(features(x), x, grad, create_graph=True)
        (second,) = torch.autograd.grad(first.pow(2).sum(), x)
        return first, second

    sums = paper_dpfp(x, 2, False, floor).sum(-1)
    if normalize and floor > 1e-30:  # the floor applies to some rows and not to others
        assert (sums < floor).any() and (sums > floor).any()
    got = first_and_second(lambda x: dpfp(x, 2, normalize, floor))
    expected = first_and_second(lambda x: paper_dpfp(x, 2, normalize, floor))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_dpfp_second_order_path_of_an_fp16_input_computes_in_fp32():
    """fp16 keys near ±200: their features (4e4 each) sum past fp16's largest value (65504), not
    fp32's. The op computes in fp32, and so must its recomputation under create_graph=True: the
    first-order gradient it gives equals the fast backward's (both fp32, rounded once to fp16).
    Mutant ``dpfp_composed`` 4 (the composed features in the input's own dtype: an inf sum, NaN
    gradients)."""
    g = torch.Generator().manual_seed(13)
    x = (200 * torch.randn(2, 3, 4, generator=g).sign() + torch.randn(2, 3, 4, generator=g)).half().requires_grad_()
    grad = torch.randn(2, 3, 8 * 2, generator=g)
    (fast,) = torch.autograd.grad(dpfp(x, 2, True), x, grad)
    (graphed,) = torch.autograd.grad(dpfp(x, 2, True), x, grad, create_graph=True)
    assert fast.dtype == graphed.dtype == torch.float16
    assert torch.isfinite(graphed).all()
    torch.testing.assert_close(graphed, fast, rtol=2e-3, atol=1e-6)


def test_a_feature_sum_exactly_at_the_floor_is_differentiated_as_torch_clamp_does():
    """x = (1, 1) and (0.5, 2) with ν = 1 have Σφ = 1 exactly; with floor 1 the division is by Σφ
    itself as far as the gradient goes (``clamp(min=floor)`` passes the gradient at equality), so
    φ̂ = φ / Σφ is scale-free and the gradient is 0. Mutant ``_DPFP.forward`` 43 (``<=`` for ``<``:
    those rows treated as divided by a constant)."""
    x = torch.tensor([[1.0, 1.0], [0.5, 2.0]], dtype=torch.float64, requires_grad=True)
    grad = torch.tensor([[0.3, -1.0, 0.7, 0.2], [1.0, 0.5, -0.5, 2.0]], dtype=torch.float64)
    assert torch.equal(paper_dpfp(x, 1, False, 0.0).sum(-1), torch.ones(2, dtype=torch.float64))
    (got,) = torch.autograd.grad(dpfp(x, 1, True, 1.0), x, grad)
    (expected,) = torch.autograd.grad(paper_dpfp(x, 1, True, 1.0), x, grad)
    assert torch.equal(expected, torch.zeros_like(x))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)
