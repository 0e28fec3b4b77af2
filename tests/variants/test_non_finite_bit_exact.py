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
from fwbench.variants.kernels.softmax import softmax_parallel, softmax_read, softmax_recurrent

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


def _expanded_over_features(T: int = 3, d: int = 2) -> torch.Tensor:
    """One number per token broadcast over the key dimension: strides (…, 1, 0), not dense."""
    return torch.randn(1, 1, T, 1, generator=torch.Generator().manual_seed(0)).expand(1, 1, T, d)


def _overlapping(T: int = 12, d: int = 4) -> torch.Tensor:
    """Sliding windows of one sequence: token t's entry i is token t+1's entry i−1 (strides … 1, 1)."""
    return torch.randn(2, 2, T + d - 1, generator=torch.Generator().manual_seed(0)).unfold(-1, d, 1)


def _shares_expanded(x: torch.Tensor) -> torch.Tensor:
    shares = torch.zeros_like(x, dtype=torch.bool)
    shares[0, 0, 1, :] = True  # every entry of token 1 is one number
    return shares


def _shares_overlapping(x: torch.Tensor) -> torch.Tensor:
    t, i = torch.meshgrid(torch.arange(x.shape[2]), torch.arange(x.shape[3]), indexing="ij")
    shares = torch.zeros_like(x, dtype=torch.bool)
    shares[0, 0] = t + i == 2  # entry [1, 1] is sequence element 2
    return shares


@pytest.mark.parametrize(("make", "shares"), [(_expanded_over_features, _shares_expanded),
                                              (_overlapping, _shares_overlapping)], ids=["expanded", "overlapping"])
def test_zeroing_keeps_an_expanded_or_overlapping_layout(make, shares):
    """Break-it finding: ``clone`` returned a contiguous copy of an expanded or overlapping ``x``
    (strides (6, 6, 2, 1) for (3, 3, 1, 0)); an entry zeroed is zeroed in every element sharing it."""
    x = make()
    bad = torch.zeros_like(x, dtype=torch.bool)
    bad[0, 0, 1, 1] = True
    zeroed = zeroed_in_layout(x, bad)
    assert zeroed.stride() == x.stride()
    assert torch.equal(zeroed, x.masked_fill(shares(x), 0.0))
    assert (x != 0).all()  # x itself untouched


def test_softmax_before_a_nan_is_unchanged_with_an_expanded_query():
    """Break-it finding (AMD EPYC, MKL's AVX2 path): q = randn(1, 1, 3, 1).expand(1, 1, 3, 2) (one
    number per token broadcast over d_key), k, v random and v[2, 0] = NaN: output [1, 0] was
    -0.0961161330 against -0.0961161107 without the NaN, and [2, 1] (no NaN reaches it) -0.8049545288
    against -0.8049544692, because the fused kernel got a contiguous copy of q. Now bit for bit."""
    attention = variants.build_attention("softmax", d_key=2).eval()
    for T in (3, 12):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 1, T, 1, generator=g).expand(1, 1, T, 2)
        k, v = torch.randn(1, 1, T, 2, generator=g), torch.randn(1, 1, T, 2, generator=g)
        dirty = v.clone()
        dirty[0, 0, T - 1, 0] = float("nan")
        y, _ = attention(q, k, v, form="parallel")
        y_dirty, _ = attention(q, k, dirty, form="parallel")
        assert torch.equal(y_dirty[..., : T - 1, :], y[..., : T - 1, :])
        assert torch.equal(y_dirty[..., 1], y[..., 1])
        assert torch.isnan(y_dirty[0, 0, T - 1, 0])


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_softmax_before_a_nan_in_an_overlapping_input_is_unchanged(where):
    """The NaN sits in memory that several entries of an overlapping input share (a sliding-window
    view): the outputs before the first token it appears in are those without it, bit for bit."""
    attention = variants.build_attention("softmax", d_key=4).eval()
    g = torch.Generator().manual_seed(2)
    inputs = {name: torch.randn(2, 2, 12, 4, generator=g) for name in "qkv"}
    inputs[where] = _overlapping()
    base = torch.randn(2, 2, 15, generator=torch.Generator().manual_seed(0))
    base[0, 1, 8] = float("nan")  # entry 3 of token 5, entry 2 of token 6, …, entry 0 of token 8
    dirty = dict(inputs, **{where: base.unfold(-1, 4, 1)})
    y, _ = attention(**inputs, form="parallel")
    y_dirty, _ = attention(**dirty, form="parallel")
    y_recurrent, _ = attention(**dirty, form="recurrent")
    assert torch.equal(y_dirty[:, :, :5], y[:, :, :5]) and torch.equal(y_dirty[1], y[1])
    assert torch.equal(y_dirty[0, 0], y[0, 0])
    assert torch.equal(torch.isfinite(y_dirty), torch.isfinite(y_recurrent))
    assert not torch.isfinite(y_dirty[0, 1, 5:]).all()


def _small_softmax_inputs(dtype: torch.dtype, T: int = 8, P: int = 0):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.float32:  # the first draw of the break-it probe: the fp32 case after a bf16 and an fp16 one
        for _ in range(2):
            [torch.randn(1, 1, T, d, generator=g) for d in (4, 4, 1)]
    q, k, v = (torch.randn(1, 1, T, d, generator=g).to(dtype) for d in (4, 4, 1))
    caches = [torch.randn(1, 1, P, d, generator=g).to(dtype) for d in (4, 1)] if P else [None, None]
    return q, k, v, *caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_softmax_before_a_key_whose_logits_overflow_is_unchanged(dtype):
    """Break-it finding: a finite key of 3e38 in every entry at token 6 (d_key = 4, T = 8): the fused
    kernel adds the mask to the logits, and a masked logit q_5 · k_6 / 2 = +inf plus −inf is NaN, so
    output 5 (fp32; output 3 in bf16) was NaN, before the key; the outputs before it are now the
    clean ones bit for bit, and those from it on non-finite where the recurrent form's are."""
    attention = variants.build_attention("softmax", d_key=4).eval()
    q, k, v, _, _ = _small_softmax_inputs(dtype)
    huge = k.clone()
    huge[0, 0, 6] = 3e38
    y, _ = attention(q, k, v, form="parallel")
    y_huge, _ = attention(q, huge, v, form="parallel")
    y_recurrent, _ = attention(q, huge, v, form="recurrent")
    assert torch.equal(y_huge[..., :6, :], y[..., :6, :])
    assert torch.equal(torch.isfinite(y_huge), torch.isfinite(y_recurrent))
    assert not torch.isfinite(y_huge).all()  # the key overflows the logits of a later query


@pytest.mark.parametrize("window", [None, 2])
def test_softmax_with_an_overflowing_key_in_the_cache(window):
    """The huge key in the KV cache (P = 5, key 2), with a NaN value at new token 6: queries the
    window keeps away from both are the clean ones bit for bit, and no output is NaN that the
    recurrent form gives finite."""
    spec = "softmax" if window is None else f"softmax:window={window}"
    attention = variants.build_attention(spec, d_key=4).eval()
    q, k, v, k_cache, v_cache = _small_softmax_inputs(torch.float32, P=5)
    state = variants.KVCacheState(k_cache, v_cache, 5)
    huge_cache = k_cache.clone()
    huge_cache[0, 0, 2] = 3e38
    dirty_v = v.clone()
    dirty_v[0, 0, 6, 0] = float("nan")
    huge_state = variants.KVCacheState(huge_cache, v_cache, 5)
    y, _ = attention(q, k, v, state=state, form="parallel")
    y_dirty, _ = attention(q, k, dirty_v, state=huge_state, form="parallel")
    y_recurrent, _ = attention(q, k, dirty_v, state=huge_state, form="recurrent")
    assert torch.equal(torch.isfinite(y_dirty), torch.isfinite(y_recurrent))
    if window is None:
        assert not torch.isfinite(y_dirty).all()
    else:  # key 2 is seen by no new query (global positions 5…12), the NaN from token 6 on
        assert torch.equal(y_dirty[..., :6, :], y[..., :6, :])
        assert torch.isfinite(y_dirty[..., :6, :]).all() and torch.isnan(y_dirty[..., 6:8, :]).all()


def test_softmax_with_a_query_whose_logits_overflow_changes_that_query_only():
    attention = variants.build_attention("softmax", d_key=4).eval()
    q, k, v, _, _ = _small_softmax_inputs(torch.float32)
    huge = q.clone()
    huge[0, 0, 3] = 3e38
    y, _ = attention(q, k, v, form="parallel")
    y_huge, _ = attention(huge, k, v, form="parallel")
    y_recurrent, _ = attention(huge, k, v, form="recurrent")
    others = torch.arange(8) != 3
    assert torch.equal(y_huge[..., others, :], y[..., others, :])
    assert torch.equal(torch.isfinite(y_huge), torch.isfinite(y_recurrent))


@pytest.mark.parametrize("where", ["q", "k"])
def test_softmax_with_an_overflowing_entry_in_an_overlapping_input(where):
    """Break-it finding: q or k sliding windows of one sequence (unfold, d_key = 4, T = 12), sequence
    element 9 = 3e38 (entry 3 of token 6 … entry 0 of token 9): whole rows 6…9 were zeroed in the
    memory they share with tokens 3…5 and 10, 11, so (k) outputs 3, 4, 5 were 0.2139, -0.1094,
    -0.3227 against 0.2188, -0.1722, -0.3590 without the huge entry, and (q) outputs 3, 4, 5, 10, 11
    changed likewise; now the outputs no huge entry reaches are bit for bit those without it."""
    attention = variants.build_attention("softmax", d_key=4).eval()
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 1, 15, generator=g)
    inputs = {"q": torch.randn(1, 1, 12, 4, generator=g), "k": torch.randn(1, 1, 12, 4, generator=g),
              "v": torch.randn(1, 1, 12, 1, generator=g)}
    inputs[where] = base.unfold(-1, 4, 1)
    huge = base.clone()
    huge[0, 0, 9] = 3e38
    dirty = dict(inputs, **{where: huge.unfold(-1, 4, 1)})
    y, _ = attention(**inputs, form="parallel")
    y_dirty, _ = attention(**dirty, form="parallel")
    y_recurrent, _ = attention(**dirty, form="recurrent")
    reached = torch.arange(12) >= 6 if where == "k" else (torch.arange(12) >= 6) & (torch.arange(12) <= 9)
    assert torch.equal(y_dirty[..., ~reached, :], y[..., ~reached, :])
    assert torch.equal(torch.isfinite(y_dirty), torch.isfinite(y_recurrent))
    assert not torch.isfinite(y_dirty).all()


def test_softmax_with_an_overflowing_key_shared_by_heads():
    """Break-it finding: one key sequence expanded over 2 heads (multi-query attention), k[6] = 1e19
    in every entry, head 0's queries scaled by 1e20 (its logits with key 6 overflow), head 1's
    randn: key 6 was zeroed for head 1 too (one memory entry), and head 1's outputs 6 and 7 were
    0.2096 and -0.1208 against the recurrent form's 0.7813 and -0.1973; now within rounding."""
    attention = variants.build_attention("softmax", d_key=4).eval()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 8, 4, generator=g)
    q[0, 0] *= 1e20
    k = torch.randn(1, 1, 8, 4, generator=g)
    k[0, 0, 6] = 1e19
    k = k.expand(1, 2, 8, 4)
    v = torch.randn(1, 2, 8, 1, generator=g)
    y, _ = attention(q, k, v, form="parallel")
    y_recurrent, _ = attention(q, k, v, form="recurrent")
    torch.testing.assert_close(y[0, 1], y_recurrent[0, 1])
    assert torch.equal(torch.isfinite(y), torch.isfinite(y_recurrent))


@pytest.mark.parametrize("form", ["recurrent", "parallel"])
def test_softmax_fp16_logits_past_65504_stay_finite(form):
    """Break-it finding: fp16, d_key = 4, T = 8, q[5] = 65504 in every entry (finite; its logits,
    about 1e5, are past fp16's largest value but not fp32's): the recurrent form, and the parallel
    form's explicit path (taken here for k[2, 0] = -inf, whose weight is exactly 0 for a positive
    query), formed the logits in fp16, so output 5 was NaN; the fused kernel forms them in fp32.
    Now every form computes fp16 and bf16 in fp32: output 5 is the fp32 computation's, rounded."""
    attention = variants.build_attention("softmax", d_key=4).eval()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 8, d, generator=g) for d in (4, 4, 2))
    q[0, 0, 5] = 65504.0
    k[0, 0, 2, 0] = float("-inf")
    y, _ = attention(q.half(), k.half(), v.half(), form=form)
    expected, _ = attention(q.half().float(), k.half().float(), v.half().float(), form="recurrent")
    assert y.dtype == torch.float16
    assert torch.isfinite(expected[..., 5, :]).all()
    torch.testing.assert_close(y[..., 5, :], expected[..., 5, :].half(), atol=2e-3, rtol=2e-3)
    assert torch.equal(torch.isnan(y), torch.isnan(expected))


@pytest.mark.parametrize(("dtype", "key", "query"), [(torch.float32, 1e19, 1e20), (torch.float64, 1e154, 1e155)],
                         ids=["fp32", "float64"])
def test_softmax_a_huge_later_query_leaves_the_earlier_outputs_bit_for_bit(dtype, key, query):
    """Break-it finding (h-break14t): key 0 = 1e19 in every entry (its logits with randn queries are
    finite), then query 5 = 1e20 (its logit with key 0 overflows): key 0 was marked against the
    largest query of the whole sequence, so outputs 0–4 left the fused kernel and moved by 1.19e-7
    (fp32; 2.2e-16 in float64 with 1e154 and 1e155). Whether an output is the fused kernel's now
    depends on no later token."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 8, 4, generator=g, dtype=dtype) for _ in range(3))
    k[..., 0, :] = key
    y, _, _ = softmax_parallel(q, k, v)
    q_later = q.clone()
    q_later[..., 5, :] = query
    y_later, _, _ = softmax_parallel(q_later, k, v)
    y_recurrent, _, _ = softmax_recurrent(q_later, k, v)
    assert torch.equal(y_later[..., :5, :], y[..., :5, :])
    assert torch.equal(torch.isfinite(y_later), torch.isfinite(y_recurrent))


@pytest.mark.parametrize(("window", "P"), [(None, 0), (3, 0), (None, 3), (3, 3)])
def test_softmax_outputs_before_a_huge_token_are_bit_for_bit_whatever_it_holds(window, P):
    """A causality probe that reaches the overflow guard: for every token t and every way of making
    it huge (its query ×1e20, its key ×1e20, or both), beside a key of 1e19 at every earlier token j,
    the outputs before t are those with token t as drawn, bit for bit."""
    g = torch.Generator().manual_seed(3)
    T = 6
    q, k, v = (torch.randn(2, 2, T, 4, generator=g) for _ in range(3))
    k_cache, v_cache = (torch.randn(2, 2, P, 4, generator=g) for _ in range(2)) if P else (None, None)
    for j in range(T):
        base_k = k.clone()
        base_k[:, 0, j] = 1e19
        y, _, _ = softmax_parallel(q, base_k, v, k_cache, v_cache, window)
        for t in range(j + 1, T):
            for huge in ("q", "k", "qk"):
                q_t, k_t = q.clone(), base_k.clone()
                if "q" in huge:
                    q_t[:, :, t] *= 1e20
                if "k" in huge:
                    k_t[:, :, t] *= 1e20
                y_t, _, _ = softmax_parallel(q_t, k_t, v, k_cache, v_cache, window)
                assert torch.equal(y_t[:, :, :t], y[:, :, :t]), (j, t, huge)


def test_softmax_a_huge_query_leaves_every_other_output_bit_for_bit():
    """Break-it finding (h-break14v, of 4bb05a3): a query of 3e38 at token 21 (fp32, B = H = 2,
    T = 64, d_key = 16) overflows its masked logits with every later key, and each such future pair
    marked the key: outputs 22-63 left the fused kernel and moved by up to 4.8e-7, though none of them
    reads query 21 (before 4bb05a3 only output 21 changed). Each row's fused call now breaks a future
    pair on the side that row does not read."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 16, generator=g) for _ in range(3))
    huge = q.clone()
    huge[:, :, 21] = 3e38
    y, _, _ = softmax_parallel(q, k, v)
    y_huge, _, _ = softmax_parallel(huge, k, v)
    others = torch.arange(64) != 21
    assert torch.equal(y_huge[:, :, others], y[:, :, others])
    assert torch.isnan(y_huge[:, :, 21]).all()


@pytest.mark.parametrize("P", [0, 2])
def test_softmax_outputs_before_a_huge_key_stay_bit_for_bit_beside_other_overflowing_pairs(P):
    """Several future pairs overflow: query 0 (×1e20) with key 1 (1e19 in every entry), and, once
    key 4 is 3e38, every query before it with key 4. Row 2 reads key 1 and has key 4 as a future
    partner: its fused call keeps key 1 and its own query (and breaks both pairs on their other
    side), so outputs 0-3 are those with key 4 as drawn, bit for bit."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    k_cache, v_cache = (torch.randn(1, 2, P, 4, generator=g) for _ in range(2)) if P else (None, None)
    q[:, :, 0] *= 1e20
    k[:, :, 1] = 1e19
    y, _, _ = softmax_parallel(q, k, v, k_cache, v_cache)
    huge = k.clone()
    huge[:, :, 4] = 3e38
    y_huge, _, _ = softmax_parallel(q, huge, v, k_cache, v_cache)
    y_recurrent, _, _ = softmax_recurrent(q, huge, v, k_cache, v_cache)
    assert torch.equal(y_huge[:, :, :4], y[:, :, :4])
    assert torch.equal(torch.isfinite(y_huge), torch.isfinite(y_recurrent))
    # outputs 1-3 read neither query 0 nor key 4: the fused kernel's (4bb05a3 marked key 1, and took them
    # from the explicit product)
    quiet_q = q.clone()
    quiet_q[:, :, 0] = 0
    keys, values = (x if c is None else torch.cat([c, x], dim=2) for x, c in ((k, k_cache), (v, v_cache)))
    mask = torch.ones(8, P + 8, dtype=torch.bool).tril(P)
    fused = torch.nn.functional.scaled_dot_product_attention(quiet_q, keys, values, attn_mask=mask)
    assert torch.equal(y_huge[:, :, 1:4], fused[:, :, 1:4])


@pytest.mark.parametrize("P", [0, 5])
def test_softmax_outputs_whose_window_has_passed_a_huge_key_stay_bit_for_bit(P):
    """Break-it finding (h-break14v, of 4bb05a3): window 8, key 20 = 3e38 (fp32, B = H = 2, T = 64,
    d_key = 16): a pair of the key with a query whose window had passed it (masked, but the fused
    kernel adds the mask to the logit) marked the query, so outputs 28-63 left the fused kernel and
    moved by up to 2.4e-7, though none of them reads key 20. Now only outputs 20-27 change."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 16, generator=g) for _ in range(3))
    k_cache, v_cache = (torch.randn(2, 2, P, 16, generator=g) for _ in range(2)) if P else (None, None)
    huge = k.clone()
    huge[:, :, 20] = 3e38
    y, _, _ = softmax_parallel(q, k, v, k_cache, v_cache, 8)
    y_huge, _, _ = softmax_parallel(q, huge, v, k_cache, v_cache, 8)
    far = torch.arange(64) >= 28
    assert torch.equal(y_huge[:, :, far], y[:, :, far]) and torch.equal(y_huge[:, :, :20], y[:, :, :20])
    assert not torch.isfinite(y_huge[:, :, 20:28]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["fp32", "bf16", "float64"])
def test_softmax_values_whose_sum_passes_the_largest_float_are_weighed_as_in_the_recurrent_form(dtype):
    """Break-it finding (h-break14w): values [[m, −m], [m, −m]] with m = 0.6 × the dtype's largest
    float and equal logits: the fused kernel sums exp(logit − max) · v before it divides by the
    weights' sum, so output 1 was [inf, −inf] against the recurrent form's [m, −m]; the values' plain
    sum, 0, passed the check. Also on the non-finite path (a NaN key later), and the outputs before a
    huge value stay the fused kernel's bit for bit."""
    m = torch.finfo(dtype).max * 0.6
    q, k = torch.zeros(1, 1, 3, 2, dtype=dtype), torch.zeros(1, 1, 3, 2, dtype=dtype)
    v = torch.tensor([[m, -m], [m, -m], [1.0, 2.0]], dtype=torch.float64).to(dtype).view(1, 1, 3, 2)
    y_recurrent, _, _ = softmax_recurrent(q, k, v)
    assert torch.isfinite(y_recurrent).all()
    for keys in (k, torch.cat([k[:, :, :2], torch.full_like(k[:, :, 2:], float("nan"))], dim=2)):
        y, _, _ = softmax_parallel(q, keys, v)
        torch.testing.assert_close(y[:, :, :2], y_recurrent[:, :, :2])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4, generator=g).to(dtype) for _ in range(3))
    huge = v.clone()
    huge[:, :, 4:6] = m
    y, _, _ = softmax_parallel(q, k, v)
    y_huge, _, _ = softmax_parallel(q, k, huge)
    y_recurrent, _, _ = softmax_recurrent(q, k, huge)
    assert torch.equal(y_huge[:, :, :4], y[:, :, :4])
    loose = {"rtol": 0.05, "atol": 0.01} if dtype == torch.bfloat16 else {}  # fused and recurrent round apart
    torch.testing.assert_close(y_huge, y_recurrent, **loose)


def _gradients(kernel, inputs, window, before):
    """Gradients of a weighted sum of the outputs before token ``before`` w.r.t. q, k, v."""
    q, k, v = (x.clone().requires_grad_() for x in inputs)
    y, _, _ = kernel(q, k, v, None, None, window)
    weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    (y[:, :, :before] * weight[:, :, :before]).sum().backward()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_softmax_gradients_of_the_outputs_before_a_non_finite_token_are_the_recurrent_forms(where, bad, window):
    """Break-it finding (h-break14w): one non-finite entry at token 3 (fp32, B = 1, H = 2, T = 6,
    d = 3), a loss on outputs 0-2: the explicit product's backward multiplied the masked pairs' exact
    zero gradients by the inf or NaN (0 · inf = NaN), so a key of inf gave NaN gradients to queries
    0-2, a NaN query to keys 4 and 5 (and, with the window, key 0), and a NaN row's masked weights to
    values 4 and 5, where the recurrent form's gradients are finite. Now every gradient the recurrent
    form gives finite is finite and agrees with it."""
    g = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn(1, 2, 6, 3, generator=g) for name in "qkv"}
    inputs[where][0, 0, 3, 1] = bad
    parallel = _gradients(softmax_parallel, inputs.values(), window, 3)
    recurrent = _gradients(softmax_recurrent, inputs.values(), window, 3)
    for name, ours, theirs in zip("qkv", parallel, recurrent):
        finite = torch.isfinite(theirs)
        assert torch.isfinite(ours[finite]).all(), name
        torch.testing.assert_close(ours[finite], theirs[finite])


@pytest.mark.parametrize("scale", [3e38, 1e37, 1e20])
def test_softmax_gradients_of_the_outputs_before_a_huge_value_are_the_recurrent_forms(scale):
    """Break-it finding (h-break14w): v[3] = ``scale`` in every entry (fp32, T = 4, d = 3), a loss on
    outputs 0-2: the fused kernel's backward forms dO_t · v_3 for the masked pairs too, 9e38 = inf,
    times their zero weight NaN, so queries 0-2 (and key 3) had NaN gradients where the recurrent
    form's are finite (1e37: the check let the values through; 3e38 on the explicit path, whose fused
    call kept them). Values past √ of the logit limit (1.3e19) now leave the fused kernel; 1e20 is
    weighed by the explicit product alone."""
    g = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn(1, 1, 4, 3, generator=g) for name in "qkv"}
    inputs["v"][0, 0, 3] = scale
    weight = torch.ones(1, 1, 4, 3)
    weight[:, :, 1:] = 40.0  # a gradient dO of 40: 40 × 3 × 1e37 overflows fp32
    grads = []
    for kernel in (softmax_parallel, softmax_recurrent):
        q, k, v = (x.clone().requires_grad_() for x in inputs.values())
        y, _, _ = kernel(q, k, v)
        (y[:, :, :3] * weight[:, :, :3]).sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    for name, ours, theirs in zip("qkv", *grads):
        assert torch.isfinite(theirs).all(), name
        torch.testing.assert_close(ours, theirs, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_gradients_when_every_row_is_explicit_beside_an_overflowing_masked_pair(dtype):
    """Break-it finding (h-break14x): key 0 (a cache) = [inf, 0] is read by every query with a logit
    of −inf (weight 0, outputs finite), so every row is the explicit product's, and key 3 = [0, 3e38]
    (1e308 in float64) overflows against the earlier queries (masked pairs, +inf) and query 3 (−inf).
    With every row explicit no fused call broke the masked pairs: the one fused call (its output
    unused) held a logit of inf + (−inf) = NaN, and its backward sent NaN into the gradients of every
    key and value (0 · NaN); the recurrent form's are finite. Now that call's queries with a masked
    overflowing pair are zeroed."""
    big = 3e38 if dtype == torch.float32 else 1e308
    k_cache = torch.tensor([[[[float("inf"), 0.0]]]], dtype=dtype)
    v_cache = torch.tensor([[[[5.0, -5.0]]]], dtype=dtype)
    inputs = [torch.tensor([[x]], dtype=dtype) for x in (
        [[-1.0, 2.0], [-1.0, 2.0], [-1.0, -2.0]], [[0.3, -0.2], [0.1, 0.4], [0.0, big]], [[1.0, 0.0], [2.0, 1.0], [3.0, -1.0]])]
    grads = []
    for kernel in (softmax_parallel, softmax_recurrent):
        q, k, v = (x.clone().requires_grad_() for x in inputs)
        y, _, _ = kernel(q, k, v, k_cache, v_cache)
        assert torch.isfinite(y).all()
        y.sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    for name, ours, theirs in zip("qkv", *grads):
        finite = torch.isfinite(theirs)
        assert torch.isfinite(ours[finite]).all(), name
        torch.testing.assert_close(ours[finite], theirs[finite], msg=name)
    assert torch.isfinite(grads[1][1]).all() and torch.isfinite(grads[1][2]).all()  # keys' and values' all finite


@pytest.mark.parametrize("layout", ["unfold", "head-stride-1"])
def test_softmax_with_an_overlapping_query_equals_the_recurrent_form(layout):
    """Break-it finding (h-break14x): torch's CPU fused kernel reads a query whose elements overlap
    wrongly: q = sliding windows of one sequence (``unfold``, T = 3, d_key = 4, strides (…, 1, 1)) gave
    outputs of 3e38 and NaN against the recurrent form's of about 1, and q with a head stride of 1
    (H = 2, T = 5) outputs 1.96 off. The earlier overlapping tests compared the parallel form with
    itself only. Now the fused kernel gets a dense copy of such a query (every fused call, so the
    outputs before a NaN stay bit for bit)."""
    g = torch.Generator().manual_seed(0)
    if layout == "unfold":
        q = torch.randn(1, 2, 6, generator=g).unfold(-1, 4, 1)
    else:
        q = torch.randn(400, generator=g).as_strided((1, 2, 5, 4), (40, 1, 4, 1))
    k, v = (torch.randn(q.shape, generator=g) for _ in range(2))
    y, _, _ = softmax_parallel(q, k, v)
    torch.testing.assert_close(y, softmax_recurrent(q, k, v)[0])
    torch.testing.assert_close(softmax_read(q, k, v), softmax_read(q.contiguous(), k, v))
    dirty = v.clone()
    dirty[0, 1, -1, 0] = float("nan")
    y_dirty, _, _ = softmax_parallel(q, k, dirty)
    assert torch.equal(y_dirty[:, :, :-1], y[:, :, :-1]) and torch.equal(y_dirty[0, 0], y[0, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["fp32", "bf16", "float64"])
def test_softmax_read_weighs_values_whose_sum_passes_the_largest_float_as_the_parallel_form(dtype):
    """Break-it finding (h-break15a): the read (``SoftmaxAttention.read``/``write_read``, the retrieval
    tasks' softmax read in the parallel and chunk forms) called the fused kernel on any input, without
    the check the parallel form makes (7f11762): a cache of values [[m, −m], [m, −m]], m = 0.6 × the
    dtype's largest float, equal logits, read [inf, −inf] where the parallel form's last output is
    [m, −m] (fp32: 2.04e38); random reads with huge or non-finite entries: 12 of 400 outputs or
    gradients non-finite where the explicit softmax's are finite. Now such inputs are read as the
    parallel form reads them, and other reads stay the fused kernel's bit for bit."""
    m = torch.finfo(dtype).max * 0.6
    attention = variants.build_attention("softmax", d_key=2)
    k = torch.zeros(1, 1, 2, 2, dtype=dtype)
    v = torch.tensor([[m, -m], [m, -m]], dtype=torch.float64).to(dtype).view(1, 1, 2, 2).requires_grad_()
    q = torch.zeros(1, 1, 1, 2, dtype=dtype)
    expected = softmax_parallel(torch.zeros_like(k), k, v)[0][:, :, -1:]
    for y in (attention.read(q, attention.write(k, v)), attention.write_read(k, v, q)):
        torch.testing.assert_close(y, expected)
        (grad,) = torch.autograd.grad(y.sum(), v)
        torch.testing.assert_close(grad, torch.full_like(grad, 0.5))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g).to(dtype) for _ in range(3))
    assert torch.equal(softmax_read(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("dtype, big", [(torch.float16, 40000.0), (torch.float32, 3e38)], ids=["fp16", "fp32"])
@pytest.mark.parametrize("d_v", [2, 3], ids=["flash", "math"])
def test_softmax_read_of_an_empty_cache_is_zero_for_finite_queries_whose_sum_overflows(dtype, big, d_v):
    """Break-it finding (h-break15b): a read of an empty cache (P = 0) called torch's kernel, which
    answers an empty call with 0 · (Σq + Σk + Σv): finite queries whose entries sum past the largest
    float (fp16 [40000, 30000] in one head; fp32 [3e38, 1.5e38]) made every output of every head NaN,
    where the read of an empty cache is the empty sum, 0 (as 0444ca3 made it for a NaN query). Now 0
    for every query, clean or not, with zero gradients, and second derivatives."""
    attention = variants.build_attention("softmax", d_key=2)
    k, v = torch.zeros(1, 2, 0, 2, dtype=dtype), torch.zeros(1, 2, 0, d_v, dtype=dtype, requires_grad=True)
    q = torch.tensor([[[[big, 0.75 * big]], [[0.5, 0.5]]]], dtype=dtype, requires_grad=True)
    for y in (attention.read(q, attention.write(k, v)), attention.write_read(k, v, q)):
        assert torch.equal(y, torch.zeros(1, 2, 1, d_v, dtype=dtype))
        assert torch.equal(torch.autograd.grad(y.sum(), q)[0], torch.zeros_like(q))
    dirty = q.detach().clone()
    dirty[0, 1, 0, 0] = float("nan")  # the other head's query NaN: the unsafe path's fused call
    assert torch.equal(softmax_read(dirty, k, v), torch.zeros(1, 2, 1, d_v, dtype=dtype))
    q64, v64 = (x.detach().double().requires_grad_() for x in (q, v))
    assert torch.autograd.gradgradcheck(lambda q, v: softmax_read(q, k.double(), v), (q64, v64))
