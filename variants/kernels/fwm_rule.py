"""The Fast Weight Memory (FWM) update rule, recurrent form only.

Schlag, Munkhdalai & Schmidhuber, "Learning Associative Inference Using Fast Weight Memory",
ICLR 2021; the rule the paper (Schlag, Irie & Schmidhuber 2021, Section 6.1, Setting 2) compares
its delta rule with. For φ-mapped keys k_t and queries q_t (*not* sum-normalised), values v_t and
write strengths β_t:

    v̄_t = W_{t−1} k_t                                  (value currently stored under k_t)
    W'_t = W_{t−1} + β_t (v_t − v̄_t) k_tᵀ             (the delta rule's replacement)
    W_t = W'_t / max(1, ‖W'_t‖_F)                     (rescale: keeps the memory bounded)
    y_t = LayerNorm(W_t q_t)                          (over d_v, no affine parameters)

Shapes: q, k (B, H, T, d_dot); v (B, H, T, d_v); β (B, H, T); W (B, H, d_v, d_dot), one Frobenius
norm per (batch, head) matrix. Computed in the wider of the inputs' dtype and fp32 (fp32 for bf16,
fp16 and fp32 inputs; float64 for float64 ones); outputs come back in the dtype of ``v``; the state
is kept in the compute dtype. ``W0`` is the state before the first token (zeros if None).

Why there is no parallel or chunk form: the rescaling divides by a norm of the running state, a
non-linear function of every earlier write, so the writes do not compose into a product of
matrices that a chunked scan or a triangular solve could evaluate. The modules in
:mod:`variants.attention` therefore only offer ``form="recurrent"`` (and ``"auto"``) for it; the
evaluation below is still a token-by-token recurrence, only on small vectors.

How it is computed without a fast weight per token. Autograd of the loop above keeps several
(d_v × d_dot) tensors per token per (batch, head): gigabytes at Setting 2's S = 200 (400 tokens,
batch 32) and ~20 s per training step, spent streaming them. But the rescaling only multiplies W
by a scalar, so within a chunk of C tokens the state is

    W_t = e^{−L_t} W_0 + Σ_{i≤t} e^{−(L_t − L_{i−1})} e_i k_iᵀ,   e_i = β_i (v_i − W_{i−1} k_i),
    L_t = Σ_{j≤t} log s_j,   s_j = max(1, ‖W'_j‖_F),

and everything the recurrence needs is small: W_{t−1} k_t = e^{−L_{t−1}} (W_0 k_t) +
Σ_{i<t} e^{−(L_{t−1} − L_{i−1})} (k_i·k_t) e_i, and the norm follows exactly from
‖W_{t−1} + e kᵀ‖² = ‖W_{t−1}‖² + 2 eᵀ(W_{t−1} k) + ‖e‖² ‖k‖². The token loop (:func:`_chunk`)
touches only (C × d_v) vectors; the (d_v × d_dot) state is formed once per chunk, with matmuls, and
its norm recomputed there, so no rounding drift carries past a chunk. Decays are exponentials of
non-positive log-scale differences (no overflow, whatever the norms). Autograd differentiates this
form; it keeps one state per chunk instead of several per token.

Differences from the official synthetic-task code (``synthetic/linearAttention.py`` of the paper's
repository), facts only: it skips the rescaling after the very first write (W_1 = β_1 v_1 k_1ᵀ);
here every write is followed by the rescaling, as the rule is stated. Its layer norm uses torch's
default eps (1e-5), as here: when ‖W q‖ is small, eps dominates the variance and the layer norm
acts as a fixed gain of about 1/√eps, which is how a trained FWM can reach a small ½‖v − y‖².
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .double_backward import apply_unrecorded_in_inference_mode, autocast_state, grad_by_recomputation, kept_graph, under_autocast
from .precision import all_finite, compute_dtype, denormals_flushed

#: Layer-norm eps of the read-out, torch's default (the official code's value).
FWM_LAYER_NORM_EPS = 1e-5

#: Tokens per chunk: the token loop's small (t × d_v) products grow with it, the per-chunk state
#: matmuls shrink with it.
FWM_CHUNK_SIZE = 16


def _chunk(W0: Tensor, K: Tensor, V: Tensor, beta: Tensor, Q: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """One chunk of writes (and reads) from W0 (N, d_v, d_dot), in the form of the module docstring.

    K (N, C, d_dot), V (N, C, d_v), β (N, C), Q None or (N, C, d_dot). Returns (W_C (N, d_v, d_dot),
    raw reads W_t q_t (N, C, d_v) or None).
    """
    N, C, _ = K.shape
    from_state = K @ W0.mT                                  # (N, C, d_v): W0 k_t
    gram = K @ K.mT                                         # (N, C, C): k_i·k_t
    key_norms = gram.diagonal(dim1=1, dim2=2)               # (N, C): ‖k_t‖²
    squared_norm = W0.pow(2).sum(dim=(1, 2))                # ‖W_{t−1}‖²
    log_scale = W0.new_zeros(N)                             # L_{t−1}
    errors: list[Tensor] = []                               # e_i
    logs_before: list[Tensor] = []                          # L_{i−1}
    # per-token operands as unbound views: the backward of x[:, t] zero-fills all of x once per
    # token and adds it up, where unbind's stacks the C gradients once
    from_state_t, gram_columns, key_norms_t = from_state.unbind(1), gram.unbind(2), key_norms.unbind(1)
    values_t, beta_t = V.unbind(1), beta.unbind(1)
    for t in range(C):
        u = torch.exp(-log_scale)[:, None] * from_state_t[t]
        if t:
            decay = torch.exp(torch.stack(logs_before, dim=1) - log_scale[:, None])     # (N, t)
            u = u + ((decay * gram_columns[t][:, :t])[:, None, :] @ torch.stack(errors, dim=1)).squeeze(1)
        e = beta_t[t][:, None] * (values_t[t] - u)
        written = squared_norm + 2.0 * (e * u).sum(-1) + e.pow(2).sum(-1) * key_norms_t[t]
        # s² = max(1, ‖W'‖²), clamped as the plain loop is, so the gradients follow torch's convention
        clamped = written.clamp(min=1.0)
        squared_norm = written / clamped
        logs_before.append(log_scale)
        log_scale = log_scale + 0.5 * torch.log(clamped)
        errors.append(e)
    E = torch.stack(errors, dim=1)                          # (N, C, d_v)
    L_before = torch.stack(logs_before, dim=1)              # (N, C): L_{i−1}
    W = torch.exp(-log_scale)[:, None, None] * W0 + (E * torch.exp(L_before - log_scale[:, None])[..., None]).mT @ K
    if Q is None:
        return W, None
    L_after = torch.cat([L_before[:, 1:], log_scale[:, None]], dim=1)                   # (N, C): L_t
    causal = torch.ones(C, C, dtype=torch.bool, device=K.device).tril()               # [t, i]: i ≤ t
    exponent = torch.where(causal, L_before[:, None, :] - L_after[:, :, None], float("-inf"))
    weights = torch.exp(exponent) * (Q @ K.mT)                                          # (N, C_t, C_i)
    reads = torch.exp(-L_after)[..., None] * (Q @ W0.mT) + weights @ E
    return W, reads


def _initial_state(k: Tensor, v: Tensor, W0: Tensor | None, dtype: torch.dtype) -> Tensor:
    """The state before the first token, (B, H, d_v, d_dot) in ``dtype``: W0, or zeros."""
    if W0 is not None:
        return W0.to(dtype)
    B, H, _, d_dot = k.shape
    return k.new_zeros(B, H, v.shape[-1], d_dot, dtype=dtype)


def _scan_chunks(q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None,
                 chunk_size: int = FWM_CHUNK_SIZE) -> tuple[Tensor | None, Tensor]:
    """All writes (and reads) chunk by chunk on (B, H, T, ·) inputs, in the compute dtype.
    Returns (raw reads W_t q_t (B, H, T, d_v), or None without q; W_T (B, H, d_v, d_dot))."""
    B, H, T, d_dot = k.shape
    d_v = v.shape[-1]
    dtype = compute_dtype(q, k, v, beta, W0)
    W = _initial_state(k, v, W0, dtype).reshape(B * H, d_v, d_dot)

    def flat(x: Tensor, *tail: int) -> Tensor:
        return x.to(dtype).reshape(B * H, T, *tail)

    k_, v_, b_ = flat(k, d_dot), flat(v, d_v), flat(beta)
    q_ = None if q is None else flat(q, d_dot)
    reads = []
    # split, not a slice per chunk: a slice's backward zero-fills the whole (B·H, T, ·) input per chunk
    parts = [x.split(chunk_size, dim=1) for x in (k_, v_, b_)]
    queries = [None] * len(parts[0]) if q_ is None else q_.split(chunk_size, dim=1)
    for k_part, v_part, b_part, q_part in zip(*parts, queries):
        W, chunk_reads = _chunk(W, k_part, v_part, b_part, q_part)
        reads.append(chunk_reads)
    y = None if q is None else torch.cat(reads, dim=1).view(B, H, T, d_v)
    return y, W.view(B, H, d_v, d_dot)


class _FlushedScan(torch.autograd.Function):
    """:func:`_scan_chunks` with its forward and its backward both under :func:`denormals_flushed`.
    The chunked form's graph is built inside ``forward`` on detached inputs and kept in ``ctx``;
    ``backward`` differentiates it with :func:`torch.autograd.grad` and lets it go: kept for a
    second backward, it held every chunk's states for as long as anything kept the outputs' graph,
    which autograd's own backward frees (a loop keeping each step's loss grew by every call's
    states). A second backward, through a retained outer graph, runs the chunked scan again on the
    saved inputs, under the forward's autocast state: the same gradients (under the caller's state at
    the backward, a forward under ``torch.autocast("cpu", torch.bfloat16)`` with backwards outside it
    gave a second backward's gradients 5.7 off the first's: fp32 matmuls for bf16 ones). Inputs (q or
    None, k, v, β, W0 or None) and outputs (raw reads or an empty tensor, W_T) as :func:`_scan`.

    Under ``create_graph=True`` the kept graph cannot serve (its inputs are detached from the
    caller's, so every second-order path through them would be lost): the backward runs the chunked
    scan again on the saved inputs and differentiates that (:mod:`.double_backward`), so second
    derivatives are exact."""

    @staticmethod
    def forward(ctx, q, k, v, beta, W0, chunk_size):
        ctx.graph = _FlushedScan._graph((q, k, v, beta, W0), ctx.needs_input_grad, chunk_size)
        _, reads, W = ctx.graph
        ctx.chunk_size = chunk_size
        ctx.autocast = autocast_state(k)  # for the recomputations: the backward runs under the caller's
        ctx.save_for_backward(q, k, v, beta, W0)  # the caller's tensors, for a second-order graph
        return reads.detach(), W.detach()

    @staticmethod
    def _graph(tensors, needs_grad, chunk_size):
        """(detached inputs, reads or an empty tensor, W_T): the chunked scan's own graph."""
        inputs = [None if x is None else x.detach().requires_grad_(needs) for x, needs in zip(tensors, needs_grad)]
        with torch.enable_grad(), denormals_flushed():
            reads, W = _scan_chunks(*inputs, chunk_size=chunk_size)
        return inputs, (inputs[1].new_empty(0) if reads is None else reads), W

    @staticmethod
    def backward(ctx, d_reads, d_W):
        saved = ctx.saved_tensors  # raises on a backward through a freed graph
        if torch.is_grad_enabled():  # create_graph=True: the kept graph cannot serve (class docstring)
            ctx.graph = None
            def scan(*inputs):
                with under_autocast(ctx.autocast):
                    return _scan_chunks(*inputs, chunk_size=ctx.chunk_size)
            return (*grad_by_recomputation(scan, saved, (d_reads, d_W)), None)
        inputs, reads, W = kept_graph(ctx, lambda: _FlushedScan._graph(saved, ctx.needs_input_grad, ctx.chunk_size))
        wanted = [x for x in inputs if x is not None and x.requires_grad]
        outputs = [(reads, d_reads), (W, d_W)]
        outputs = [(out, grad) for out, grad in outputs if grad is not None and out.requires_grad]
        if not wanted or not outputs:
            return (None,) * 6
        with denormals_flushed():
            grads = iter(torch.autograd.grad([o for o, _ in outputs], wanted, [g for _, g in outputs],
                                             allow_unused=True))
        return (*(next(grads) if x is not None and x.requires_grad else None for x in inputs), None)


def _scan_in_chunks(q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None,
                    chunk_size: int) -> tuple[Tensor | None, Tensor]:
    """:func:`_scan_chunks` with denormals flushed, through :class:`_FlushedScan` where a gradient is needed."""
    if not torch.is_grad_enabled() or not any(x is not None and x.requires_grad for x in (q, k, v, beta, W0)):
        with denormals_flushed():
            return _scan_chunks(q, k, v, beta, W0, chunk_size)
    reads, W = apply_unrecorded_in_inference_mode(_FlushedScan, q, k, v, beta, W0, chunk_size)
    return (None if q is None else reads), W


def _reached_by_non_finite(q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None) -> Tensor:
    """(B, H, T) bool: True from the first token of each sequence and head that holds a NaN or ±inf
    in q, k, v or β on (everywhere for a non-finite W0 of that sequence and head)."""
    bad = ~torch.isfinite(beta)
    for x in (q, k, v):
        if x is not None:
            bad |= ~torch.isfinite(x).all(-1)
    if W0 is not None:
        bad[..., 0] |= ~torch.isfinite(W0).flatten(2).all(-1)
    return bad.cumsum(dim=-1) > 0


def _from(cut: Tensor, T: int) -> Tensor:
    """(B, H, T) bool: True at and after token ``cut`` (B, H) of each sequence."""
    return torch.arange(T, device=cut.device) >= cut[..., None]


def _zero_from(x: Tensor | None, later: Tensor) -> Tensor | None:
    """``x`` (B, H, T, ...) with the tokens marked in ``later`` (B, H, T) set to 0."""
    if x is None:
        return None
    return torch.where(later.view(*later.shape, *(1,) * (x.dim() - 3)), torch.zeros_like(x), x)


def _spliced(later: Tensor, before: tuple[Tensor | None, Tensor], given: tuple[Tensor | None, Tensor]
             ) -> tuple[Tensor | None, Tensor]:
    """(reads, W_T): ``before``'s (a chunked scan that reads the marked tokens as 0) where ``later``
    (B, H, T) is False, ``given``'s (the scan one token per chunk on the inputs as given) where True;
    W_T is ``given``'s for a sequence with any marked token."""
    (reads_before, W_before), (reads_given, W_given) = before, given
    W = torch.where(later[..., -1, None, None], W_given, W_before)
    return (None if reads_before is None else torch.where(later[..., None], reads_given, reads_before)), W


def _finite_prefix(q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None) -> Tensor:
    """(B, H) int64: per sequence, the longest prefix whose chunked scan, with every later token read
    as 0, is finite (a binary search, one chunked scan per step; only after an overflow)."""
    B, H, T = beta.shape
    low = torch.zeros(B, H, dtype=torch.long, device=k.device)                 # finite (no token)
    high = torch.full((B, H), T, dtype=torch.long, device=k.device)
    with torch.no_grad(), denormals_flushed():
        while bool((low < high).any()):
            mid = (low + high + 1) // 2
            later = _from(mid, T)
            args = [_zero_from(x, later) for x in (q, k, v, beta)]
            reads, W = _scan_chunks(*args, W0)
            finite = torch.isfinite(W).flatten(2).all(-1)
            if reads is not None:
                finite &= torch.isfinite(reads).flatten(2).all(-1)
            low, high = torch.where(finite, mid, low), torch.where(finite, high, mid - 1)
    return low


def _scan_finite(q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None) -> tuple[Tensor | None, Tensor]:
    """:func:`_scan` on finite inputs: in chunks, or token by token from where a chunk overflows."""
    reads, W = _scan_in_chunks(q, k, v, beta, W0, FWM_CHUNK_SIZE)
    if all_finite(reads, W):
        return reads, W
    # finite inputs, yet a product overflowed inside a chunk (a value near 1e19 squares past fp32's
    # range): 0·inf would carry it back to earlier reads, so from the first token whose chunked scan
    # overflows, per sequence, scan token by token, as the recurrence. The tokens before it keep the
    # chunked scan's numbers, bit for bit (a chunk's token never reads a later one: the later tokens
    # enter its read only as exact zeros of the masked products, whatever they hold, so reading them as
    # 0 changes nothing before them, as for NaN in :func:`_scan`); rescanning the whole batch token by
    # token moved the reads before the overflow, and every other sequence's, by an ulp.
    later = _from(_finite_prefix(q, k, v, beta, W0), k.shape[2])
    before = _scan_in_chunks(*(_zero_from(x, later) for x in (q, k, v, beta)), W0, FWM_CHUNK_SIZE)
    return _spliced(later, before, _scan_in_chunks(q, k, v, beta, W0, 1))


def _scan(q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None) -> tuple[Tensor | None, Tensor]:
    """All writes (and reads) on (B, H, T, ·) inputs, with denormals flushed (see
    :func:`denormals_flushed`). Returns (raw reads W_t q_t (B, H, T, d_v) or None; W_T (B, H, d_v, d_dot)).

    NaN and ±inf stay causal: inside a chunk a later token's non-finite value would reach the earlier
    reads through the masked products (0·inf), and a sequence's would reach no other sequence. So
    with any among the inputs, the reads and states of the tokens it has not reached are those of the
    same chunked scan with the non-finite values read as 0 (the same chunks and shapes as without
    them: the same numbers), and from the first token that holds one they are those of a scan one
    token per chunk on the inputs as given (as the token-by-token recurrence). Finite inputs whose
    chunked scan overflows are scanned one token per chunk from the first token whose chunked scan
    overflows, in that sequence (:func:`_scan_finite`; also the finite stand-ins: a huge value after a
    NaN must not reach the reads before the NaN)."""
    if all_finite(q, k, v, beta, W0):
        return _scan_finite(q, k, v, beta, W0)
    reached = _reached_by_non_finite(q, k, v, beta, W0)

    def finite(x: Tensor | None) -> Tensor | None:
        return None if x is None else torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)

    clean = _scan_finite(finite(q), finite(k), finite(v), finite(beta), finite(W0))
    return _spliced(reached, clean, _scan_in_chunks(q, k, v, beta, W0, 1))


def fwm_rule_read(q: Tensor, W: Tensor, eps: float = FWM_LAYER_NORM_EPS) -> Tensor:
    """Read the memory with φ-mapped queries (B, H, T_q, d_dot): y = LayerNorm(W q), in the
    compute dtype (fp32, or float64 for float64 inputs)."""
    dtype = compute_dtype(q, W)
    y = q.to(dtype) @ W.to(dtype).mT
    return F.layer_norm(y, (y.shape[-1],), eps=eps)


def fwm_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None,
    eps: float = FWM_LAYER_NORM_EPS,
) -> tuple[Tensor, Tensor]:
    """One token at a time (write, then read). Returns (y (B, H, T, d_v), W_T)."""
    if k.shape[2] == 0:
        return v.new_zeros(v.shape), _initial_state(k, v, W0, compute_dtype(q, k, v, beta, W0))
    y, W = _scan(q, k, v, beta, W0)
    return F.layer_norm(y, (y.shape[-1],), eps=eps).to(v.dtype), W


def fwm_rule_write(k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None) -> Tensor:
    """Store every (k_t, v_t) without reading; returns W_T (B, H, d_v, d_dot)."""
    if k.shape[2] == 0:
        return _initial_state(k, v, W0, compute_dtype(k, v, beta, W0))
    return _scan(None, k, v, beta, W0)[1]
