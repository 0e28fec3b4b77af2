"""Causal softmax attention (Vaswani et al. 2017) with a KV cache as its carried state.

    y_t = Σ_{s ≤ t} softmax_s(q_t · k_s / √d_key) v_s

Shapes: q, k (B, H, T, d_key); v (B, H, T, d_v); cached keys and values (B, H, P, ·) hold the
P tokens before this call. With ``window`` set, each query sees only its last ``window`` keys
(itself included) and the returned cache keeps the last ``window − 1`` tokens; ``None`` keeps all; a
call of no token (T = 0) returns the cache as it came.
A NaN or ±inf in a key or value reaches only the queries at or after it, as in the recurrent form,
and so does a finite key whose logits overflow or a value past √ of the logit limit (the fused
kernel is then kept from it).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .double_backward import apply_unrecorded_in_inference_mode, autocast_state, grad_by_recomputation, kept_graph, under_autocast
from .precision import cat, compute_dtype, masked_matmul, zeroed_in_layout


def _causal_mask(T: int, P: int, window: int | None, device) -> Tensor:
    """Boolean (T, P + T) mask, True where query t (global index P + t) may attend key j."""
    query_pos = torch.arange(P, P + T, device=device)[:, None]
    key_pos = torch.arange(P + T, device=device)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= key_pos > query_pos - window
    return allowed


def _trim(k: Tensor, v: Tensor, window: int | None) -> tuple[Tensor, Tensor]:
    if window is None:
        return k, v
    keep = max(window - 1, 0)
    return k[:, :, k.shape[2] - min(keep, k.shape[2]):], v[:, :, v.shape[2] - min(keep, v.shape[2]):]


def softmax_parallel(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor | None = None, v_cache: Tensor | None = None,
    window: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """All queries at once against cache + new keys. Returns (y, new k cache, new v cache)."""
    keys = k if k_cache is None else cat([k_cache.to(k.dtype), k], dim=2)
    values = v if v_cache is None else cat([v_cache.to(v.dtype), v], dim=2)
    T, P = q.shape[2], keys.shape[2] - k.shape[2]
    if T == 0:  # the cache as it came: trimmed, a write's cache of `window` tokens lost one and reads changed
        return v.new_zeros(v.shape), keys, values
    mask = _causal_mask(T, P, window, q.device)
    if _fused_kernel_is_safe(q, keys, values):
        y = _fused_attention(q, keys, values, attn_mask=mask)
    else:  # the fused kernel adds the mask to the logits and multiplies masked weights by values
        y = _causal_with_non_finite(q, keys, values, mask)
    return y, *_trim(keys, values, window)


def _fused_attention(q: Tensor, keys: Tensor, values: Tensor, attn_mask: Tensor | None = None) -> Tensor:
    """``scaled_dot_product_attention``, given a dense copy of a query tensor whose elements share
    memory. Why: torch's CPU kernel (2.13) reads an overlapping q wrongly: sliding windows of one
    sequence (``unfold``, strides (…, 1, 1), T = 3 < d_key = 4) gave outputs of 3e38 and NaN against
    the recurrent form's values of about 1, and q with a head stride of 1 (H = 2) outputs 1.96 off;
    an overlapping key or value, or an expanded (stride 0) query, is read right. Every fused call
    goes through here, so the outputs a NaN never reaches stay those of the clean call bit for bit."""
    if _shares_memory(q):
        q = q.contiguous()
    if (torch.is_grad_enabled() and (q.requires_grad or keys.requires_grad or values.requires_grad)
            and not _math_kernel_chosen(q, keys, values, attn_mask)):
        return apply_unrecorded_in_inference_mode(_FusedAttention, q, keys, values, attn_mask)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask)


def _math_kernel_chosen(q: Tensor, keys: Tensor, values: Tensor, attn_mask: Tensor | None) -> bool:
    """Whether ``scaled_dot_product_attention`` runs its math kernel here (on CPU: d_v ≠ d_key), made
    of ops whose backward is differentiable, so :class:`_FusedAttention` (about 70 us a call) is not
    needed: it made a training step of the retrieval model (softmax, form ``parallel``, S = 20,
    d_key = 64, d_v = 20) 10 % slower (1.07 -> 1.17 ms median) with no second derivative to give."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:  # pragma: no cover - a torch without it: take the autograd function always
        return False
    return choose(q, keys, values, attn_mask) == torch.nn.attention.SDPBackend.MATH.value


class _FusedAttention(torch.autograd.Function):
    """The fused kernel, with its own first-order backward, and second-order gradients: torch's CPU
    flash kernel has no derivative of its backward, so ``create_graph=True`` (Hessian-vector
    products, ``gradgradcheck``) raised "derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented" whenever d_v =
    d_key (the flash kernel's case; test_double_backward used d_v ≠ d_key, the math kernel's). Under
    ``create_graph=True`` the backward differentiates the math kernel run again on the saved inputs
    (:func:`~.double_backward.grad_by_recomputation`); the forward's values and the first-order
    gradients are the fused kernel's, bit for bit (under ``create_graph=True`` the first-order
    gradients are the math kernel's, within rounding).

    The fused kernel's own graph (``ctx.graph``) is let go in the first backward: kept (its backward
    retained it, as the caller may ask for a second), it held the kernel's saved tensors (q, k, v, the
    output, the log-sum-exp) for as long as anything kept the output's graph, which plain SDPA's
    backward frees: a training loop that kept each step's loss (``losses.append(loss)``) grew by every
    attention call's inputs and outputs (fp32, B = 4, H = 4, T = 256, d = 16, 200 steps: 1,008 live
    tensors and 690 MB against 208 and 308 MB). The mask is saved with the inputs, so it is let go
    with them (as a ctx attribute it outlived the backward: one (T, P + T) mask per call). A second
    backward (``retain_graph=True`` before) runs the fused forward again on the saved inputs, under
    the forward's autocast state, so its gradients are still the kernel's (run under the caller's
    state, a forward under ``torch.autocast("cpu", torch.bfloat16)`` and backwards outside it gave a
    second backward 6.6e-3 off the first)."""

    @staticmethod
    def forward(ctx, q: Tensor, keys: Tensor, values: Tensor, attn_mask: Tensor | None) -> Tensor:
        y, leaves = _FusedAttention._graph(q, keys, values, attn_mask)
        ctx.graph = (y, leaves)
        ctx.autocast = autocast_state(q)  # for the recomputations: the backward runs under the caller's
        # saved, not a ctx attribute: kept as one, the mask outlived the backward (which frees
        # plain SDPA's) for as long as anything kept the output's graph. A bool mask is saved as a
        # copy, as SDPA keeps its own (float) one: the caller may refill it before the backward
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = attn_mask.clone()
        ctx.save_for_backward(q, keys, values, attn_mask)
        return y.detach()

    @staticmethod
    def _graph(q: Tensor, keys: Tensor, values: Tensor, attn_mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in (q, keys, values)]
        with torch.enable_grad():
            return torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=attn_mask), leaves

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        *inputs, attn_mask = ctx.saved_tensors  # raises on a backward through a freed graph
        if torch.is_grad_enabled():  # create_graph=True
            ctx.graph = None
            def math_kernel(q, keys, values):
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), under_autocast(ctx.autocast):
                    return (torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask),)
            return (*grad_by_recomputation(math_kernel, inputs, (grad_y,)), None)
        y, leaves = kept_graph(ctx, lambda: _FusedAttention._graph(*inputs, attn_mask))
        wanted = [x for x in leaves if x.requires_grad]
        grads = iter(torch.autograd.grad(y, wanted, grad_y))
        return (*(next(grads) if x.requires_grad else None for x in leaves), None)


def _logit_limit(q: Tensor) -> float:
    """Half the largest logit the fused kernel can hold: it forms fp16/bf16 logits in fp32."""
    return torch.finfo(compute_dtype(q)).max / 2


def _value_limit(q: Tensor) -> float:
    """The largest value (or norm of the values) the fused kernel is given: √ :func:`_logit_limit`,
    1.3e19 in fp32, bf16 and fp16 (whose 65504 never reaches it), 9.5e153 in float64."""
    return math.sqrt(_logit_limit(q))


def _overflowing(q: Tensor, keys: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """(entries of q (B, H, T, d), entries of keys (B, H, P + T, d), masked pairs (B, H, T, P + T) or
    None): the marks that keep q and keys from the fused kernel because a logit q_t · k_j they enter
    may overflow (masked ones included: the kernel adds the mask to them), non-finite entries read as
    0. A marked entry's query counts as non-finite, and so does every query that attends a marked key.

    Where neither tensor shares memory between its elements, pairs are judged one by one
    (|q_t · k_j| ≤ Σ_i |q_ti| |k_ji|, in float64). A pair the query attends (``allowed``) marks the
    query, which touches only its own row. A masked pair (a later key, or one before the window)
    marks neither: it is returned, and :func:`_causal_with_non_finite` breaks it, in the fused call
    that gives a row, on the side that row does not read (the key, or another row's query), so that
    whether an output is the fused kernel's depends on no later token, no other row's query and no
    key outside its window. Marking the key of a future pair (4bb05a3) moved every output after a
    huge query (fp32, T = 64, d_key = 16, q[21] = 3e38: outputs 22-63 by up to 4.8e-7), and marking
    the query of a pair before the window moved the outputs whose window had passed a huge key (window
    8, k[20] = 3e38: outputs 28-63 by up to 2.4e-7; both h-break14v); marking the query against the
    largest key of the whole sequence (before) moved the outputs before a huge later query (a query of
    1e20 at token 5 and a key of 1e19 at token 0: outputs 0–4 by 1 ulp, h-break14t).

    An expanded or overlapping input shares one memory entry between several elements (a key
    broadcast over heads, sliding windows of one sequence), and :func:`zeroed_in_layout` zeroes an
    entry for every element that shares it, so there an entry is marked by its own magnitude and
    the largest magnitude of the other tensor (over all of it), never by its row or head: a mark
    that differed between the sharers zeroed a key of a head or token that no overflow reaches (k
    expanded over 2 heads, k[6] = 1e19, head 0's queries ×1e20: head 1's outputs 6 and 7 were
    0.2096 and −0.1208 against the recurrent form's 0.7813 and −0.1973). After those entries are
    zeroed every term |q_i k_i| ≤ limit / d, so |q · k| ≤ limit (the scale 1/√d ≤ 1 only shrinks
    it); such a mark may depend on a later token, within rounding of the output."""
    wide = torch.float64
    q_abs = torch.where(torch.isfinite(q), q.abs(), 0).to(wide)
    k_abs = torch.where(torch.isfinite(keys), keys.abs(), 0).to(wide)
    limit = _logit_limit(q)
    if not (_shares_memory(q) or _shares_memory(keys)):
        over = (q_abs @ k_abs.mT) > limit  # (B, H, T, P + T); an overflowing float64 bound reads inf
        huge_q = (over & allowed).any(-1, keepdim=True).expand(q.shape)
        return huge_q, torch.zeros_like(keys, dtype=torch.bool), over & ~allowed
    per_term = limit / max(q.shape[-1], 1)
    root = math.sqrt(per_term)
    q_top = q_abs.max() if q_abs.numel() else q_abs.new_zeros(())
    k_top = k_abs.max() if k_abs.numel() else k_abs.new_zeros(())
    huge_q = (q_abs > root) & (q_abs * k_top > per_term)
    huge_k = (k_abs > root) & (k_abs * q_top > per_term)
    return huge_q, huge_k, None


def _shares_memory(x: Tensor) -> bool:
    """Whether two elements of ``x`` may read one memory entry (a stride of 0, overlapping windows):
    each dimension's stride, smallest first, must pass the farthest offset the smaller ones reach."""
    reach = 0
    for stride, size in sorted((s, n) for s, n in zip(x.stride(), x.shape) if n > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _fused_kernel_is_safe(q: Tensor, keys: Tensor, values: Tensor) -> bool:
    """Whether q, keys and values are all finite and no logit q_t · k_j can overflow, masked ones
    included: the fused kernel adds the mask to a logit, and inf + (−inf) = NaN turned the query's
    whole output NaN (softmax, k[6] = 3e38 in every entry: output 5 NaN, before the key).

    |q_t · k_j| ≤ ‖Q‖ ‖K‖ (Frobenius norms). A norm, like a sum, is finite only if every entry is
    (NaN and ±inf propagate); a norm or sum that overflows sends the call to the explicit path,
    which is right for any input, only slower. One pass over each tensor and one host
    synchronisation, as ``all_finite``.

    The values must not overflow either: the fused kernel sums exp(logit − running max) · v_j before
    it divides by the sum of the weights, a sum of up to Σ_j |v_jd| ≤ √N ‖V‖ over the N keys (each
    weight ≤ 1; values [[2e38, −2e38], [2e38, −2e38]] in fp32, equal logits: output 1 was [inf, −inf]
    against the recurrent form's [2e38, −2e38], and their plain sum, 0, let them through), and its
    backward forms dO_t · v_j for every pair, masked ones included, whose exact zero weight turns an
    infinite product into NaN (v[3] = 3e38 in every entry, a loss on outputs 0-2: NaN gradients for
    queries 0-2). So ‖V‖ ≤ :func:`_value_limit`, the square root of the logit limit: then the sum
    stays below the limit (N ≤ 1.3e19), and a product overflows only for a gradient of 1e19. A norm
    costs about a sum more than the sum it replaces (ℓ1's generic kernel, 8 times more)."""
    dtype = compute_dtype(q)
    if q.is_meta:  # no values to check (the host read below raised "Cannot copy out of meta tensor"):
        return True  # a shape-only run takes the fused kernel's shapes, as the other variants' reads do
    if not (q.numel() and keys.numel()):
        return all(bool(torch.isfinite(x).all()) for x in (q, keys, values))
    stats = torch.stack([torch.linalg.vector_norm(q, dtype=dtype), torch.linalg.vector_norm(keys, dtype=dtype),
                         torch.linalg.vector_norm(values, dtype=dtype)]).tolist()
    if not all(math.isfinite(x) for x in stats):
        return False
    return stats[0] * stats[1] <= _logit_limit(q) and stats[2] <= _value_limit(q)


def _causal_with_non_finite(q: Tensor, keys: Tensor, values: Tensor, allowed: Tensor) -> Tensor:
    """The masked attention when q, k or v hold NaN/inf.

    An output entry that sees no non-finite input is the fused kernel's on the inputs with their
    non-finite entries set to 0 (those entries sit at masked positions for it, where the kernel's
    weight is exactly 0), so it is bit for bit what it is without them; the fused kernel and the
    explicit product round differently. An entry that sees one is the explicit form's: a masked logit
    replaced (not added to, NaN + −inf = NaN) by −inf, and a non-finite value reaching only the
    queries allowed to see it. Entry [t, d] sees a non-finite q[t], a non-finite k[j] or v[j, d] with
    ``allowed[t, j]``. A finite query or key whose logits may overflow (:func:`_overflowing`) counts
    as non-finite: the fused kernel would add the mask to an infinite logit; so does a value entry
    past :func:`_value_limit` (the fused kernel's unnormalised sum, or its backward's dO · v of a
    masked pair, may overflow on it). A masked pair that may overflow touches no output: the rows are
    given by one fused call per span of keys (:func:`_masked_pair_calls`), each with the pair's key or
    query zeroed where its rows read neither."""
    bad_q, bad_k, bad_v = (~torch.isfinite(x) for x in (q, keys, values))
    bad_v |= values.abs() > _value_limit(q)  # by value, alike for every element sharing an entry
    huge_q, huge_k, masked = _overflowing(q, keys, allowed)
    bad_q, bad_k = bad_q | huge_q, bad_k | huge_k
    seen = allowed.to(q.dtype)
    touched_rows = bad_q.any(-1) | ((seen @ bad_k.any(-1, keepdim=True).to(q.dtype)).squeeze(-1) > 0)
    touched = touched_rows[..., None] | ((seen @ bad_v.to(q.dtype)) > 0)
    zeroed_v = zeroed_in_layout(values, bad_v)
    clean = None
    key_pos = torch.arange(keys.shape[2], device=q.device)
    for low, high, rows in _masked_pair_calls(masked, touched_rows):
        # the masked pairs (t, j) with j outside [low, high] break on the key, the others on the query:
        # the rows given here read only keys in [low, high], and their own pairs all lie outside it
        outside = ((key_pos < low[..., None]) | (key_pos > high[..., None]))[..., None, :]  # (B, H, 1, P + T)
        cut_q = (masked & ~outside).any(-1)[..., None]
        cut_k = (masked & outside).any(-2)[..., None]
        part = _fused_attention(
            zeroed_in_layout(q, bad_q | cut_q), zeroed_in_layout(keys, bad_k | cut_k), zeroed_v, attn_mask=allowed)
        clean = part if clean is None else torch.where(rows[..., None], part, clean)
    if clean is None:  # no masked pair may overflow, or every row is the explicit product's
        if masked is not None:  # break them on the query: a masked logit of inf + (−inf) made a row NaN here,
            # and the backward of that unused row sent NaN into every key's and value's gradient (0 · NaN)
            bad_q = bad_q | masked.any(-1)[..., None]
        clean = _fused_attention(
            zeroed_in_layout(q, bad_q), zeroed_in_layout(keys, bad_k), zeroed_v, attn_mask=allowed)
    wide = compute_dtype(q, keys, values)  # fp16 logits overflow at 65504; the fused kernel's are fp32
    weights = torch.softmax(_explicit_logits(q.to(wide), keys.to(wide)).masked_fill(~allowed, float("-inf")), dim=-1)
    weights = weights.masked_fill(~allowed, 0.0)  # a NaN row's masked weights: no NaN gradient into later values
    return torch.where(touched, masked_matmul(weights, values.to(wide), allowed).to(clean.dtype), clean)


def _explicit_logits(q: Tensor, keys: Tensor) -> Tensor:
    """q k^T / √d_key, where a pair with a non-finite entry in its query or key takes the product's
    value but passes no gradient (the other pairs are formed from q and keys with those entries
    zeroed). Why: a masked pair's gradient is an exact 0, and 0 · inf = NaN in the product's
    backward, so a key of inf at token 3 sent NaN into the gradients of queries 0-2 (fp32, T = 6),
    whose outputs never read it, and a NaN query at token 3 into those of keys 4 and 5; the recurrent
    form's are finite. An attended non-finite pair makes its output non-finite, and the gradients
    through that output NaN, in either form."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    bad_q, bad_k = ~torch.isfinite(q), ~torch.isfinite(keys)
    if not (bad_q.any() or bad_k.any()):
        return (q @ keys.mT) * scale
    finite_pair = ~bad_q.any(-1)[..., :, None] & ~bad_k.any(-1)[..., None, :]
    product = q.masked_fill(bad_q, 0.0) @ keys.masked_fill(bad_k, 0.0).mT
    return torch.where(finite_pair, product, (q @ keys.mT).detach()) * scale


def _masked_pair_calls(masked: Tensor | None, touched: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """[(low (B, H), high (B, H), rows (B, H, T)), ...]: the fused calls :func:`_causal_with_non_finite`
    makes where masked pairs (``masked``, (B, H, T, N)) may overflow, and the rows each call gives. Row
    t is given the span of keys between its nearest masked partners, one before its window (or 0) and
    one after its position (or N − 1): every key it reads lies in it, and none of its own partners.
    Rows of one span share a call (per batch row and head, the k-th distinct span is call k): one call
    for a huge key or query, more only for several tokens that overflow in turn. Rows already taken
    from the explicit form (``touched``) need no call. Empty without masked pairs."""
    if masked is None or not masked.any():
        return []
    T, N = masked.shape[-2:]
    later = torch.arange(N, device=masked.device) > torch.arange(N - T, N, device=masked.device)[:, None]
    after, before = masked & later, masked & ~later
    high = torch.where(after.any(-1), after.to(torch.uint8).argmax(-1) - 1, N - 1)  # (B, H, T); the first
    low = torch.where(before.any(-1), N - before.flip(-1).to(torch.uint8).argmax(-1), 0)  # one past the last
    span = torch.where(touched, -1, low * N + high)
    ordered, order = span.sort(-1)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    rank = torch.empty_like(order).scatter_(-1, order, first.cumsum(-1) - 1)  # distinct spans below row t's
    calls = []
    for k in range(int(rank.max()) + 1):
        rows = (rank == k) & ~touched
        if not rows.any():  # the explicit rows' own rank
            continue
        value = torch.where(rows, span, -1).amax(-1)  # (B, H): this call's span (-1 where no row has it)
        value = torch.where(value < 0, N - 1, value)
        calls.append((value // N, value % N, rows))
    return calls


def softmax_recurrent(
    q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor | None = None, v_cache: Tensor | None = None,
    window: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One token at a time against a growing KV cache (the form used for generation)."""
    B, H, T, d_key = q.shape
    keys = k.new_zeros(B, H, 0, d_key) if k_cache is None else k_cache.to(k.dtype)
    values = v.new_zeros(B, H, 0, v.shape[-1]) if v_cache is None else v_cache.to(v.dtype)
    scale = 1.0 / math.sqrt(d_key)
    wide = compute_dtype(q, k, v)  # as the fused kernel: fp16 and bf16 logits and sums in fp32
    outputs = []
    for t in range(T):
        keys = cat([keys, k[:, :, t : t + 1]], dim=2)
        values = cat([values, v[:, :, t : t + 1]], dim=2)
        if window is not None and keys.shape[2] > window:  # -window past 2**63: torch warned it truncated
            keys, values = keys[:, :, -window:], values[:, :, -window:]
        weights = torch.softmax((q[:, :, t : t + 1].to(wide) @ keys.to(wide).mT) * scale, dim=-1)
        outputs.append((weights @ values.to(wide)).to(v.dtype))
    if not outputs:  # T = 0: the cache as it came (see softmax_parallel)
        return v.new_zeros(v.shape), keys, values
    return cat(outputs, dim=2), *_trim(keys, values, window)


def softmax_read(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
    """Queries (B, H, T_q, d_key) attend to every cached key (B, H, P, ·); nothing is written.

    Inputs the fused kernel cannot take (:func:`_fused_kernel_is_safe`) are read as the parallel
    form reads them, every key allowed: the fused kernel sums exp(logit − max) · v before it divides,
    so values [[2e38, −2e38], [2e38, −2e38]] (fp32, equal logits) read [inf, −inf], where the parallel
    and recurrent forms give [2e38, −2e38].

    An empty cache (P = 0) reads 0, the empty sum, for every query, whatever its values: torch's
    kernel answers an empty call with 0 · (Σq + Σk + Σv), so a query whose entries sum past the
    largest float (fp16 [40000, 30000], fp32 [3e38, 1.5e38]) made every output of the call NaN."""
    keys, values = k_cache.to(q.dtype), v_cache.to(q.dtype)
    if keys.shape[2] == 0:  # no weight to form: products over an empty axis, exact zeros, in the graph
        return (q[..., :0] @ keys[..., :0].mT) @ values
    if _fused_kernel_is_safe(q, keys, values):
        return _fused_attention(q, keys, values)
    allowed = torch.ones(q.shape[2], keys.shape[2], dtype=torch.bool, device=q.device)
    return _causal_with_non_finite(q, keys, values, allowed)
