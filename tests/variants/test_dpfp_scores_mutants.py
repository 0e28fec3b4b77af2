"""Values of :func:`dpfp_query_scores` that its surviving mutants changed and no other test saw
(issue 14 item 14; ``docs/mutation.md`` lists them all).

The reference is φ(k)·φ(q) with φ written out by the paper's definition (Eq. 27–28) in float64,
differentiated by plain autograd.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from fwbench.variants import VariantError
from fwbench.variants.kernels import compiled_scores
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores


@pytest.fixture(autouse=True, params=["compiled", "tensor"])
def scores_path(request, monkeypatch):
    """Every test runs on both paths: the compiled CPU loops and the tensor form CUDA runs."""
    if request.param == "tensor":
        monkeypatch.setattr(compiled_scores, "runs_here", lambda k: False)
    return request.param

NU, D_KEY, T = 2, 4, 6


def paper_dpfp(x: torch.Tensor, nu: int) -> torch.Tensor:
    """φ(x): r = [relu(x), relu(−x)], block i = r ⊙ roll(r, i), i = 1..ν."""
    r = torch.cat([x.relu(), (-x).relu()], dim=-1)
    return torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)


def scores_inputs(lead=(2, 2), seed=11) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 keys (…, T, d_key) and one query's DPFP features (…, 1, 2·d_key·ν). The keys are
    multiples of 1/4 up to 2 in size, not 0, so that their features are exact in fp32 too: an fp32
    key then costs no precision, and only a computation in fp32 does."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, (*lead, T, D_KEY), generator=g) * 2 - 1
    k = (sign * torch.randint(1, 9, (*lead, T, D_KEY), generator=g) / 4).double()
    phi_q = paper_dpfp(torch.randn(*lead, 1, D_KEY, generator=g, dtype=torch.float64), NU)
    return k, phi_q


def reference(k: torch.Tensor, phi_q: torch.Tensor, grad: torch.Tensor, create_graph_of=None):
    """Float64 scores, their gradients for ``grad``, and (if given) the gradient of
    ``create_graph_of(grad_k)`` through the first-order gradient."""
    k, phi_q = (x.detach().double().requires_grad_() for x in (k, phi_q))
    scores = paper_dpfp(k, NU) @ phi_q.mT
    grads = torch.autograd.grad(scores, (k, phi_q), grad.double(), create_graph=create_graph_of is not None)
    if create_graph_of is None:
        return scores.detach(), grads, None
    return scores.detach(), grads, torch.autograd.grad(create_graph_of(grads[0]), (k, phi_q))


@pytest.mark.parametrize("wide", ["k", "phi_q"])
def test_dpfp_scores_compute_in_the_wider_dtype_to_any_order(wide):
    """One input float64, the other fp32: scores in float64 equal to the float64 product to 1e-12;
    first-order gradients each in its input's dtype; second-order ones through the recomputed product.
    Mutants ``_DPFPQueryScores.forward`` 2–5 (an input left out of the compute dtype), 15 (keys not
    cast), ``_scores_composed`` 1–6 and 11 (the same in the recomputation for create_graph=True)."""
    k, phi_q = scores_inputs()
    k, phi_q = (x if name == wide else x.float() for name, x in (("k", k), ("phi_q", phi_q)))
    k.requires_grad_(), phi_q.requires_grad_()
    out = dpfp_query_scores(k, phi_q, NU)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def of_grad_k(grad_k):
        return grad_k.pow(2).sum()

    expected, expected_grads, expected_second = reference(k, phi_q, grad, of_grad_k)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out, (k, phi_q), grad, create_graph=True)
    for x, got, ref in zip((k, phi_q), grads, expected_grads, strict=True):
        assert got.dtype == x.dtype
        tol = 1e-12 if x.dtype == torch.float64 else 1e-6
        torch.testing.assert_close(got, ref.to(x.dtype), rtol=tol, atol=tol)
    second = torch.autograd.grad(of_grad_k(grads[0]), (k, phi_q))
    for x, got, ref in zip((k, phi_q), second, expected_second, strict=True):
        assert got.dtype == x.dtype
        # through an fp32 key's gradient (rounded to k's dtype) the second order is rounded too
        tol = 1e-12 if wide == "k" and x.dtype == torch.float64 else 1e-6
        torch.testing.assert_close(got, ref.to(x.dtype), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["k", "phi_q"])
def test_dpfp_scores_give_the_gradient_of_one_input_alone(name):
    """Only ``name`` requires a gradient. Mutants ``_DPFPQueryScores.backward`` 39 (the key gradient
    computed only when the query's is asked for) and 139 (a key gradient never asked for read as a
    tensor)."""
    given = dict(zip(("k", "phi_q"), scores_inputs(), strict=True))
    given[name].requires_grad_()
    out = dpfp_query_scores(given["k"], given["phi_q"], NU)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (got,) = torch.autograd.grad(out, given[name], grad)
    _, expected, _ = reference(given["k"], given["phi_q"], grad)
    torch.testing.assert_close(got, expected[("k", "phi_q").index(name)], rtol=1e-12, atol=1e-12)


def test_dpfp_scores_write_into_buffers_of_their_final_shape():
    """No ``out=`` buffer is resized (torch warns: resizing a non-empty output is deprecated).
    Mutants ``_DPFPQueryScores.forward`` 34–38 (the scores buffer) and ``backward`` 36–38 (the key
    gradient's), each of the wrong shape."""
    k, phi_q = (x.requires_grad_() for x in scores_inputs())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = dpfp_query_scores(k, phi_q, NU)
        grads = torch.autograd.grad(out.sum(), (k, phi_q))
    _, expected, _ = reference(k, phi_q, torch.ones_like(out))
    for got, ref in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_dpfp_scores_take_any_number_of_leading_axes():
    """Keys (B, T, d_key) and features (B, 1, 2·d_key·ν): the shape check reads the last two axes.
    Mutant ``dpfp_query_scores`` 9 (``shape[+2:]``: right only for 4-D inputs)."""
    k, phi_q = scores_inputs(lead=(3,))
    out = dpfp_query_scores(k, phi_q, NU)
    assert out.shape == (3, T, 1)
    torch.testing.assert_close(out, paper_dpfp(k, NU) @ phi_q.mT, rtol=1e-12, atol=1e-12)


def test_dpfp_scores_name_the_expected_feature_count():
    """Mutants ``dpfp_query_scores`` 18–20 (the expected width in the message, 2·d_key·ν, miscomputed)."""
    with pytest.raises(VariantError) as raised:
        dpfp_query_scores(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 1, 8), 2)
    assert str(raised.value) == "phi_q: got shape (1, 1, 1, 8); expected (…, 1, 2·d_key·ν = 16)"
