"""Windowed softmax answers a read from the same memory in every form (found by h-break14g).

``write_read`` wrote with ``forward`` in the parallel and recurrent forms, whose cache keeps the last
``window − 1`` tokens (what the next token's query needs beside its own key), and with ``write``,
which keeps ``window``, in the others: under a window a read after the parallel or recurrent form saw
one key fewer, and the retrieval task's losses changed with the form (0.4368 against 0.4327 after three
steps of Setting 2, S = 5, window 3).
"""

from __future__ import annotations

import math

import pytest
import torch

from fwbench import variants

T, D_KEY, D_V, WINDOW = 9, 4, 3, 3


def last_keys_read(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
    """Each query attends to the last ``window`` written keys (all of them without a window)."""
    kept = slice(None) if window is None else slice(-window, None)
    keys, values = k[:, :, kept], v[:, :, kept]
    return torch.softmax(q @ keys.mT / math.sqrt(q.shape[-1]), dim=-1) @ values


@pytest.mark.parametrize("window", [None, 1, WINDOW, T + 2])
@pytest.mark.parametrize("form", ["auto", "parallel", "chunk", "recurrent"])
def test_write_read_reads_the_last_window_keys_in_every_form(form, window):
    spec = "softmax" if window is None else f"softmax:window={window}"
    attention = variants.build_attention(spec, D_KEY, form=form)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 2, T, D_KEY, generator=g, dtype=torch.float64), torch.randn(2, 2, T, D_V, generator=g,
                                                                                      dtype=torch.float64)
    q = torch.randn(2, 2, 4, D_KEY, generator=g, dtype=torch.float64)
    expected = last_keys_read(q, k, v, window)
    torch.testing.assert_close(attention.write_read(k, v, q), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attention.read(q, attention.write(k, v)), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call", ["read", "write_read", "parallel", "recurrent"])
@pytest.mark.parametrize("spec", ["softmax", "softmax:window=2"])
def test_a_read_on_meta_tensors_has_the_cpu_calls_shapes(spec, call):
    """The meta device holds shapes, no values: the fused kernel's check read its norms on the host and
    raised "NotImplementedError: Cannot copy out of meta tensor; no data!" (read, write_read and the
    parallel form), where the other variants' reads (linear, dpfp) and softmax's recurrent form give
    the output's shape. Now the check passes meta tensors to the fused kernel, which gives its shapes."""
    attention = variants.build_attention(spec, d_key=2)
    q, k, v = torch.randn(1, 2, 3, 2), torch.randn(1, 2, 4, 2), torch.randn(1, 2, 4, 3)

    def run(q, k, v):
        if call == "read":
            return attention.read(q, attention.write(k, v))
        if call == "write_read":
            return attention.write_read(k, v, q)
        return attention(k, k, v, form=call)[0]

    expected = run(q, k, v)
    on_meta = [x.to("meta").requires_grad_() for x in (q, k, v)]
    y = run(*on_meta)
    assert (y.device.type, y.shape, y.dtype) == ("meta", expected.shape, expected.dtype)
    grads = torch.autograd.grad(y.sum(), on_meta, allow_unused=True)
    assert [None if g is None else g.shape for g in grads] == [
        None if call in ("parallel", "recurrent") else q.shape, k.shape, v.shape]


@pytest.mark.parametrize("source", ["softmax", f"softmax:window={T - 2}"])
@pytest.mark.parametrize("window", [1, WINDOW])
def test_a_windowed_read_of_a_longer_cache_reads_the_last_window_keys(source, window):
    """A cache of more than ``window`` tokens (written by a module of no window or a longer one) was
    read whole by ``read``, where ``write_read`` of no new token, ``write`` and the forms keep its last
    ``window``: at window 3, read(q, a 9-token cache) gave [-0.4724, -0.0503] against [-0.1868, -0.4071]."""
    attention = variants.build_attention(f"softmax:window={window}", D_KEY)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 2, T, D_KEY, generator=g, dtype=torch.float64), torch.randn(2, 2, T, D_V, generator=g,
                                                                                      dtype=torch.float64)
    q = torch.randn(2, 2, 4, D_KEY, generator=g, dtype=torch.float64)
    longer = variants.build_attention(source, D_KEY).write(k, v)
    assert longer.k.shape[2] > window
    expected = last_keys_read(q, k, v, window)
    torch.testing.assert_close(attention.read(q, longer), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(attention.read(q, longer), attention.write_read(k[:, :, :0], v[:, :, :0], q, state=longer),
                               rtol=0, atol=0)


@pytest.mark.parametrize("form", ["auto", "parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("window", [1, WINDOW])
def test_a_call_of_no_token_leaves_a_written_cache_as_it_was(form, window):
    """A forward of T = 0 returns the state unchanged (L41), but trimmed the cache to ``window − 1`` tokens:
    a cache of ``window`` tokens (what ``write`` keeps) lost its oldest key, and a read after the empty call
    differed from the read before it (window 3: [-0.6223, 0.0496] against [-0.6461, 0.0535])."""
    attention = variants.build_attention(f"softmax:window={window}", D_KEY, form=form)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 2, T, D_KEY, generator=g, dtype=torch.float64), torch.randn(2, 2, T, D_V, generator=g,
                                                                                      dtype=torch.float64)
    q = torch.randn(2, 2, 4, D_KEY, generator=g, dtype=torch.float64)
    written = attention.write(k, v)
    y, after = attention(q[:, :, :0], k[:, :, :0], v[:, :, :0], state=written)
    assert y.shape == (2, 2, 0, D_V) and after.position == written.position == T
    assert torch.equal(after.k, written.k) and torch.equal(after.v, written.v)
    torch.testing.assert_close(attention.read(q, after), last_keys_read(q, k, v, window), rtol=1e-12, atol=1e-12)
