"""The FWM rule's chunked form (variants.kernels.fwm_rule: per-chunk states, scalar rescalings carried
as log-scales) differentiated by autograd, against autograd of the plain recurrence, in float64: the
gradients of q, k, v, β and W0, through the per-token reads and the final fast weight, with the
rescaling inactive, active on every write, and mixed; sequences of one chunk, of several and a part."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close

from fwbench.variants.kernels import fwm_rule_recurrent, fwm_rule_write

B, H, D, D_V = 2, 2, 6, 4


def plain_recurrence(q, k, v, beta, W0):
    """The rule written out one token at a time in float64, differentiated by autograd:
    W ← W + β (v − W k) kᵀ, W ← W / sqrt(max(1, ‖W‖²_F)), read u_t = W q_t (no layer norm)."""
    W, reads = W0, []
    for t in range(k.shape[2]):
        k_t = k[:, :, t]
        W = W + (beta[:, :, t, None] * (v[:, :, t] - (W @ k_t[..., None]).squeeze(-1)))[..., None] * k_t[:, :, None, :]
        W = W / W.pow(2).sum(dim=(-2, -1), keepdim=True).clamp(min=1.0).sqrt()
        if q is not None:
            reads.append((W @ q[:, :, t, :, None]).squeeze(-1))
    return (torch.stack(reads, dim=2) if q is not None else None), W


def fwm_leaves(T: int, scale: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, H, T, D, generator=g, dtype=torch.float64) * scale
    k = torch.rand(B, H, T, D, generator=g, dtype=torch.float64) * scale
    v = torch.randn(B, H, T, D_V, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    W0 = torch.randn(B, H, D_V, D, generator=g, dtype=torch.float64) * 0.1
    return [x.requires_grad_() for x in (q, k, v, beta, W0)]


def weighted_loss(y, W, seed: int):
    """A loss that weighs every output element differently, so no gradient term cancels."""
    g = torch.Generator().manual_seed(seed + 1)
    loss = (W * torch.randn(W.shape, generator=g, dtype=W.dtype)).sum()
    if y is not None:
        loss = loss + (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum()
    return loss


@pytest.mark.parametrize("T", [1, 16, 37])  # chunks of 16: one whole; two whole and a part
@pytest.mark.parametrize("scale", [0.1, 3.0, 1.2], ids=["below_one", "every_write", "mixed"])
def test_fwm_recurrent_gradients_equal_autograd_of_the_plain_loop(T, scale):
    leaves = fwm_leaves(T, scale, seed=T)
    q, k, v, beta, W0 = leaves
    y, W = fwm_rule_recurrent(q, k, v, beta, W0)
    assert y.dtype == W.dtype == torch.float64
    grads = torch.autograd.grad(weighted_loss(y, W, T), leaves)
    y_ref, W_ref = plain_recurrence(q, k, v, beta, W0)
    y_ref = torch.nn.functional.layer_norm(y_ref, (D_V,), eps=1e-5)
    grads_ref = torch.autograd.grad(weighted_loss(y_ref, W_ref, T), leaves)
    for got, want in zip(grads, grads_ref):
        assert_close(got, want, 1e-10)


@pytest.mark.parametrize("T", [5, 40])
def test_fwm_write_gradients_equal_autograd_of_the_plain_loop(T):
    _, k, v, beta, W0 = leaves = fwm_leaves(T, 2.0, seed=100 + T)
    W = fwm_rule_write(k, v, beta, W0)
    grads = torch.autograd.grad(weighted_loss(None, W, T), leaves[1:])
    _, W_ref = plain_recurrence(None, k, v, beta, W0)
    grads_ref = torch.autograd.grad(weighted_loss(None, W_ref, T), leaves[1:])
    assert_close(W, W_ref, 1e-12)
    for got, want in zip(grads, grads_ref):
        assert_close(got, want, 1e-10)


@pytest.mark.slow
def test_fwm_backward_passes_gradcheck_from_the_zero_state():
    q, k, v, beta, _ = fwm_leaves(7, 1.5, seed=7)
    assert torch.autograd.gradcheck(lambda *x: fwm_rule_recurrent(*x), (q, k, v, beta))


def test_fwm_fp32_inputs_compute_in_fp32_and_bf16_inputs_too():
    q, k, v, beta, W0 = (x.detach().float() for x in fwm_leaves(4, 1.0, seed=3))
    y, W = fwm_rule_recurrent(q.bfloat16(), k.bfloat16(), v.bfloat16(), beta.bfloat16())
    assert y.dtype == torch.bfloat16 and W.dtype == torch.float32
    assert fwm_rule_write(k, v, beta, W0).dtype == torch.float32




def test_fwm_leaves_the_denormal_mode_as_it_found_it():
    denormal = torch.tensor([1e-39])
    q, k, v, beta, W0 = fwm_leaves(20, 3.0, seed=5)
    y, W = fwm_rule_recurrent(q.float(), k.float(), v.float(), beta.float())
    (y.sum() + W.sum()).backward()
    assert (denormal * 1.0).item() != 0.0  # still off
    assert torch.set_flush_denormal(True)
    try:
        fwm_rule_write(k.float(), v.float(), beta.float())
        assert (denormal * 1.0).item() == 0.0  # still on
    finally:
        torch.set_flush_denormal(False)


def test_fwm_backward_lets_go_of_the_chunked_scans_graph():
    """The chunked scan's own graph, kept by the FWM rule's autograd function (``_FlushedScan``) for
    a second backward, outlived the first: it held every chunk's states for as long as the caller
    kept the loss (a loop appending each step's loss grew by all of them), where autograd's own
    backward frees its buffers (10 more kept losses: 6,030 more live tensors, T = 37). Now the
    backward lets it go: each kept loss holds only itself and, through its graph, its 5 leaves.
    A second backward (``retain_graph=True`` before) runs the scan again: the same gradients bit
    for bit, and a third raises as autograd does."""
    import gc

    def live_tensors_after(steps: int) -> int:
        kept = []
        for step in range(steps):
            q, k, v, beta, W0 = fwm_leaves(T=37, scale=3.0, seed=step)
            y, W = fwm_rule_recurrent(q, k, v, beta, W0)
            loss = weighted_loss(y, W, step)
            loss.backward()
            kept.append(loss)
        gc.collect()
        return sum(1 for x in gc.get_objects() if isinstance(x, torch.Tensor))

    live_tensors_after(2)  # one-off tensors (generators' states, layer-norm buffers) before counting
    grown = live_tensors_after(20) - live_tensors_after(10)
    assert grown <= 6 * 10 + 3  # 10 more losses with their 5 leaves each (and the last step's)

    leaves = fwm_leaves(T=37, scale=1.2, seed=5)
    y, W = fwm_rule_recurrent(*leaves)
    loss = weighted_loss(y, W, 5)
    first = torch.autograd.grad(loss, leaves, retain_graph=True)
    second = torch.autograd.grad(loss, leaves, retain_graph=False)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(loss, leaves)


def test_fwm_second_backward_runs_under_the_forwards_autocast():
    """Break-it finding (h-break14z): the second backward (after ``retain_graph=True``) ran the
    chunked scan again under the caller's autocast state at the backward, not the forward's: forward
    under ``torch.autocast("cpu", torch.bfloat16)`` (bf16 matmuls), backwards outside it (fp32
    matmuls): the second backward's gradients were 5.7 off the first's. Now they are equal bit for bit."""
    from fwbench.variants.kernels.fwm_rule import _scan

    g = torch.Generator().manual_seed(0)
    q, k = (torch.rand(1, 2, 20, D, generator=g, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 2, 20, D_V, generator=g, requires_grad=True)
    beta = torch.rand(1, 2, 20, generator=g, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reads, W = _scan(q, k, v, beta, None)
    assert "_FlushedScan" in type(W.grad_fn).__name__
    loss = weighted_loss(reads, W, 0)
    first = torch.autograd.grad(loss, (q, k, v, beta), retain_graph=True)
    second = torch.autograd.grad(loss, (q, k, v, beta))
    for a, b in zip(first, second):
        assert torch.equal(a, b)
