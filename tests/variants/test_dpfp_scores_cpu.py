"""The compiled CPU loops of the DPFP read scores (:mod:`variants.kernels.compiled_scores`) against
φ(k)·φ(q) by the paper's definition (Eq. 27–28) and against the tensor form CUDA runs, at Setting 1's
training shapes, at every roll up to ν = d_key, and with non-finite keys."""

from __future__ import annotations

import pytest
import torch

from fwbench.tasks.key_rows import KeyRows, table_scores
from fwbench.variants.kernels import compiled_scores
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores


def paper_dpfp(x: torch.Tensor, nu: int) -> torch.Tensor:
    """φ(x): r = [relu(x), relu(−x)], block i = r ⊙ roll(r, i), i = 1..ν."""
    r = torch.cat([x.relu(), (-x).relu()], dim=-1)
    return torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)


def scores_and_grads(k, phi_q, grad, nu, tensor_form=False, monkeypatch=None):
    k, phi_q = k.clone().requires_grad_(), phi_q.clone().requires_grad_()
    if tensor_form:
        monkeypatch.setattr(compiled_scores, "runs_here", lambda k: False)
    out = dpfp_query_scores(k, phi_q, nu)
    grads = torch.autograd.grad(out, (k, phi_q), grad)
    if tensor_form:
        monkeypatch.undo()
    return out.detach(), *grads


def test_the_compiled_loops_serve_cpu_fp32_and_float64_only():
    assert compiled_scores.runs_here(torch.zeros(1, 2, 3))
    assert compiled_scores.runs_here(torch.zeros(1, 2, 3, dtype=torch.float64))
    assert not compiled_scores.runs_here(torch.zeros(1, 2, 3, dtype=torch.float16))
    assert not compiled_scores.runs_here(torch.zeros(1, 2, 3, device="meta"))


@pytest.mark.parametrize("nu", [1, 3])
def test_setting1_shapes_agree_with_the_paper_features_and_the_tensor_form(nu, monkeypatch):
    # Setting 1 at S = 600: 32 sequences of 600 keys of d_key 64, one query each
    generator = torch.Generator().manual_seed(nu)
    k = torch.randn(32, 1, 600, 64, generator=generator)
    phi_q = paper_dpfp(torch.randn(32, 1, 1, 64, generator=generator), nu)
    grad = torch.randn(32, 1, 600, 1, generator=generator)
    compiled = scores_and_grads(k, phi_q, grad, nu)
    tensor = scores_and_grads(k, phi_q, grad, nu, tensor_form=True, monkeypatch=monkeypatch)
    k64, q64 = k.double().requires_grad_(), phi_q.double().requires_grad_()
    exact_out = paper_dpfp(k64, nu) @ q64.mT
    exact = (exact_out.detach(), *torch.autograd.grad(exact_out, (k64, q64), grad.double()))
    for got, other, want in zip(compiled, tensor, exact):
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() < 1e-5 * scale
        assert (other.double() - want).abs().max().item() < 1e-5 * scale
    assert compiled[0].dtype == torch.float32 and compiled[1].dtype == torch.float32


def test_every_roll_up_to_nu_equal_d_key_in_float64():
    # roll i reaches past d_key for m ≥ d_key − i (k'_{m+i} = −k_{m+i−d}); at i = d_key every pair
    # is (k_m, −k_m), of opposite signs: no feature
    generator = torch.Generator().manual_seed(5)
    d = 5
    k = torch.randn(2, 7, d, dtype=torch.float64, generator=generator)
    k[0, 3, 1] = 0.0  # relu's kink: no gradient on either path
    phi_q = torch.rand(2, 1, 2 * d * d, dtype=torch.float64, generator=generator)
    grad = torch.randn(2, 7, 1, dtype=torch.float64, generator=generator)
    out, grad_k, grad_q = scores_and_grads(k, phi_q, grad, d)
    k_ref, q_ref = k.clone().requires_grad_(), phi_q.clone().requires_grad_()
    ref = paper_dpfp(k_ref, d) @ q_ref.mT
    ref_grads = torch.autograd.grad(ref, (k_ref, q_ref), grad)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(grad_k, ref_grads[0], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(grad_q, ref_grads[1], rtol=1e-13, atol=1e-13)
    assert grad_k[0, 3, 1] == 0


def test_a_non_contiguous_key_view_gives_the_contiguous_keys_scores():
    generator = torch.Generator().manual_seed(2)
    k = torch.randn(3, 8, 6, generator=generator, dtype=torch.float64)
    phi_q = torch.rand(3, 1, 24, generator=generator, dtype=torch.float64)
    view = k.transpose(-2, -1).contiguous().transpose(-2, -1)
    assert not view.is_contiguous()
    torch.testing.assert_close(dpfp_query_scores(view, phi_q, 2), dpfp_query_scores(k, phi_q, 2), rtol=0, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_key_reaches_its_own_score_only(bad, monkeypatch):
    # kind 13 of issue 14: a NaN or inf key must not change any other position's score, and its own
    # score must not come out finite (fastmath without nnan/ninf keeps IEEE semantics)
    generator = torch.Generator().manual_seed(3)
    k = torch.randn(2, 9, 4, generator=generator)
    phi_q = torch.rand(2, 1, 16, generator=generator) + 0.1
    clean = dpfp_query_scores(k, phi_q, 2)
    k[1, 4, 2] = bad
    for tensor_form in (False, True):
        if tensor_form:
            monkeypatch.setattr(compiled_scores, "runs_here", lambda k: False)
        out = dpfp_query_scores(k, phi_q, 2)
        assert not torch.isfinite(out[1, 4]).all()
        others = torch.ones_like(out, dtype=torch.bool)
        others[1, 4] = False
        torch.testing.assert_close(out[others], clean[others])


def test_repeated_calls_are_bit_identical():
    generator = torch.Generator().manual_seed(4)
    k = torch.randn(4, 50, 16, generator=generator, requires_grad=True)
    phi_q = torch.rand(4, 1, 64, generator=generator, requires_grad=True)
    grad = torch.randn(4, 50, 1, generator=generator)
    def once() -> tuple[torch.Tensor, ...]:
        out = dpfp_query_scores(k, phi_q, 2)
        return (out.detach(), *torch.autograd.grad(out, (k, phi_q), grad))

    for a, b in zip(once(), once()):
        assert torch.equal(a, b)


NO_CACHE_DIRECTORY = """
import torch
from fwbench.tasks.key_rows import KeyRows, table_scores
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores
k = torch.tensor([[[[1.0, 2.0, -3.0]]]], dtype=torch.float64)
phi_q = torch.arange(1.0, 7.0, dtype=torch.float64).view(1, 1, 1, 6)
table = k[0, 0]
ids = torch.zeros(1, 1, dtype=torch.long)
print(dpfp_query_scores(k, phi_q, 1).item(), table_scores(KeyRows(table, ids, 0 * table, ids), phi_q[0, 0], "dpfp", 1).item())
"""


def test_the_loops_compile_where_numba_finds_no_writable_cache_directory():
    # a read-only install run by a user whose home is read-only too: numba finds no cache locator,
    # and cache=True raised "cannot cache function 'row_score': no locator available" when
    # fwbench.tasks was imported; NUMBA_CACHE_LOCATOR_CLASSES=ZipCacheLocator (a locator that serves
    # only zipped sources) leaves numba without a locator in the same way
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator"}
    done = subprocess.run([sys.executable, "-c", NO_CACHE_DIRECTORY], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-500:]
    # φ(k)·φ(q) by the paper's definition: r = [1, 2, 0, 0, 0, 3], r ⊙ roll(r, 1) = [3, 2, 0, 0, 0, 0],
    # and φ(q) = [1, …, 6]: 3 · 1 + 2 · 2 = 7
    assert [float(x) for x in done.stdout.split()] == [7.0, 7.0]


@pytest.mark.parametrize("nu", [1, 2, 4])
def test_infinite_and_overflowing_keys_score_as_the_paper_features(nu):
    # kind 13 of issue 14: max(k'_m k'_{m+i}, 0) turned a key's −inf pair product into 0, so
    # k = [−1, inf, −1] scored 0 (finite) where φ(k)·φ(q) is NaN (relu(inf) · relu(−1) = inf · 0);
    # a product that overflows from finite coordinates (1e20 · −1e20 in fp32) must still give 0
    generator = torch.Generator().manual_seed(5)
    k = torch.randn(1, 64, 4, generator=generator)
    where = torch.rand(1, 64, 4, generator=generator)
    k[where < 0.1], k[where > 0.9] = float("inf"), -float("inf")
    k[0, :4] = torch.tensor([[-1.0, float("inf"), -1.0, 2.0], [1.0, -float("inf"), 1.0, -2.0],
                             [1e20, -1e20, 0.0, 0.0], [2.0, -1.0, float("inf"), 1.0]])
    phi_q = torch.rand(1, 1, 8 * nu, generator=generator, requires_grad=True)
    out = dpfp_query_scores(k, phi_q, nu)
    expected = paper_dpfp(k, nu) @ phi_q.detach().mT
    assert torch.isnan(expected[0, :2]).all() and torch.isnan(expected[0, 3]).all()
    assert expected[0, 2].item() == 0 or nu > 2  # from roll 3 on, 1e20 meets −(−1e20): inf
    torch.testing.assert_close(out.detach(), expected, rtol=1e-6, atol=0, equal_nan=True)
    # the same loops read keys given as table rows (Setting 1's training reads)
    ids = torch.arange(64).view(1, 64)
    from_tables = table_scores(KeyRows(k[0], ids, torch.zeros_like(k[0]), ids), phi_q.detach()[:, 0], "dpfp", nu)
    torch.testing.assert_close(from_tables, expected[..., 0], rtol=1e-6, atol=0, equal_nan=True)
    # φ(q)'s gradient Σ_t ḡ_t φ(k_t) is NaN as the features are
    (grad_q,) = torch.autograd.grad(out[0, :1].sum(), phi_q)
    assert torch.isnan(grad_q).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nu", [1, 2, 3])
def test_the_tensor_form_scores_non_finite_keys_as_the_paper_features(dtype, nu, monkeypatch):
    # issue 14 kinds 4 and 13: the tensor form CUDA runs took relu(k'_m k'_{m+i}), so k = [1, −1, inf]
    # (ν = 1) scored 0 where φ(k)·φ(q) is NaN (relu(−1) · relu(inf) = 0 · inf), and summed
    # f (N + [k'_{m+i} > 0] (P − N)), NaN for an inf feature where P < N: [0, −3e38, 3e38] in fp32
    # (ν = 2, 3e38 · 3e38 overflows) scored NaN where φ(k)·φ(q) is inf
    values = [0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), 3e38, -3e38, 1e-45, 1e20, -1e20]
    import itertools

    k = torch.tensor(list(itertools.product(values, repeat=3)), dtype=dtype)[None]
    phi_q = torch.rand(1, 1, 6 * nu, generator=torch.Generator().manual_seed(nu), dtype=dtype).add(0.5)
    expected = paper_dpfp(k, nu) @ phi_q.mT
    assert torch.isnan(expected[0, values.index(1.0) * 11 * 11 + values.index(-1.0) * 11 + values.index(float("inf"))])
    monkeypatch.setattr(compiled_scores, "runs_here", lambda k: False)
    phi_q.requires_grad_()
    out = dpfp_query_scores(k, phi_q, nu)
    finite = expected.isfinite()
    torch.testing.assert_close(out.detach()[finite], expected[finite], rtol=1e-5, atol=1e-30)
    assert torch.equal(out.detach()[~finite].isnan(), expected[~finite].isnan())
    assert torch.equal(out.detach()[~finite & ~expected.isnan()], expected[~finite & ~expected.isnan()])
    # φ(q)'s gradient Σ_t ḡ_t φ(k_t) over the keys whose features are all finite (an inf feature
    # makes the sum over both P's and N's share inf, as it does the paper's)
    finite_keys = k[:, paper_dpfp(k, nu)[0].isfinite().all(dim=-1)]
    (grad_q,) = torch.autograd.grad(dpfp_query_scores(finite_keys, phi_q, nu).sum(), phi_q)
    torch.testing.assert_close(grad_q[0, 0], paper_dpfp(finite_keys[0], nu).sum(dim=0), rtol=1e-5, atol=0)


@pytest.mark.parametrize("tensor_form", [False, True])
@pytest.mark.parametrize("nu", [1, 2])
def test_a_pair_whose_product_underflows_keeps_its_gradient(nu, tensor_form, monkeypatch):
    # issue 14 kind 1: the backward passed a pair's gradient where k'_m k'_{m+i} > 0, which a product
    # that underflows to 0 fails: k = [0, 0.4, 5e-324] in float64 (0.4 · 5e-324 = 0) got 0 for its
    # last coordinate where φ(k)'s autograd gives relu(0.4) · w · ḡ (a coordinate of one sign passes
    # relu's gradient however small it is)
    k = torch.tensor([[[0.0, 0.4, 5e-324], [-5e-324, -1.0, 0.4], [2.0, 5e-324, 5e-324]]], dtype=torch.float64)
    phi_q = torch.rand(1, 1, 6 * nu, generator=torch.Generator().manual_seed(nu), dtype=torch.float64).add(0.5)
    grad = torch.tensor([[[1.0], [-2.0], [3.0]]], dtype=torch.float64)
    k_exact = k.clone().requires_grad_()
    (expected,) = torch.autograd.grad(paper_dpfp(k_exact, nu) @ phi_q.mT, k_exact, grad)
    assert expected[0, 0, 2] != 0 and expected[0, 1, 0] != 0
    if tensor_form:
        monkeypatch.setattr(compiled_scores, "runs_here", lambda k: False)
    k_op = k.clone().requires_grad_()
    (got,) = torch.autograd.grad(dpfp_query_scores(k_op, phi_q, nu), k_op, grad)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    # the table path's loops (the compiled ones only: CUDA looks the keys up)
    table = k[0].clone().requires_grad_()
    ids = torch.arange(3).view(1, 3)
    (from_tables,) = torch.autograd.grad(table_scores(KeyRows(table, ids, torch.zeros_like(k[0]), ids), phi_q[:, 0],
                                                      "dpfp", nu), table, grad[..., 0])
    torch.testing.assert_close(from_tables, expected[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("query", [[1e20, 2e20, -1.0], [float("inf"), 1.0, 1.0], [-3e19, -4e19, 1.0]])
def test_a_query_whose_features_overflow_scores_as_the_paper_features(query):
    # issue 14 kind 13: the compiled loops weight each pair by the one query weight its nonzero
    # feature meets, so φ(q) = [1e20, inf, 0, 0, 0, 0] (q = [1e20, 2e20, −1] in fp32, finite) scored
    # keys 0 where φ(k)·φ(q) is 0 · inf = NaN; on the key path and on the table path
    k = torch.randn(1, 16, 3, generator=torch.Generator().manual_seed(0))
    k[0, 0] = torch.tensor([1.0, 2.0, -1.0])
    phi_q = paper_dpfp(torch.tensor([[query]]), 1)
    expected = (paper_dpfp(k, 1) @ phi_q.mT)[..., 0]
    assert expected.isnan().any()
    out = dpfp_query_scores(k, phi_q, 1)[..., 0]
    torch.testing.assert_close(out, expected, equal_nan=True)
    ids = torch.arange(16).view(1, 16)
    from_tables = table_scores(KeyRows(k[0], ids, torch.zeros_like(k[0]), ids), phi_q[:, 0], "dpfp", 1)
    torch.testing.assert_close(from_tables, expected, equal_nan=True)


@pytest.mark.parametrize("nu", [1, 2])
def test_the_query_gradient_of_each_non_finite_key_is_its_paper_features(nu):
    # issue 14 kind 14: the backward's feature for φ(q)'s gradient (NaN where an infinite coordinate
    # meets 0 or the other sign) could be 0 there and the other tests passed: their rows held another
    # NaN. One key per sequence: φ(q)'s gradient is ḡ φ(k) by the paper's definition, entry by entry
    import itertools

    values = [0.0, 1.0, -1.0, float("inf"), -float("inf"), 2.0]
    k = torch.tensor(list(itertools.product(values, repeat=3)))[:, None]  # (216, 1, 3)
    phi_q = torch.rand(k.shape[0], 1, 6 * nu, generator=torch.Generator().manual_seed(nu)).add(0.5)
    grad = torch.linspace(0.5, 2.0, k.shape[0]).view(-1, 1, 1)
    expected = grad * paper_dpfp(k, nu)
    assert expected.isnan().any() and expected.isfinite().any()
    phi_q.requires_grad_()
    (got,) = torch.autograd.grad(dpfp_query_scores(k, phi_q, nu), phi_q, grad)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0, equal_nan=True)
    # the table path's loops, one key per sequence
    ids = torch.arange(k.shape[0]).view(-1, 1)
    query = phi_q.detach()[:, 0].clone().requires_grad_()
    scores = table_scores(KeyRows(k[:, 0], ids, torch.zeros_like(k[:, 0]), ids), query, "dpfp", nu)
    (got,) = torch.autograd.grad(scores, query, grad[:, 0])
    torch.testing.assert_close(got, expected[:, 0], rtol=1e-6, atol=0, equal_nan=True)


@pytest.mark.parametrize("nu", [1, 2])
def test_fp32_query_gradient_takes_the_features_in_fp32_where_they_overflow_or_underflow(nu):
    # issue 14 kind 1: numba widened `x if c else 0.0` (a float64 literal) to float64, so the fp32
    # loops formed the features of φ(q)'s gradient in float64: k = [1e20, 1e20, 1] (ν = 1) with
    # ḡ = 1e-10 gave 1e30 where ḡ φ(k) is inf (1e20 · 1e20 overflows fp32, as the forward's score
    # does), and k = [1e-25, 1e-25, 1] with ḡ = 1e20 gave 1e-30 where φ(k) underflows to 0;
    # one key per sequence, so φ(q)'s gradient is ḡ φ(k) entry by entry, on both compiled paths
    k = torch.tensor([[[1e20, 1e20, 1.0]], [[1e-25, 1e-25, 1.0]], [[-1e20, -1e20, 1.0]], [[-1e-25, -1e-25, 2.0]],
                      [[3e19, 1.0, -2e19]], [[1.0, 2.0, -3.0]]])
    grad = torch.tensor([1e-10, 1e20, 1e-10, 1e20, 1e-10, 0.5]).view(-1, 1, 1)
    expected = grad * paper_dpfp(k, nu)
    assert expected.isinf().any() and (expected == 0).any()
    phi_q = torch.full((k.shape[0], 1, 6 * nu), 0.5, requires_grad=True)
    (got,) = torch.autograd.grad(dpfp_query_scores(k, phi_q, nu), phi_q, grad)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    ids = torch.arange(k.shape[0]).view(-1, 1)
    query = phi_q.detach()[:, 0].clone().requires_grad_()
    scores = table_scores(KeyRows(k[:, 0], ids, torch.zeros_like(k[:, 0]), ids), query, "dpfp", nu)
    (got,) = torch.autograd.grad(scores, query, grad[:, 0])
    torch.testing.assert_close(got, expected[:, 0], rtol=1e-6, atol=0)
