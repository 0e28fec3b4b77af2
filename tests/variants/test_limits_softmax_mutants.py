"""Values that the surviving mutants of the mutation pass of 6 December 2026 changed and no other test
saw: the dtype-aware floor of the sum normalisation, the feature maps' parameter checks, the softmax
kernels' overflow marks and fused-kernel guard, and the helpers they use (``docs/mutation.md``, section
"Results: limits, softmax and code changed since c160d1b"). Each test names the fault and the right
value; references are a float64 loop, hand-worked numbers, or (where the contract is "bit for bit")
the fused kernel's own rows on inputs that differ only where those rows do not look.

Bit-for-bit checks: an output row that no non-finite or overflowing entry reaches is the fused
kernel's (``scaled_dot_product_attention``) exactly; the explicit form rounds differently (on
random fp32 inputs 188 of 256 entries differ), so a mark that wrongly reaches a row moves its bits.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from fwbench.variants.feature_maps import DPFP, Favor, sum_normalize
from fwbench.variants.kernels import precision, softmax
from fwbench.variants.kernels.softmax import _causal_mask, _overflowing, _shares_memory, softmax_parallel

FP32_LIMIT = torch.finfo(torch.float32).max / 2  # = (2^24 - 1)·2^103 exactly


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _reference(q, k, v, window=None):
    """Causal softmax attention by a float64 loop over queries and keys (no cache)."""
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    B, H, T, d = q.shape
    y = torch.zeros(B, H, T, v.shape[-1], dtype=torch.float64)
    for b, h, t in itertools.product(range(B), range(H), range(T)):
        keys = range(0 if window is None else max(0, t - window + 1), t + 1)
        logits = torch.stack([q[b, h, t] @ k[b, h, j] / math.sqrt(d) for j in keys])
        weights = torch.softmax(logits, dim=0)
        y[b, h, t] = sum(w * v[b, h, j] for w, j in zip(weights, keys))
    return y


def _fused(q, k, v):
    """The fused kernel on the same inputs: the bit-for-bit contract of rows nothing reaches."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_mask(q.shape[2], 0, None, q.device))


# --- feature maps: the floor of the sum normalisation and the parameter checks ---------------------


def test_sum_normalize_floors_at_its_dtypes_floor_or_the_floor_given():
    """Σφ is floored at the compute dtype's floor (1e-30 fp32, 1e-300 float64) unless a floor is
    given. Faults: the floor taken for no dtype (fp32's 1e-30 in float64: φ = [1e-100, 3e-100] would
    read [1e-70, 3e-70] instead of [0.25, 0.75]); a given floor ignored (φ = [0.1, 0.15], floor 0.5:
    [0.2, 0.3], not [0.4, 0.6])."""
    tiny = torch.tensor([1e-100, 3e-100], dtype=torch.float64)
    assert torch.allclose(sum_normalize(tiny), torch.tensor([0.25, 0.75], dtype=torch.float64), rtol=1e-15, atol=0)
    small32 = torch.tensor([1e-35, 3e-35])  # Σφ = 4e-35 < 1e-30: divided by the floor
    assert torch.allclose(sum_normalize(small32), torch.tensor([1e-5, 3e-5]), rtol=1e-6, atol=0)
    given = torch.tensor([0.1, 0.15], dtype=torch.float64)
    assert torch.allclose(sum_normalize(given, floor=0.5), torch.tensor([0.2, 0.3], dtype=torch.float64),
                          rtol=1e-15, atol=0)
    assert torch.allclose(sum_normalize(torch.tensor([0.1, 0.15]), floor=0.5), torch.tensor([0.2, 0.3]),
                          rtol=1e-6, atol=0)


def test_dpfp_check_parameters_defaults_nu_to_one():
    """``DPFP.check_parameters(d_key)`` checks the default ν = 1: d_key 1 allows ν < 2, so it passes
    (a default ν of 2 refused a spec 'dpfp' at d_key 1: '[1, 1]'); ν = 2 at d_key 1 is refused."""
    DPFP.check_parameters(1)
    with pytest.raises(ValueError, match=r"nu: got 2; expected an integer in \[1, 1\]"):
        DPFP.check_parameters(1, 2)


def test_favor_refuses_too_many_features_with_the_whole_reason():
    """m past 2^16 is refused with the reason, word for word (the message was mutated to
    'XX…XX' and to upper case)."""
    with pytest.raises(ValueError) as caught:
        Favor.check_parameters(8, 2**16 + 1)
    assert str(caught.value) == ("m: got 65537; expected an integer in [1, 65536] (FAVOR+'s overflow window "
                                 "holds for at most that many random features)")


# --- softmax_recurrent: the compute dtype is the widest of q, k and v -------------------------------


@pytest.mark.parametrize("wide", ["q", "k", "v"])
def test_softmax_recurrent_computes_in_float64_when_any_input_is(wide):
    """One float64 input among fp32 ones makes the recurrent form compute in float64 (as the
    compute dtype says). Faults: one of q, k, v left out of ``compute_dtype``: its float64 digits
    are then cut to fp32. Hand-worked: d_key 2, key 0 = 0, key 1 = (2^30, −2^30) and query 1 =
    (1 + 2^-30, 1) give the logit 2^30·2^-30/√2 = 1/√2 in float64 but 0 once the query is fp32; so
    output 1 = v·softmax([0, 1/√2]) = sigmoid(1/√2) = 0.669762 with v = (0, 1), not 0.5 (q or k
    swapped alike); a float64 value 1 + 2^-30 read alone comes back as itself, not 1."""
    f32, f64 = torch.float32, torch.float64
    big, fine = 2.0**30, 1 + 2.0**-30
    if wide == "v":
        q = torch.zeros(1, 1, 1, 2, dtype=f32)
        k = torch.zeros(1, 1, 1, 2, dtype=f32)
        v = torch.full((1, 1, 1, 1), fine, dtype=f64)
        y = softmax.softmax_recurrent(q, k, v)[0]
        assert y.dtype == f64 and y.item() == fine
        return
    fine_rows = torch.tensor([[1.0, 1.0], [fine, 1.0]], dtype=f64)  # token 1: (1 + 2^-30, 1)
    power_rows = torch.tensor([[0.0, 0.0], [big, -big]], dtype=f64)  # token 1: (2^30, -2^30)
    if wide == "q":
        q, k = fine_rows[None, None], power_rows.to(f32)[None, None]
    else:
        q, k = power_rows.to(f32)[None, None], fine_rows[None, None]
    v = torch.tensor([[0.0], [1.0]], dtype=f32)[None, None]
    y = softmax.softmax_recurrent(q, k, v)[0]
    expected = 1 / (1 + math.exp(-1 / math.sqrt(2)))  # softmax([0, 1/√2]) · (0, 1)
    assert y.dtype == f32
    assert abs(y[0, 0, 1, 0].item() - expected) < 1e-6 and abs(expected - 0.669762) < 1e-6


# --- helpers: which layouts share memory, and where the zeroing's index is made --------------------


def _shares_by_brute_force(x: torch.Tensor) -> bool:
    """Whether two elements of x read one memory offset, by listing every element's offset."""
    offsets = [sum(i * s for i, s in zip(index, x.stride())) for index in itertools.product(*map(range, x.shape))]
    return len(offsets) != len(set(offsets))


LAYOUTS = {
    "contiguous": lambda: torch.zeros(2, 3, 4),
    "transposed": lambda: torch.zeros(2, 3, 4).transpose(0, 2),
    "sliced with gaps": lambda: torch.zeros(4, 6)[::2, ::3],
    "a size-1 dim of stride 0": lambda: torch.zeros(1, 1, 3, 2).expand(1, 4, 3, 2)[:, :1],
    "expanded over heads": lambda: torch.zeros(1, 1, 3, 2).expand(1, 2, 3, 2),
    "windows of stride 1": lambda: torch.zeros(8).unfold(0, 3, 1),
    "windows overlapping by one": lambda: torch.zeros(5).as_strided((2, 3), (2, 1)),
    "third stride inside the reach of two": lambda: torch.zeros(40).as_strided((4, 3, 2), (1, 4, 10)),
    "third stride just past the reach": lambda: torch.zeros(40).as_strided((4, 3, 2), (1, 4, 12)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shares_memory_agrees_with_listing_every_offset(layout):
    """``_shares_memory`` answers whether two elements read one memory entry, as listing every
    element's offset does. Faults: dimensions of size 1 counted (a stride-0 size-1 dim read as
    sharing); the reach set to the last dimension's extent instead of summed ((4, 3, 2) strides
    (1, 4, 10): offset 10 is read twice, the reach 3 + 8 = 11 covers it, 8 alone does not); each
    extent one short (strides (1, 2) sizes (3, 2): offset 2 read twice)."""
    x = LAYOUTS[layout]()
    assert _shares_memory(x) == _shares_by_brute_force(x)


def test_zeroed_in_layout_makes_its_memory_index_on_the_tensors_device(monkeypatch):
    """An expanded x is zeroed through an index of its memory made on x's device (a recorder of
    ``torch.arange``'s device stands in for a GPU, where an index on the CPU is refused); the
    zeroing itself: the memory entry a bad element reads is 0 for every element sharing it."""
    asked = []
    arange = torch.arange

    def recording_arange(*args, **kwargs):
        asked.append(kwargs.get("device"))
        return arange(*args, **kwargs)

    x = torch.tensor([[1.0], [2.0], [3.0]]).expand(3, 2)  # strides (1, 0)
    bad = torch.tensor([[False, False], [True, True], [False, False]])
    monkeypatch.setattr(precision.torch, "arange", recording_arange)
    zeroed = precision.zeroed_in_layout(x, bad)
    assert asked == [x.device]
    assert zeroed.stride() == x.stride() and zeroed.tolist() == [[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]]


def test_overflow_marks_are_made_on_the_inputs_device():
    """The marks of q and keys, and the masked pairs that may overflow, on another device (meta,
    standing in for a GPU) are made there (one made on the CPU is refused beside meta)."""
    q, k = torch.empty(1, 2, 3, 4, device="meta"), torch.empty(1, 2, 5, 4, device="meta")
    allowed = torch.empty(1, 2, 3, 5, dtype=torch.bool, device="meta")
    huge_q, huge_k, masked = _overflowing(q, k, allowed)
    assert (huge_q.device.type, huge_k.device.type, masked.device.type) == ("meta", "meta", "meta")
    assert huge_q.shape == q.shape and huge_k.shape == k.shape and masked.shape == allowed.shape


# --- the fused-kernel guard and the logit limit -----------------------------------------------------


def test_a_single_query_whose_logit_with_a_key_outside_its_window_overflows():
    """One query q = 1e30 (d_key 1, so ‖Q‖ = 1e30 exactly), a cached key 1e9 outside its window of 1
    and its own key 1: the masked logit 1e39 overflows fp32, and the fused kernel adds the mask to it
    (inf − inf = NaN). Faults: the guard judged ‖K‖·‖K‖ (1e18) or ‖Q‖·Σv (Σv = 2 − 3 < 0) instead of
    ‖Q‖·‖K‖ (1e39 > 1.7e38): the fused kernel ran and the output was NaN. Right value: the query sees
    only its own key, so the output is its value, −3, exactly."""
    q, k = torch.full((1, 1, 1, 1), 1e30), torch.ones(1, 1, 1, 1)
    k_cache, v_cache, v = torch.full((1, 1, 1, 1), 1e9), torch.full((1, 1, 1, 1), 2.0), torch.full((1, 1, 1, 1), -3.0)
    y = softmax_parallel(q, k, v, k_cache=k_cache, v_cache=v_cache, window=1)[0]
    assert y.item() == -3.0


def test_a_masked_logit_between_the_limit_and_twice_it_is_kept_from_the_fused_kernel():
    """d_key 1, q_0 = k_1 = 2e19: the masked logit q_0·k_1 = 4e38 overflows fp32 (max 3.4e38) while
    ‖Q‖‖K‖ ≈ 4e38 is below twice the largest value. Fault: the logit limit taken as max·2 instead of
    max/2: the fused kernel ran and output 0 was NaN. Right values: output 0 = v_0 (its only key);
    output 1 = v_1 (q_1·k_1 = 2e19 against q_1·k_0 = 1: all the weight on key 1)."""
    q = torch.tensor([2e19, 1.0]).view(1, 1, 2, 1)
    k = torch.tensor([1.0, 2e19]).view(1, 1, 2, 1)
    v = torch.tensor([[0.25, -1.5], [3.0, 0.5]]).view(1, 1, 2, 2)
    y = softmax_parallel(q, k, v)[0]
    assert y[0, 0].tolist() == [[0.25, -1.5], [3.0, 0.5]]


def test_an_empty_batch_gives_an_empty_output():
    """B = 0 (and H = 0): the guard's empty-input branch answers without a norm; the output is empty
    with v's trailing sizes. Faults: that branch raising (``all(None)``, ``isfinite(None)``)."""
    for shape in ((0, 2, 3, 4), (1, 0, 3, 4)):
        q, k = torch.zeros(shape), torch.zeros(shape)
        v = torch.zeros(*shape[:3], 5)
        assert softmax_parallel(q, k, v)[0].shape == (*shape[:3], 5)


# --- overflow marks on inputs that share memory (one key tensor expanded over a dimension) -------


def _expanded_keys(base, copies=2, dim=1):
    """base (1, 1, T, d) expanded to `copies` along dim 0 or 1: a stride of 0, so the marks are judged
    per entry against the other tensor's largest (the shared-memory path)."""
    shape = [1, 1, *base.shape[2:]]
    shape[dim] = copies
    return base.expand(*shape)


@pytest.mark.parametrize("huge", ["query", "key"])
def test_a_huge_entry_against_moderate_ones_of_a_shared_tensor_is_marked(huge):
    """Keys expanded over 2 heads (d_key 4: per-term limit 1.7e38 / 4, root 6.5e18). One entry of 1e30
    meets, at a masked (future) pair, entries of 1e9 on the other side: the logit 1e30·1e9/2 = 5e38
    overflows, and the fused kernel would make the earlier output NaN. Only the big side exceeds the
    root, so only its own test can mark it. Faults: that test divided (1e30 / 1e9 = 1e21, below the
    limit) instead of multiplied: nothing marked, and output 2 of head 0 (the masked pair's query) NaN. Right
    value: a float64 loop (the 1e30 entry's own logits are finite, and saturate)."""
    q, base = _randn(1, 2, 8, 4, seed=6), _randn(1, 1, 8, 4, seed=7)
    v = _randn(1, 2, 8, 4, seed=8)
    if huge == "query":
        q[0, 0, 2] = torch.tensor([1e30, 0.0, 0.0, 0.0])
        base[0, 0, 5, 0] = 1e9
    else:
        base[0, 0, 5] = torch.tensor([1e30, 0.0, 0.0, 0.0])
        q[0, 0, 2, 0] = 1e9
    k = _expanded_keys(base)
    y = softmax_parallel(q, k, v)[0]
    assert torch.isfinite(y).all()
    assert torch.allclose(y.double(), _reference(q, k, v), rtol=0, atol=1e-5)


def test_overflowing_terms_of_a_shared_tensor_are_judged_per_term_of_d_key():
    """Keys expanded over a batch of 2, d_key 64, T 2: query 0 = a·1 and key 1 = b·1 with a·b = 0.3 ×
    (fp32 max / 2), so every term of the masked logit is 0.3·limit and the logit 64·0.3·limit / √64 =
    2.4·limit overflows fp32 (max = 2·limit). The per-term limit is limit / d_key = limit / 64. Faults:
    it multiplied by d_key, or divided by the number of heads (1) or of tokens (2): 0.3·limit passed
    and output 0 of batch 0 was NaN. Right values: output 0 = v_0 (its only key), output 1 a float64
    loop (finite)."""
    a = b = math.sqrt(0.3 * FP32_LIMIT)  # 7.1e18, above the root √(limit / 64) = 1.6e18
    q = _randn(2, 1, 2, 64, seed=9)
    q[0, 0, 0] = a
    base = _randn(1, 1, 2, 64, seed=10)
    base[0, 0, 1] = b
    k, v = _expanded_keys(base, dim=0), _randn(2, 1, 2, 3, seed=11)
    y = softmax_parallel(q, k, v)[0]
    assert torch.equal(y[0, 0, 0], v[0, 0, 0])
    assert torch.allclose(y.double(), _reference(q, k, v), rtol=0, atol=1e-5)


# --- bit for bit: rows no overflow reaches are the fused kernel's -----------------------------------


def test_marks_reach_only_the_rows_of_their_own_head_and_side():
    """fp32, 2 heads, T 8, d_key 4. Head 0: query 5 = (1e20, 0, 0, 0) and its own key 5 = (1e19, 0, 0,
    0): their logit overflows at an allowed pair, so the query is marked (row 5 only); queries 6 and 7
    read key 5 through a 0 coordinate. Head 1: query 3 = (0, 1e20, 0, 0) against the later key 6 = (0,
    1e19, 0, 0): the key is marked (rows 6 and 7 of head 1). Every other row is the fused kernel's bit
    for bit on the inputs with those two rows zeroed (which those rows do not see). Faults: the own
    key counted as a later one (key 5 marked: rows 6 and 7 of head 0 moved to the explicit form),
    the key marks taken over every axis (every key of both heads marked: all rows moved)."""
    q, k, v = (_randn(1, 2, 8, 4, seed=s) for s in (12, 13, 14))
    q[0, 0, :, 0] = 0.0
    q[0, 0, 5] = torch.tensor([1e20, 0.0, 0.0, 0.0])
    k[0, 0, 5] = torch.tensor([1e19, 0.0, 0.0, 0.0])
    q[0, 1, :, 1] = 0.0
    q[0, 1, 3] = torch.tensor([0.0, 1e20, 0.0, 0.0])
    k[0, 1, 6] = torch.tensor([0.0, 1e19, 0.0, 0.0])
    y = softmax_parallel(q, k, v)[0]
    q_clean, k_clean = q.clone(), k.clone()
    q_clean[0, 0, 5], k_clean[0, 1, 6] = 0.0, 0.0
    expected = _fused(q_clean, k_clean, v)
    assert torch.equal(y[0, 0, :5], expected[0, 0, :5]) and torch.equal(y[0, 0, 6:], expected[0, 0, 6:])
    assert torch.equal(y[0, 1, :6], expected[0, 1, :6])


@pytest.mark.parametrize("nan", [False, True])
def test_float64_logits_past_fp32s_range_stay_with_the_fused_kernel(nan):
    """float64, query 3 = (0, 1e20, 0, 0) and the later key 6 = (0, 1e19, 0, 0): the masked logit 5e38
    overflows fp32 but not float64 (limit 9e307), so nothing is marked: every row is the fused
    kernel's bit for bit (with a NaN in the last value, rows 0–6 are, on the inputs with it zeroed).
    Faults: the limit taken for no dtype (fp32's 1.7e38, in the guard or in the marks): key 6 marked,
    rows 6 (and 7) moved to the explicit form."""
    q, k, v = (_randn(1, 1, 8, 4, seed=s, dtype=torch.float64) for s in (15, 16, 17))
    q[0, 0, :, 1] = 0.0
    q[0, 0, 3, 1], k[0, 0, 6] = 1e20, torch.tensor([0.0, 1e19, 0.0, 0.0], dtype=torch.float64)
    if nan:
        v_given = v.clone()
        v_given[0, 0, 7, 0] = float("nan")
        y = softmax_parallel(q, k, v_given)[0]
        assert torch.equal(y[0, 0, :7], _fused(q, k, torch.where(v_given.isnan(), 0.0, v_given))[0, 0, :7])
    else:
        assert torch.equal(softmax_parallel(q, k, v)[0], _fused(q, k, v))


def test_a_nan_query_entry_counts_as_zero_in_the_overflow_bounds():
    """fp32: every query's coordinate 0 is 0 except query 2's, which is NaN, and key 6 = 2e38 there:
    no finite logit overflows (0·2e38 = 0), so no key is marked; rows other than 2 are the fused
    kernel's bit for bit on the inputs with that NaN entry zeroed. Fault: the NaN read as 1 in the
    bound (2e38 > limit): key 6 marked, rows 6 and 7 moved to the explicit form."""
    q, k, v = (_randn(1, 1, 8, 4, seed=s) for s in (18, 19, 20))
    q[0, 0, :, 0] = 0.0
    q[0, 0, 2, 0], k[0, 0, 6, 0] = float("nan"), 2e38
    y = softmax_parallel(q, k, v)[0]
    expected = _fused(torch.nan_to_num(q, nan=0.0), k, v)
    assert torch.equal(y[0, 0, :2], expected[0, 0, :2]) and torch.equal(y[0, 0, 3:], expected[0, 0, 3:])


def test_a_nan_key_entry_does_not_count_in_the_shared_keys_largest_entry():
    """Keys expanded over 2 heads, every key's coordinate 0 is 0 and the others below 0.1 in size, one
    NaN in key 6; query 2 of head 0 = (1e38, …): its largest product 1e38 × (largest key entry < 0.1)
    stays below the per-term limit 1.7e38 / 4, so it is not marked, and rows 0–5 (which do not see key
    6) are the fused kernel's bit for bit on the keys with the NaN zeroed (still expanded). Fault: the
    NaN read as 1 in the keys' largest entry (1e38 > 4.25e37): query 2 marked, row 2 moved."""
    q, base, v = _randn(1, 2, 8, 4, seed=21), 0.02 * _randn(1, 1, 8, 4, seed=22), _randn(1, 2, 8, 4, seed=23)
    base[0, 0, :, 0] = 0.0
    q[0, 0, 2, 0] = 1e38
    clean = _expanded_keys(base)
    base_nan = base.clone()
    base_nan[0, 0, 6, 1] = float("nan")
    y = softmax_parallel(q, _expanded_keys(base_nan), v)[0]
    assert torch.equal(y[:, :, :6], _fused(q, clean, v)[:, :, :6])


@pytest.mark.parametrize("bound", ["exactly the limit", "0.4 x max"])
def test_a_masked_logit_up_to_half_the_largest_value_is_not_marked(bound):
    """fp32, d_key 2: query 2 = (c, ·) and the later key 4 = (e, 0), every other coordinate 0 of the
    keys and queries 0: the one large bound is c·e, at or below the logit limit (fp32 max / 2), which
    the fused kernel holds, so nothing is marked and every row is the fused kernel's bit for bit.
    c·e is the limit exactly (c = 2^63, e = (2^24 − 1)·2^40, limit = (2^24 − 1)·2^103) or 0.4·max.
    With a NaN in the last value (the explicit path, which makes the marks) rows 0–4 are the fused
    kernel's on the inputs with that value zeroed. Faults: ``>=`` for ``>`` at the limit; the limit
    taken as max / 3: key 4 marked, row 4 (and 5) moved."""
    q, k, v = (_randn(1, 1, 6, 2, seed=s) for s in (24, 25, 26))
    q[0, 0, :, 0], k[0, 0, :, 0] = 0.0, 0.0
    if bound == "exactly the limit":
        c, e = 2.0**63, (2**24 - 1) * 2.0**40
        assert c * e == FP32_LIMIT
    else:
        c, e = 2.0**64, 0.4 * torch.finfo(torch.float32).max / 2.0**64
    q[0, 0, 2, 0], k[0, 0, 4] = c, torch.tensor([e, 0.0])
    assert torch.equal(softmax_parallel(q, k, v)[0], _fused(q, k, v))
    v_given = v.clone()  # a NaN in the last value: the explicit path, where the marks are made
    v_given[0, 0, 5, 0] = float("nan")
    expected = _fused(q, k, v.index_fill(2, torch.tensor([5]), 0.0))
    assert torch.equal(softmax_parallel(q, k, v_given)[0][0, 0, :5], expected[0, 0, :5])


@pytest.mark.parametrize("side", ["query", "key"])
def test_a_shared_entry_whose_product_is_exactly_the_per_term_limit_is_not_marked(side):
    """Keys expanded over 2 heads, fp32, d_key 2: per-term limit (2^24 − 1)·2^102 (fp32 max / 4), root
    ≈ 2^63. An entry of 2^64 (above the root) whose largest partner on the other side is (2^24 − 1)·2^38
    (below it) has the product exactly at the per-term limit, so it is not marked. It sits at a
    masked pair (query 2, key 4); every other coordinate 0 is 0, so no other logit is large. With a
    NaN in the last value (the explicit path), rows 0–6 are the fused kernel's bit for bit on the
    inputs with that value zeroed. Faults: ``>=`` for ``>`` in the query's or the key's product test:
    query 2 (row 2 of head 0) or key 4 (rows 4–6) marked and moved to the explicit form."""
    big, partner = 2.0**64, (2**24 - 1) * 2.0**38
    assert big * partner == FP32_LIMIT / 2
    q, base, v = _randn(1, 2, 8, 2, seed=27), _randn(1, 1, 8, 2, seed=28), _randn(1, 2, 8, 2, seed=29)
    q[:, :, :, 0], base[:, :, :, 0] = 0.0, 0.0
    q[0, 0, 2, 0], base[0, 0, 4, 0] = (big, partner) if side == "query" else (partner, big)
    v_given = v.clone()
    v_given[:, :, 7, 0] = float("nan")
    y = softmax_parallel(q, _expanded_keys(base), v_given)[0]
    assert torch.equal(y[:, :, :7], _fused(q, _expanded_keys(base), v.index_fill(2, torch.tensor([7]), 0.0))[:, :, :7])


@pytest.mark.parametrize("side", ["query", "key"])
def test_a_shared_float64_entry_exactly_at_the_root_is_not_marked(side):
    """Keys expanded over 2 heads, float64, d_key 2: root = √(float64 max / 2 / 2) ≈ 6.7e153, an entry
    may be marked only above it. One side holds an entry exactly at the root, the other 4·root (marked:
    4·root² > the per-term limit), at the masked pair (query 2, key 4); every other coordinate 0 is 0.
    The entry at the root is not marked: with the query at the root, rows 0–3 are the fused kernel's
    bit for bit on the keys with key 4's entry zeroed; with the key at the root, rows other than 2 are
    the fused kernel's on the queries with query 2's entry zeroed. Faults: ``>=`` for ``>`` against the
    root: the entry at it marked too, and row 2 (query) or rows 4–7 (key) moved to the explicit form."""
    f64 = torch.float64
    root = math.sqrt(torch.finfo(f64).max / 2 / 2)
    q, base, v = (_randn(*shape, seed=s, dtype=f64) for shape, s in (((1, 2, 8, 2), 30), ((1, 1, 8, 2), 31), ((1, 2, 8, 2), 32)))
    q[:, :, :, 0], base[:, :, :, 0] = 0.0, 0.0
    q[0, 0, 2, 0], base[0, 0, 4, 0] = (root, 4 * root) if side == "query" else (4 * root, root)
    y = softmax_parallel(q, _expanded_keys(base), v)[0]
    if side == "query":
        base_clean = base.clone()
        base_clean[0, 0, 4, 0] = 0.0
        assert torch.equal(y[:, :, :4], _fused(q, _expanded_keys(base_clean), v)[:, :, :4])
    else:
        q_clean = q.clone()
        q_clean[0, 0, 2, 0] = 0.0
        expected = _fused(q_clean, _expanded_keys(base), v)
        assert torch.equal(y[:, 1], expected[:, 1]) and torch.equal(y[:, 0, 3:], expected[:, 0, 3:])
        assert torch.equal(y[:, 0, :2], expected[:, 0, :2])


# --- the FWM rule's scan: a non-finite entry is read as 0 in the scan that gives the earlier reads ---


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_fwm_reads_before_a_non_finite_beta_are_those_of_beta_zero(bad):
    """β_6 non-finite beside a finite value v_6 = 1e29 (T 12, one chunk of 16). The reads before token
    6 come from the chunked scan with the non-finite entries read as 0: β_6 = 0 writes nothing, so
    that scan holds no overflow and its reads 0–5 are, bit for bit, those of the same input with
    β_6 = 0 (the token-by-token recurrence rounds otherwise). Faults: NaN, +inf or −inf read as 1
    instead of 0: β_6 = 1 writes v_6 − u, whose square (1e58) overflows fp32, and the whole scan
    falls back to token by token, moving the earlier reads' bits."""
    from fwbench.variants.kernels import fwm_rule_recurrent

    g = torch.Generator().manual_seed(7)
    q, k = torch.rand(1, 2, 12, 4, generator=g), torch.rand(1, 2, 12, 4, generator=g)
    v, beta = torch.randn(1, 2, 12, 3, generator=g), torch.rand(1, 2, 12, generator=g)
    v[:, :, 6] = 1e29
    beta_zero, beta_bad = beta.clone(), beta.clone()
    beta_zero[:, :, 6], beta_bad[:, :, 6] = 0.0, bad
    y_zero = fwm_rule_recurrent(q, k, v, beta_zero)[0]
    y_bad = fwm_rule_recurrent(q, k, v, beta_bad)[0]
    assert torch.isfinite(y_zero).all()
    assert torch.equal(y_bad[:, :, :6], y_zero[:, :, :6])


# --- more bit-for-bit rows: judged in float64, per dtype --------------------------------------------


def test_float64_shared_keys_below_the_norm_bound_take_the_fused_kernel():
    """float64, keys expanded over 2 heads, d_key 2: query 1 = (a, ·) and the later key 3 = (a, ·) with
    a² = 0.6 × float64's limit (max / 2); ‖Q‖‖K‖ ≈ √2·a² ≈ 0.85 × the limit, so the fused kernel holds
    every logit and runs on the whole call: the output is its own, bit for bit. Fault: the guard's
    limit taken for no dtype (fp32's 1.7e38): the explicit path ran, and its per-entry marks for
    shared keys (a·a > limit / 2) moved row 1 and rows 3–5 to the explicit form."""
    f64 = torch.float64
    a = math.sqrt(0.6 * torch.finfo(f64).max / 2)
    q, base, v = (_randn(*shape, seed=s, dtype=f64) for shape, s in (((1, 2, 6, 2), 33), ((1, 1, 6, 2), 34), ((1, 2, 6, 2), 35)))
    q[:, :, :, 0], base[:, :, :, 0] = 0.0, 0.0
    q[0, 0, 1, 0], base[0, 0, 3, 0] = a, a
    k = _expanded_keys(base)
    assert torch.equal(softmax_parallel(q, k, v)[0], _fused(q, k, v))


def test_an_fwm_chunk_makes_its_causal_mask_on_the_keys_device():
    """One chunk of FWM writes and reads on another device (meta, standing in for a GPU) makes its
    causal mask there (a mask left on the CPU is refused beside tensors on another device); reads
    and state keep their shapes."""
    from fwbench.variants.kernels.fwm_rule import _chunk

    N, C, d_dot, d_v = 2, 3, 4, 5
    meta = torch.device("meta")
    W0, K, V = torch.empty(N, d_v, d_dot, device=meta), torch.empty(N, C, d_dot, device=meta), torch.empty(N, C, d_v, device=meta)
    W, reads = _chunk(W0, K, V, torch.empty(N, C, device=meta), torch.empty(N, C, d_dot, device=meta))
    assert (W.device, reads.device) == (meta, meta)
    assert W.shape == (N, d_v, d_dot) and reads.shape == (N, C, d_v)
