"""The DPFP sum-rule scores of one query with a key-space backward (issue 16.4) equal φ(k)·φ(q) of
an independent DPFP (fla-core's naive feature map, paper Eq. 27–28, written out below) and its
autograd gradients; a few Setting 1 training steps give the losses of the feature-product path."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers import assert_close

from fwbench.tasks import one_hot_read
from fwbench.tasks.retrieval import RetrievalModel, retrieval_loss, sample_batch
from fwbench.variants import VariantError
from fwbench.variants.kernels import compiled_scores
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores


@pytest.fixture(autouse=True, params=["compiled", "tensor"])
def scores_path(request, monkeypatch):
    """Every test runs on both paths: the compiled CPU loops and the tensor form CUDA runs."""
    if request.param == "tensor":
        monkeypatch.setattr(compiled_scores, "runs_here", lambda k: False)
    return request.param


def naive_dpfp(x: torch.Tensor, nu: int) -> torch.Tensor:
    """φ by the paper's definition: r = [relu(x), relu(−x)], block i = r ⊙ roll(r, i)."""
    r = torch.cat([x.relu(), (-x).relu()], dim=-1)
    return torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)


@pytest.mark.parametrize("nu", [1, 2, 3, 5])
def test_scores_and_gradients_equal_the_feature_product(nu):
    generator = torch.Generator().manual_seed(nu)
    k = torch.randn(3, 2, 9, 5, generator=generator, dtype=torch.float64)
    k[0, 0, 0, 2] = 0.0  # a coordinate at relu's kink: no gradient on either path
    k[1, 1, 3] = 0.0
    q = torch.randn(3, 2, 1, 5, generator=generator, dtype=torch.float64)
    grad = torch.randn(3, 2, 9, 1, generator=generator, dtype=torch.float64)
    k_fast, q_fast, k_ref, q_ref = (x.clone().requires_grad_() for x in (k, q, k, q))
    fast = dpfp_query_scores(k_fast, naive_dpfp(q_fast, nu), nu)
    reference = naive_dpfp(k_ref, nu) @ naive_dpfp(q_ref, nu).mT
    assert fast.shape == (3, 2, 9, 1)
    torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-12)
    fast_grads = torch.autograd.grad(fast, (k_fast, q_fast), grad)
    reference_grads = torch.autograd.grad(reference, (k_ref, q_ref), grad)
    for a, b in zip(fast_grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert fast_grads[0][0, 0, 0, 2] == 0 and (fast_grads[0][1, 1, 3] == 0).all()


def test_gradcheck_and_fp32_inputs():
    k = torch.randn(2, 1, 6, 4, dtype=torch.float64, requires_grad=True)
    phi_q = torch.rand(2, 1, 1, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda k, p: dpfp_query_scores(k, p, 2), (k, phi_q))
    out = dpfp_query_scores(k.detach().float().requires_grad_(), phi_q.detach().half(), 2)
    assert out.dtype == torch.float32
    out.sum().backward()


def test_second_derivatives_are_those_of_the_feature_product():
    # the hand-written backward reads saved features as constants: under create_graph=True it must
    # differentiate the product again, or the Hessian would miss every path through them
    generator = torch.Generator().manual_seed(7)
    k = torch.randn(2, 1, 6, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    q = torch.randn(2, 1, 1, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda k, q: dpfp_query_scores(k, naive_dpfp(q, 2), 2), (k, q))
    weights = torch.randn(2, 1, 6, 1, dtype=torch.float64, generator=generator)

    def hessian_vector(scores) -> tuple[torch.Tensor, ...]:
        (grad_k,) = torch.autograd.grad((scores(k, q) * weights).sum().pow(2), (k,), create_graph=True)
        return torch.autograd.grad(grad_k.pow(2).sum(), (k, q))

    fast = hessian_vector(lambda k, q: dpfp_query_scores(k, naive_dpfp(q, 2), 2))
    reference = hessian_vector(lambda k, q: naive_dpfp(k, 2) @ naive_dpfp(q, 2).mT)
    for a, b in zip(fast, reference):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_second_derivatives_of_fp32_keys_beside_float64_features_are_float64():
    # the forward computes in the wider dtype; the recomputed product for second order must too, or
    # the Hessian of fp32 keys would be φ(k) rounded to fp32 (relative error ~1e-7, not ~1e-16)
    generator = torch.Generator().manual_seed(11)
    k32 = torch.randn(2, 1, 6, 4, generator=generator).mul_(1 / 3)
    q = torch.randn(2, 1, 1, 4, dtype=torch.float64, generator=generator)
    weights = torch.randn(2, 1, 6, 1, dtype=torch.float64, generator=generator)

    def hessian_vector(k: torch.Tensor, scores) -> tuple[torch.Tensor, ...]:
        q_leaf = q.clone().requires_grad_()
        out = scores(k, q_leaf)
        (grad_q,) = torch.autograd.grad((out * weights).sum().pow(2), (q_leaf,), create_graph=True)
        return torch.autograd.grad(grad_q.pow(2).sum(), (k, q_leaf))

    k_fast, k_ref = k32.clone().requires_grad_(), k32.double().requires_grad_()
    fast = hessian_vector(k_fast, lambda k, q: dpfp_query_scores(k, naive_dpfp(q, 2), 2))
    reference = hessian_vector(k_ref, lambda k, q: naive_dpfp(k, 2) @ naive_dpfp(q, 2).mT)
    assert fast[0].dtype == torch.float32
    torch.testing.assert_close(fast[0], reference[0].float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fast[1], reference[1], rtol=1e-13, atol=1e-13)


def test_no_keys_give_no_scores():
    # T = 0: the reshape to (-1, T, d_key) raised "cannot reshape tensor of 0 elements into shape
    # [-1, 0, 4] because the unspecified dimension size -1 can be any value" where φ(k) φ(q)ᵀ is (2, 3, 0, 1)
    k = torch.randn(2, 3, 0, 4, requires_grad=True)
    phi_q = torch.rand(2, 3, 1, 8, requires_grad=True)
    out = dpfp_query_scores(k, phi_q, 1)
    assert out.shape == (2, 3, 0, 1)
    grad_k, grad_q = torch.autograd.grad(out.sum(), (k, phi_q))
    assert grad_k.shape == k.shape and torch.equal(grad_q, torch.zeros_like(phi_q))


def test_bad_shapes_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="phi_q: got shape"):
        dpfp_query_scores(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 2, 8), 1)
    with pytest.raises(ValueError, match="nu: got 5"):
        dpfp_query_scores(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 1, 40), 5)
    # one query for two sequences: the compiled CPU loops read past φ(q)'s memory (scores of 1e-38);
    # four for two: they read the first two and returned scores without a word
    for leading in ((1, 1), (4, 3)):
        with pytest.raises(ValueError, match=rf"^phi_q: got shape \({leading[0]}, {leading[1]}, 1, 8\); expected k's "
                                             r"leading dimensions \(2, 3\) before \(1, 8\)$"):
            dpfp_query_scores(torch.randn(2, 3, 5, 4), torch.rand(*leading, 1, 8), 1)


def test_nu_is_an_integer_as_the_feature_maps_take_one():
    # ν = 2.0 passed the range check and failed in range() deep in the op ("TypeError: 'float' object
    # cannot be interpreted as an integer"), 2.5 was refused as a shape of 10.0 features, '2' raised a
    # TypeError from <=; True was taken as ν = 1. NumPy integers are integers (the feature maps take them)
    k, phi_q = torch.randn(1, 1, 3, 4), torch.rand(1, 1, 1, 16)
    for nu in (2.0, 2.5, "2", None, True):
        with pytest.raises(VariantError, match=rf"^nu: got {re.escape(repr(nu))}; expected an integer in \[1, d_key=4\] "
                                               r"for the key-space backward$"):
            dpfp_query_scores(k, phi_q if nu is not True else phi_q[..., :8], nu)
    torch.testing.assert_close(dpfp_query_scores(k, phi_q, np.int64(2)), dpfp_query_scores(k, phi_q, 2), rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["dpfp:nu=1", "dpfp:nu=2"])
def test_training_losses_equal_the_feature_product_path(variant, monkeypatch):
    def losses(fast: bool) -> list[float]:
        if not fast:  # the read as before: φ(k) φ(q)ᵀ through autograd
            monkeypatch.setattr(one_hot_read, "dpfp_query_scores", lambda k, phi_q, nu: naive_dpfp(k, nu) @ phi_q.mT)
        torch.manual_seed(3)
        model = RetrievalModel(variant, S=40, d_key=16)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        generator, out = torch.Generator().manual_seed(5), []
        for _ in range(6):
            batch = sample_batch(1, 40, 8, generator)
            loss = retrieval_loss(model(batch["keys"], batch["values"], batch["queries"]), batch["targets"], 40)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            out.append(loss.item())
        monkeypatch.undo()
        return out

    fast, reference = losses(True), losses(False)
    assert_close(torch.tensor(fast), torch.tensor(reference), rel_rmse=1e-5)
    assert fast[-1] != fast[0]  # the steps trained
