"""Values that the surviving mutants of the mutation pass of 6 December 2026 (h-mut-sm) over softmax's
fused path changed and no other test saw: the spans of the per-span fused calls of masked pairs that
may overflow (``_masked_pair_calls``), the value limit, the explicit logits, the fused kernel's
autograd function and its second-order and autocast recomputations (``double_backward``), and the
guard that picks the fused kernel (``docs/mutation.md``, section "Results: softmax's fused path and
double_backward"). Each test names the fault and the right value; references are the recurrent form
(``softmax_recurrent``, one token at a time), plain ``scaled_dot_product_attention``, a float64 loop,
and weakref/gc liveness.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fwbench.variants.kernels import softmax
from fwbench.variants.kernels.softmax import softmax_parallel, softmax_recurrent


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _huge_tokens(seed: int, P: int, T: int = 8, d: int = 2, H: int = 2):
    """fp32 q, k, v (1, H, T, ·) and a cache of P tokens, with about one entry in eight of q and k
    replaced by ±1e9, ±1e20 or ±1e30: logits that overflow (allowed or masked) in every pattern."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, P + T, n, generator=g) for n in (d, d, 3))
    for x in (q, k):
        pick = torch.rand(x.shape, generator=g) < 0.12
        size = torch.tensor([1e9, 1e20, 1e30])[torch.randint(0, 3, x.shape, generator=g)]
        sign = torch.randint(0, 2, x.shape, generator=g) * 2 - 1
        x[pick] = (size * sign)[pick]
    cache = (k[:, :, :P], v[:, :, :P]) if P else (None, None)
    return q[:, :, P:], k[:, :, P:], v[:, :, P:], cache


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("P", [0, 2])
def test_huge_queries_and_keys_give_the_recurrent_forms_outputs(window, P):
    """40 sequences of huge tokens (fp32, T = 8, 2 heads, a window of 3 or none, a cache of 2 or
    none): every output row equals the recurrent form's (NaN where its logits overflow). Faults: a
    span of a per-span fused call that leaves out a key its rows read or takes in one of their
    overflowing partners, a pair broken on the wrong side (a row's own query or key zeroed)."""
    for seed in range(40):
        q, k, v, (k_cache, v_cache) = _huge_tokens(seed, P)
        y = softmax_parallel(q, k, v, k_cache, v_cache, window)[0]
        expected = softmax_recurrent(q, k, v, k_cache, v_cache, window)[0]
        assert torch.allclose(y, expected, rtol=1e-4, atol=1e-4, equal_nan=True), seed


# --- the per-span fused calls of masked pairs that may overflow (_masked_pair_calls) ---------------


def _fused_rows(q, k, v, window=None):
    """The fused kernel on the given inputs: the bit-for-bit value of rows nothing reaches."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=softmax._causal_mask(q.shape[2], 0, window, q.device))


def _counting_fused_calls(monkeypatch) -> list[int]:
    calls, fused = [], softmax._fused_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(softmax, "_fused_attention", counted)
    return calls


def _huge_key(T: int, at: int, seed: int):
    """fp32, d_key 2, T tokens: every query (2, ·), key ``at`` (1e38, 0): q·k_at's bound 2e38 passes
    the limit (1.7e38), so the rows before it have it as a masked partner and the rows from it on are
    taken from the explicit form; every other pair is moderate."""
    q, k, v = (_randn(1, 1, T, n, seed=seed + s) for s, n in enumerate((2, 2, 3)))
    q[..., 0] = 2.0
    k[0, 0, at] = torch.tensor([1e38, 0.0])
    return q, k, v


def test_a_huge_key_costs_one_fused_call_whose_rows_are_the_fused_kernels(monkeypatch):
    """A huge key at token 3 of 6: rows 0–2 share one span ([0, 2]) and so one fused call (the
    docstring's "one call for a huge key"), and are the fused kernel's bit for bit on the inputs with
    that key zeroed (they do not read it); rows 3–5 are the explicit form's. Faults: the masked
    pairs taken as every masked pair (``over | ~allowed``: a span and a call per row); the distinct
    spans counted against the first one (``ordered[..., :1]``: rows of one span split over calls)."""
    q, k, v = _huge_key(6, 3, seed=30)
    calls = _counting_fused_calls(monkeypatch)
    y = softmax_parallel(q, k, v)[0]
    assert len(calls) == 1
    assert torch.equal(y[0, 0, :3], _fused_rows(q, k.index_fill(2, torch.tensor([3]), 0.0), v)[0, 0, :3])
    assert torch.allclose(y, softmax_recurrent(q, k, v)[0], rtol=1e-5, atol=1e-6)


def test_the_per_span_calls_pass_no_nan_into_the_gradients():
    """fp32, d_key 2, T = 6: query 1 = (1e30, ·) against key 3 = (1e9, ·), a masked pair whose logit
    1e39 overflows; every other coordinate 0 of the keys and queries is 0, so every other logit is
    moderate and every output finite. Two fused calls: row 1's (span [0, 2], key 3 zeroed) and the
    others' (span [0, 5], query 1 zeroed). The gradients of Σ w·y are those of the recurrent form in
    float64. Fault: the per-span call zeroing only the queries both non-finite and cut (``bad_q &
    cut_q``): the other call kept query 1, its unused row 1 read inf + (−inf) = NaN, and its
    backward (0 · NaN) sent NaN into the gradients of every value."""
    q, k, v = (_randn(1, 1, 6, n, seed=40 + s) for s, n in enumerate((2, 2, 3)))
    q[..., 0], k[..., 0] = 0.0, 0.0
    q[0, 0, 1, 0], k[0, 0, 3, 0] = 1e30, 1e9
    w = _randn(1, 1, 6, 3, seed=43)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    grads = torch.autograd.grad((softmax_parallel(*leaves)[0] * w).sum(), leaves)
    wide = [x.double().requires_grad_() for x in (q, k, v)]
    expected = torch.autograd.grad((softmax_recurrent(*wide)[0] * w.double()).sum(), wide)
    for ours, theirs in zip(grads, expected):
        assert torch.allclose(ours.double(), theirs, rtol=1e-4, atol=1e-5)


def test_the_spans_are_taken_per_head(monkeypatch):
    """Two heads, a huge key at token 3 of head 0 and at token 5 of head 1 (T = 6): the rows before
    it share one span per head, [0, 2] and [0, 4], given by one fused call, and are the fused
    kernel's bit for bit on the keys with the huge one zeroed. Fault: the call's span taken over
    every head (``amax(None)``): head 0's rows got [0, 4], which holds their partner, key 3, so
    their queries were zeroed (outputs the mean of their values)."""
    q0, k0, v0 = _huge_key(6, 3, seed=50)
    q1, k1, v1 = _huge_key(6, 5, seed=53)
    q, k, v = (torch.cat(pair, dim=1) for pair in ((q0, q1), (k0, k1), (v0, v1)))
    calls = _counting_fused_calls(monkeypatch)
    y = softmax_parallel(q, k, v)[0]
    assert len(calls) == 1
    clean = k.clone()
    clean[0, 0, 3], clean[0, 1, 5] = 0.0, 0.0
    expected = _fused_rows(q, clean, v)
    assert torch.equal(y[0, 0, :3], expected[0, 0, :3]) and torch.equal(y[0, 1, :5], expected[0, 1, :5])
    assert torch.allclose(y, softmax_recurrent(q, k, v)[0], rtol=1e-5, atol=1e-6)


def test_a_row_whose_huge_partner_left_its_window_reads_every_key_in_it():
    """Window 3, fp32, d_key 2, T = 8, two heads (head 1 moderate). Head 0: key 1 = (1e38, 0) and
    key 5 = (0, 1e38); query 3 = (0.1, 2) has key 5 as a masked partner (a later key), query 6 = (2,
    0.1) has key 1 (before its window); every other query is below 0.5 in each coordinate. Row 6's
    span is [2, 7]: it reads keys 4–6 whole, and its logit with key 5 (7e35) puts its weight on v_5.
    Faults in the span's lower end: ``N + i`` for ``N − i``, the flip over heads or tokens instead of
    keys: row 6's span came out empty, key 5 (row 3's partner) was zeroed in its call, and its output
    was a mean of v_4–v_6 instead of v_5."""
    q, k, v = _randn(1, 2, 8, 2, seed=60) * 0.2, _randn(1, 2, 8, 2, seed=61), _randn(1, 2, 8, 3, seed=62)
    k[0, 0, 1], k[0, 0, 5] = torch.tensor([1e38, 0.0]), torch.tensor([0.0, 1e38])
    q[0, 0, 3], q[0, 0, 6] = torch.tensor([0.1, 2.0]), torch.tensor([2.0, 0.1])
    y = softmax_parallel(q, k, v, window=3)[0]
    assert torch.equal(y[0, 0, 6], v[0, 0, 5])
    assert torch.allclose(y, softmax_recurrent(q, k, v, window=3)[0], rtol=1e-5, atol=1e-6)


def test_a_row_whose_huge_partner_is_the_next_key_reads_its_own_key():
    """fp32, d_key 2, T = 4: query 0 = (0, 1e30) has key 2 = (0, 1e9) as a masked partner, query 2 =
    (1e30, 1) has key 3 = (1e9, 0), the key right after it; keys 0 and 1 are (0, ±0.5). Row 2's span
    is [0, 2]: it reads its own key whole, whose logit 7e8 puts all its weight on v_2. Fault: the
    span's upper end two before the first later partner (``argmax − 2``): [0, 1], key 2 (row 0's
    partner) zeroed in row 2's call, output a mix of v_0–v_2."""
    q = torch.tensor([[0.0, 1e30], [0.3, 0.2], [1e30, 1.0], [0.3, -0.2]]).view(1, 1, 4, 2)
    k = torch.tensor([[0.0, 0.5], [0.0, -0.5], [0.0, 1e9], [1e9, 0.0]]).view(1, 1, 4, 2)
    v = _randn(1, 1, 4, 3, seed=70)
    y = softmax_parallel(q, k, v)[0]
    assert torch.equal(y[0, 0, 2], v[0, 0, 2])
    assert torch.allclose(y, softmax_recurrent(q, k, v)[0], rtol=1e-5, atol=1e-6)


def test_the_per_span_positions_are_made_on_the_inputs_device(monkeypatch):
    """The key positions of the per-span calls and of their spans are asked for on the inputs'
    device (a GPU run would otherwise compare CUDA with CPU tensors). A recorder of ``torch.arange``
    sees every call of a run with a huge key (three on CPU here). Faults: ``device=None`` or no
    device for one of them (the default device)."""
    asked, arange = [], torch.arange

    def recorded(*args, **kwargs):
        asked.append(kwargs.get("device"))
        return arange(*args, **kwargs)

    q, k, v = _huge_key(6, 3, seed=30)
    monkeypatch.setattr(torch, "arange", recorded)
    softmax_parallel(q, k, v)
    assert len(asked) >= 5 and all(d is not None and torch.device(d) == q.device for d in asked), asked


# --- the marks and the value limit on the explicit path ------------------------------------------


def test_a_nan_query_entry_does_not_count_in_the_queries_largest_entry():
    """Keys expanded over 2 heads (d_key 4), every query's coordinate 0 is 0 and the others about
    1e-3, one NaN in the last query; key 2's coordinate 0 is 1e38 (above the root 6.5e18 of the
    per-term limit 4.25e37). Its largest product, 1e38 × (largest query entry ≈ 3e-3), stays below
    that limit, so it is not marked and rows 0–6 are the fused kernel's bit for bit on the queries
    with the NaN zeroed. Fault: the NaN read as 1 in the queries' largest entry: key 2 marked and
    rows 2–6 taken from the explicit form (other bits)."""
    base = _randn(1, 1, 8, 4, seed=80)
    base[0, 0, 2, 0] = 1e38
    keys = base.expand(1, 2, 8, 4)
    q, v = 1e-3 * _randn(1, 2, 8, 4, seed=81), _randn(1, 2, 8, 4, seed=82)
    q[..., 0] = 0.0
    q_nan = q.clone()
    q_nan[0, 1, 7, 2] = float("nan")
    y = softmax_parallel(q_nan, keys, v)[0]
    assert torch.equal(y[:, :, :7], _fused_rows(q, keys, v)[:, :, :7])


def test_an_attended_logit_bound_exactly_at_the_limit_is_not_marked():
    """fp32, d_key 2, T = 6: query 4 = (c, ·) attends key 2 = (−e, 0) with c·e the logit limit exactly
    (c = 2^63, e = (2^24 − 1)·2^40, limit = fp32 max / 2): the fused kernel holds it (its weight is
    0), so the query is not marked. Every other coordinate 0 is 0; a NaN in the last value takes the
    explicit path. Rows 0–4 are the fused kernel's bit for bit on the values with that NaN zeroed.
    Fault: ``>=`` for ``>`` in the pair bound: query 4 marked, row 4 taken from the explicit form."""
    q, k, v = (_randn(1, 1, 6, n, seed=90 + s) for s, n in enumerate((2, 2, 3)))
    q[..., 0], k[..., 0] = 0.0, 0.0
    c, e = 2.0**63, (2**24 - 1) * 2.0**40
    assert c * e == torch.finfo(torch.float32).max / 2
    q[0, 0, 4, 0], k[0, 0, 2, 0] = c, -e
    v_nan = v.clone()
    v_nan[0, 0, 5, 1] = float("nan")
    y = softmax_parallel(q, k, v_nan)[0]
    assert torch.equal(y[0, 0, :5], _fused_rows(q, k, v)[0, 0, :5])


@pytest.mark.parametrize("size", ["1e20", "exactly the float64 value limit"])
def test_a_float64_value_below_its_limit_stays_with_the_fused_kernel(size):
    """float64, T = 6, value 0 holds 1e20 (past fp32's value limit √(fp32 max / 2) = 1.3e19, below
    float64's, 9.5e153) or float64's limit exactly; a NaN in the last value takes the explicit path.
    Rows 0–4 are the fused kernel's bit for bit on the values with that NaN zeroed. Faults: the value
    limit taken for no dtype (fp32's) in ``_value_limit`` or in the explicit path's value marks;
    ``>=`` for ``>`` there: the entries reading value 0 taken from the explicit form (other bits)."""
    q, k, v = (_randn(1, 1, 6, 4, seed=100 + s, dtype=torch.float64) for s in range(3))
    v[0, 0, 0, 0] = 1e20 if size == "1e20" else math.sqrt(torch.finfo(torch.float64).max / 2)
    v_nan = v.clone()
    v_nan[0, 0, 5, 1] = float("nan")
    y = softmax_parallel(q, k, v_nan)[0]
    expected = _fused_rows(q, k, v)
    assert torch.equal(y[0, 0, :5], expected[0, 0, :5])
    if size == "1e20":  # without the NaN: the fused path
        assert torch.equal(softmax_parallel(q, k, v)[0], expected)



def test_the_guard_judges_float64_values_by_float64s_value_limit():
    """float64, keys expanded over 2 heads, d_key 2: query 1 = (a, ·) and key 3 = (a, ·) with a² = 0.6 ×
    float64's logit limit (‖Q‖‖K‖ ≈ 0.85 × it), and value 0 holds 1e20 (‖V‖ past fp32's value limit
    1.3e19, far below float64's 9.5e153): the fused kernel holds every logit and every sum, so the
    output is its own bit for bit. Fault: the guard's value limit taken for no dtype (fp32's): the
    explicit path ran, and its per-entry marks for shared keys (a·a > limit / 2) moved rows 1, 3–5."""
    f64 = torch.float64
    a = math.sqrt(0.6 * torch.finfo(f64).max / 2)
    q, base, v = (_randn(*shape, seed=s, dtype=f64) for shape, s in (((1, 2, 6, 2), 170), ((1, 1, 6, 2), 171),
                                                                  ((1, 2, 6, 2), 172)))
    q[:, :, :, 0], base[:, :, :, 0] = 0.0, 0.0
    q[0, 0, 1, 0], base[0, 0, 3, 0] = a, a
    v[0, 0, 0, 0] = 1e20
    k = base.expand(1, 2, 6, 2)
    assert torch.equal(softmax_parallel(q, k, v)[0], _fused_rows(q, k, v))

# --- the fused kernel's autograd function and its recomputations ---------------------------------


def _flash_inputs(seed: int, dtype=torch.float64, requires_grad=(True, True, True)):
    """q, k, v (1, 2, 5, 3): d_v = d_key, so torch's CPU flash kernel (no derivative of its
    backward) runs and the autograd function is taken."""
    return [_randn(1, 2, 5, 3, seed=seed + i, dtype=dtype).requires_grad_(r) for i, r in enumerate(requires_grad)]


def _causal(T: int = 5):
    return torch.ones(T, T, dtype=torch.bool).tril()


@pytest.mark.parametrize("alone", [0, 1, 2], ids=["q", "k", "v"])
def test_one_input_requiring_grad_gets_first_and_second_derivatives(alone):
    """Only q, only k or only v requires a gradient (float64, d_v = d_key): its gradient of Σ w·y is
    plain SDPA's bit for bit, and its Hessian-vector product (for q or k) that of the math kernel (whose
    backward is differentiable). Faults: the autograd function taken only if q, or k and v, require one
    (``or`` → ``and``: plain SDPA's flash kernel then raised "derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented"); a gradient
    returned for every input (``… or True``: the inputs' gradients shifted, then StopIteration)."""
    inputs = _flash_inputs(110, requires_grad=[i == alone for i in range(3)])
    x = inputs[alone]
    w, u = _randn(1, 2, 5, 3, seed=115, dtype=torch.float64), _randn(*x.shape, seed=116, dtype=torch.float64)
    y = softmax_parallel(*inputs)[0]
    (grad,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)
    (plain,) = torch.autograd.grad((F.scaled_dot_product_attention(*inputs, attn_mask=_causal()) * w).sum(), x)
    assert torch.equal(torch.autograd.grad((softmax_parallel(*inputs)[0] * w).sum(), x)[0], plain)
    assert torch.allclose(grad, plain, rtol=1e-12, atol=1e-14)
    if alone == 2:  # y is linear in v: its gradient does not depend on v
        assert not grad.requires_grad
        return
    (hvp,) = torch.autograd.grad((grad * u).sum(), x)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        (math_grad,) = torch.autograd.grad(
            (F.scaled_dot_product_attention(*inputs, attn_mask=_causal()) * w).sum(), x, create_graph=True)
        (expected,) = torch.autograd.grad((math_grad * u).sum(), x)
    assert torch.allclose(hvp, expected, rtol=1e-10, atol=1e-12)


def test_a_read_without_a_mask_gives_sdpas_output_and_gradients():
    """``softmax_read`` (no mask) on inputs requiring gradients, d_v = d_key: the autograd function
    with ``attn_mask=None``; output and gradients plain SDPA's bit for bit. Fault: the mask copied
    when it is absent or bool (``and`` → ``or``: ``None.dtype``, AttributeError)."""
    q, k, v = _flash_inputs(120, dtype=torch.float32)
    y = softmax.softmax_read(q, k, v)
    assert "_FusedAttention" in type(y.grad_fn).__name__
    plain = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(y, plain)
    grad_y = _randn(*y.shape, seed=125)
    for ours, theirs in zip(torch.autograd.grad(y, (q, k, v), grad_y), torch.autograd.grad(plain, (q, k, v), grad_y)):
        assert torch.equal(ours, theirs)


def test_the_first_backward_runs_no_second_forward(monkeypatch):
    """Forward and backward of the autograd function call the fused kernel once, as plain SDPA does:
    the backward differentiates the graph the forward kept. Fault: that graph not kept
    (``ctx.graph = None``): every backward ran the fused forward again (the same gradients, twice
    the kernel calls)."""
    sdpa, calls = F.scaled_dot_product_attention, []

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    q, k, v = _flash_inputs(130, dtype=torch.float32)
    y = softmax._fused_attention(q, k, v, attn_mask=_causal())
    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    y.sum().backward()
    assert calls == []
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    expected = torch.autograd.grad(sdpa(q, k, v, attn_mask=_causal()).sum(), (q, k, v))
    assert all(torch.equal(x.grad, g) for x, g in zip((q, k, v), expected))


def test_a_plain_backward_after_a_create_graph_backward_gives_sdpas_gradients():
    """``torch.autograd.grad(..., create_graph=True)`` (which retains the graph), then a plain
    backward of the same output: the second rebuilds the fused kernel's graph and gives plain SDPA's
    gradients bit for bit. Fault: the create_graph backward leaving ``ctx.graph`` set to something
    other than None (``""``): the plain backward took it for the kept graph and raised."""
    q, k, v = _flash_inputs(140, dtype=torch.float32)
    grad_y = _randn(1, 2, 5, 3, seed=145)
    y = softmax._fused_attention(q, k, v, attn_mask=_causal())
    torch.autograd.grad(y, (q, k, v), grad_y, create_graph=True)
    expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=_causal()), (q, k, v), grad_y)
    for ours, theirs in zip(torch.autograd.grad(y, (q, k, v), grad_y), expected):
        assert torch.equal(ours, theirs)


def test_create_graph_gradients_of_an_autocast_forward_are_the_math_kernels_under_it():
    """Forward under ``torch.autocast("cpu", torch.bfloat16)``, ``create_graph=True`` outside it: the
    first-order gradients are the math kernel's under bf16 autocast bit for bit (a plain-autograd
    reference run under that state). Fault: the recomputation run under the caller's state
    (``under_autocast(None)``): fp32 gradients, about 1e-3 off."""
    q, k, v = _flash_inputs(150, dtype=torch.float32)
    grad_y = _randn(1, 2, 5, 3, seed=155).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = softmax._fused_attention(q, k, v, attn_mask=_causal())
    grads = torch.autograd.grad(y, (q, k, v), grad_y, create_graph=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=_causal())
    expected = torch.autograd.grad(reference, (q, k, v), grad_y)
    for ours, theirs in zip(grads, expected):
        assert ours.dtype == torch.float32 and torch.equal(ours, theirs)


def test_a_second_backward_runs_under_the_forwards_fp16_autocast():
    """Forward under ``torch.autocast("cpu", torch.float16)`` (not the CPU default, bf16), two
    backwards outside it (``retain_graph=True`` first): both give plain SDPA's gradients under that
    autocast bit for bit. Fault: the saved state set again without its dtype (``dtype=None`` or
    left out): the rebuild ran under the default bf16, other gradients."""
    q, k, v = _flash_inputs(160, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.float16):
        y = softmax._fused_attention(q, k, v, attn_mask=_causal())
        plain = F.scaled_dot_product_attention(q, k, v, attn_mask=_causal())
    assert y.dtype == torch.float16 and torch.equal(y, plain)
    grad_y = _randn(*y.shape, seed=165).to(y.dtype)
    expected = torch.autograd.grad(plain, (q, k, v), grad_y)
    for retain in (True, False):
        for ours, theirs in zip(torch.autograd.grad(y, (q, k, v), grad_y, retain_graph=retain), expected):
            assert torch.equal(ours, theirs)


# --- the read of a cache the fused kernel cannot take (0444ca3), rerun after h-break15a-d ---------

def _huge_value_cache(P: int, d_key: int = 2):
    """fp32 q (1, 1, 2, d_key) and a cache of P keys whose values sum past fp32's largest float
    (columns ±0.6 × max), so the read goes to the explicit path."""
    m = torch.finfo(torch.float32).max * 0.6
    q, keys = _randn(1, 1, 2, d_key, seed=40), _randn(1, 1, P, d_key, seed=41)
    values = torch.tensor([m, -m]).expand(1, 1, P, 2).clone()
    return q, keys, values


def test_a_read_of_more_cached_keys_than_d_key_weighs_every_key():
    """The explicit read allows every query every cached key: its mask is (T_q, P). Fault:
    ``keys.shape[3]`` (d_key) for P, a mask of the wrong width (P = 3, d_key = 2: a shape error where
    the read is the parallel form's last outputs)."""
    q, keys, values = _huge_value_cache(P=3)
    y = softmax.softmax_read(q, keys, values)
    for t in range(2):  # each query placed after the cache, alone, in the recurrent form
        expected = softmax_recurrent(q[:, :, t:t + 1], keys[:, :, -1:], values[:, :, -1:],
                                     keys[:, :, :-1], values[:, :, :-1])[0]
        torch.testing.assert_close(y[:, :, t:t + 1], expected)
    assert torch.isfinite(y).all()


def test_the_read_mask_is_made_on_the_inputs_device(monkeypatch):
    """The explicit read's mask is asked for on q's device (on a GPU a CPU mask beside CUDA logits
    raises). A recorder of ``torch.ones`` sees the call. Faults: ``device=None`` or no device."""
    asked, ones = [], torch.ones

    def recorded(*args, **kwargs):
        asked.append(kwargs.get("device", "missing"))
        return ones(*args, **kwargs)

    q, keys, values = _huge_value_cache(P=3)
    monkeypatch.setattr(torch, "ones", recorded)
    softmax.softmax_read(q, keys, values)
    assert asked and all(d is not None and d != "missing" and torch.device(d) == q.device for d in asked), asked
