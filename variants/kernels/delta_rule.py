"""The delta update rule, in three forms that agree (paper Section 4.2, Eq. 23–26).

Recurrence, for sum-normalised φ-mapped keys k_t and queries q_t, values v_t, write strengths β_t:

    v̄_t = W_{t−1} k_t                              (value currently stored under k_t)
    W_t = W_{t−1} + β_t (v_t − v̄_t) k_tᵀ           (replace it by a β_t-mix of old and new)
    y_t = W_t q_t                                  (read after the write)

Shapes: q, k (B, H, T, d_dot); v (B, H, T, d_v); β (B, H, T); W (B, H, d_v, d_dot).
Computed in the wider of the inputs' dtype and fp32 (:func:`~.precision.compute_dtype`: fp16 and
bf16 inputs accumulate the state in fp32, float64 inputs run in float64); outputs come back in the
dtype of ``v``; the state in the compute dtype. ``W0`` is the state before the first token (zeros
when ``None``). With NaN or ±inf among the inputs, or finite inputs whose products overflow (a key
near 1e19 in fp32: K Kᵀ holds inf), the masked products inside a chunk go through
:func:`~.precision.causal_matmul`, so a non-finite token never reaches the outputs before it.

The chunkwise form uses the WY representation / UT transform of Yang et al. 2024
(arXiv:2406.06484, Section 3): inside a chunk with rows K, V, β and state S = Wᵀ (d_dot, d_v)
before it,

    T_c = (I + tril(diag(β) K Kᵀ, −1))⁻¹ diag(β)      (a unit lower-triangular solve)
    W_c = T_c K,  U = T_c V                            (the WY factors)
    O   = Q S + tril(Q Kᵀ) (U − W_c S)
    S  ← S + Kᵀ (U − W_c S).

T_c and the scores tril(Q Kᵀ) are computed for all chunks at once; the loop over chunks carries
S with five small matmuls per chunk, using U − W_c S = T_c (V − K S). The fused write-then-read
(:func:`delta_rule_write_read`) has a hand-written backward: first-order gradients only, and a
``VariantError`` under ``create_graph=True``. The other forms are plain autograd (any order).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import VariantError
from .chunking import DEFAULT_CHUNK_SIZE, split_chunks
from .double_backward import apply_unrecorded_in_inference_mode
from .gram import gram
from .precision import all_finite, autocast_on, causal_matmul, compute_dtype, computed_in_fp32


def _initial_state(k: Tensor, v: Tensor, W0: Tensor | None, dtype: torch.dtype) -> Tensor:
    B, H, _, d_dot = k.shape
    if W0 is None:
        return k.new_zeros(B, H, v.shape[-1], d_dot, dtype=dtype)
    return W0.to(dtype)


def delta_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One token at a time: O(1) memory per token without autograd; the reference.

    Returns (y (B, H, T, d_v), W_T (B, H, d_v, d_dot)).
    """
    dtype = compute_dtype(q, k, v, beta, W0)
    W = _initial_state(k, v, W0, dtype)
    outputs = []
    # unbind, not k[:, :, t]: the backward of unbind is one stack, while indexing would build a
    # full-size zero gradient per token and make the backward quadratic in T.
    steps = zip(*(x.to(dtype).unbind(2) for x in (q, k, v, beta)), strict=True)
    for q_t, k_t, v_t, b_t in steps:
        v_bar = (W @ k_t[..., None]).squeeze(-1)                 # v̄_t = W_{t−1} k_t
        correction = b_t[..., None] * (v_t - v_bar)              # β_t (v_t − v̄_t)
        W = W + correction[..., None] * k_t[:, :, None, :]       # W_t
        outputs.append((W @ q_t[..., None]).squeeze(-1))         # y_t = W_t q_t
    y = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape, dtype=dtype)
    return y.to(v.dtype), W


def delta_rule_chunk(
    q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor | None, Tensor]:
    """Chunkwise-parallel form via the UT transform (triangular solves, then one loop over chunks).

    Args:
        q, k: (B, H, T, d_dot) sum-normalised φ-mapped queries and keys (``q=None``: only the
            final state is computed, a pure write).
        v: (B, H, T, d_v); beta: (B, H, T) in [0, 1]; W0: (B, H, d_v, d_dot) or ``None``.
        chunk_size: tokens per chunk C; any T works (C is capped at T; a shorter tail is
            zero-padded with k = 0 and β = 0, which writes nothing, so the padding is exact).

    Returns (y (B, H, T, d_v) in v's dtype, or ``None``; W_T (B, H, d_v, d_dot) in the compute dtype).
    Cost O(T·C·d + T·d_dot·d_v) time; memory O(T·d) plus, with autograd, one state per chunk.
    The backward is autograd's: a hand-written one (tried) was no faster, its matmuls are the cost.
    """
    if k.shape[2] == 0:
        return (None if q is None else v.new_zeros(v.shape)), _initial_state(k, v, W0, compute_dtype(q, k, v, beta, W0))
    # rows of a later token's NaN must not reach earlier rows through the zeros of T_c and tril(QKᵀ)
    finite = all_finite(q, k, v, beta)
    y, W = _chunk_scan(q, k, v, beta, W0, chunk_size, torch.matmul if finite else causal_matmul)
    if finite and q is not None and not all_finite(y):
        # finite inputs, yet a product overflowed inside a chunk (a key near 1e19 squares past fp32's
        # range in K Kᵀ): 0·inf would carry it back to the earlier rows of the chunk
        y, W = _chunk_scan(q, k, v, beta, W0, chunk_size, causal_matmul)
    return y, W


def _chunk_scan(q: Tensor | None, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None, chunk_size: int,
                masked_product) -> tuple[Tensor | None, Tensor]:
    """:func:`delta_rule_chunk` on T ≥ 1 tokens, with ``masked_product`` (``torch.matmul``, or
    :func:`~.precision.causal_matmul` where non-finite rows may occur) for the triangular products."""
    dtype = compute_dtype(q, k, v, beta, W0)
    W = _initial_state(k, v, W0, dtype)
    B, H, T, d_dot = k.shape
    d_v = v.shape[-1]
    kc, vc, bc = split_chunks([k, v, beta[..., None]], chunk_size, dtype)
    n_chunks, C = kc.shape[2], kc.shape[3]
    # T_c for every chunk: solve (I + tril(diag(β) K Kᵀ, −1)) T_c = diag(β). solve_triangular
    # reads only the strict lower triangle (unitriangular), so the Gram matrix needs no tril, no + I.
    lower = gram(kc) * bc                                                 # diag(β) K Kᵀ
    T_c = torch.linalg.solve_triangular(lower, torch.diag_embed(bc.squeeze(-1)), upper=False, unitriangular=True)
    # Without autograd the state is updated in place: no copy of S per chunk.
    recording = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, beta, W0)
    )
    S = W.mT.reshape(B * H, d_dot, d_v)  # Wᵀ, the orientation in which the chunk algebra reads naturally
    if not recording:
        S = S.clone(memory_format=torch.contiguous_format)  # never update the caller's W0 in place

    def per_chunk(x: Tensor) -> tuple[Tensor, ...]:
        return x.flatten(0, 1).unbind(1)  # n_chunks tensors of (B·H, C, ·): 3-D for baddbmm

    # under autocast (torch.no_grad() inference, a quantized layer) baddbmm_ gives a bf16/fp16 product that
    # cannot be written into the fp32 state in place ('Bad in-place call'): update it out of place, as
    # the recording path does, which gives that path's values
    in_place = not recording and not autocast_on(k)

    def write(S: Tensor, k_n: Tensor, correction: Tensor) -> Tensor:
        if not in_place:
            return torch.baddbmm(S, k_n.mT, correction)                  # S + Kᵀ (U − W_c S)
        return S.baddbmm_(k_n.mT, correction)

    # U − W_c S = T_c (V − K S): applying T_c inside the loop means the WY factors W_c = T_c K and
    # U = T_c V are never materialised, saving two (B, H, T, ·) tensors and the 2·C²·d_dot FLOPs
    # per chunk of W_c.
    if q is None:
        for k_n, v_n, T_n in zip(per_chunk(kc), per_chunk(vc), per_chunk(T_c), strict=True):
            correction = masked_product(T_n, torch.baddbmm(v_n, k_n, S, alpha=-1))  # U − W_c S
            S = write(S, k_n, correction)
        return None, S.view(B, H, d_dot, d_v).mT

    (qc,) = split_chunks([q], chunk_size, dtype)
    scores = (qc @ kc.mT).tril_()                                         # tril(Q Kᵀ)
    outputs = []
    # (each output gets its own contiguous buffer and one stack at the end: a bmm writing into a
    # strided slice of y would fall back to one small matmul per batch element on CPU)
    for q_n, k_n, v_n, T_n, scores_n in zip(
        per_chunk(qc), per_chunk(kc), per_chunk(vc), per_chunk(T_c), per_chunk(scores), strict=True
    ):
        correction = masked_product(T_n, torch.baddbmm(v_n, k_n, S, alpha=-1))      # U − W_c S
        outputs.append(torch.baddbmm(masked_product(scores_n, correction), q_n, S))  # Q S + tril(QKᵀ)(U − W_c S)
        S = write(S, k_n, correction)
    y = torch.stack(outputs, dim=1).view(B, H, n_chunks * C, d_v)[:, :, :T]
    return y.to(v.dtype), S.view(B, H, d_dot, d_v).mT


#: Default chunk size of :func:`delta_rule_write_read`, measured in the training step of the
#: retrieval tasks (B = 32, one query, d_dot = 128, CPU, one thread; interleaved steps): against 32,
#: 24 is 4 % faster at T = 120 (Setting 2, S = 60) and 10 % at T = 80, 3 % slower at T = 250.
WRITE_READ_CHUNK_SIZE = 24


def delta_rule_write_read(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None,
    chunk_size: int = WRITE_READ_CHUNK_SIZE,
) -> Tensor:
    """Read the memory with queries q after writing all of (k, v, β), without forming W.

    Equal to ``delta_rule_read(q, W_T)`` with ``W_T`` from :func:`delta_rule_chunk`. Chunk n maps
    the state as S_{n+1} = (I − K_nᵀ T_n K_n) S_n + K_nᵀ T_n V_n (S = Wᵀ, T_n the UT transform),
    so the read qᵀ S_N unrolls backwards over the chunks with a query p instead of a state:

        p_N = q;   x_n = T_nᵀ K_n p_{n+1};   y += V_nᵀ x_n;   p_n = p_{n+1} − K_nᵀ x_n;   y += S_0ᵀ p_0.

    T_nᵀ z = diag(β) A_n⁻ᵀ z with A_n = I + tril(diag(β) K_n K_nᵀ, −1) is one triangular solve with
    T_q columns. The cost is O(T·(C + T_q)·d_dot + T·T_q·d_v), linear in T and with no d_dot × d_v
    state: far below a write when few queries follow a sequence, as in the retrieval tasks
    (Section 6.1). The backward is written by hand (:class:`_DeltaWriteRead`): one loop over the
    chunks in the opposite direction carries the query's gradient, and everything else is batched
    over all chunks at once, where autograd would record a dozen small ops per chunk.

    Shapes: q (B, H, T_q, d_dot); k (B, H, T, d_dot); v (B, H, T, d_v); β (B, H, T);
    W0 (B, H, d_v, d_dot) or ``None``; ``chunk_size`` the longest chunk (balanced chunks, as in
    :func:`delta_rule_chunk`). Returns y (B, H, T_q, d_v) in the compute dtype (fp32, or float64
    for float64 inputs); gradients come back in the inputs' dtypes. Raises ``VariantError`` from
    the backward under ``create_graph=True``.
    """
    if k.shape[2] == 0:
        dtype = compute_dtype(q, k, v, beta, W0)
        y = q.new_zeros(*q.shape[:3], v.shape[-1], dtype=dtype)
        return y if W0 is None else y + q.to(dtype) @ W0.to(dtype).mT
    # autocast cast the fp32 Gram matrix to bf16/fp16, which solve_triangular does not take on CPU
    # ('"triangular_solve_cpu" not implemented for 'BFloat16''): computed in fp32 as documented
    with computed_in_fp32(k):
        return apply_unrecorded_in_inference_mode(_DeltaWriteRead, q, k, v, beta, W0, chunk_size)


class _DeltaWriteRead(torch.autograd.Function):
    """:func:`delta_rule_write_read` with its backward derived by hand.

    Per chunk, with L = diag(β) K Kᵀ (whose strict lower part is A's) and S = Wᵀ:

    - forward, from the last chunk: z = K p_{n+1}ᵀ, (I + tril(L, −1))ᵀ u = z, x = β ⊙ u,
      p_n = p_{n+1} − xᵀ K;
    - backward, from the first chunk, given p̄_n: x̄ = X̄_n − K p̄_nᵀ, then
      (I + tril(Lᵀ, −1)) w = x̄ (a triangular solve with the same L), z̄ = β ⊙ w, β̄ = u ⊙ w
      (summed over queries), p̄_{n+1} = p̄_n + z̄ᵀ K.

    The Gram matrix enters through L only, with Ḡ = −tril(x z̄ᵀ, −1), so every chunk's key
    gradient is one batched product k̄ = (Ḡ + Ḡᵀ) K + z̄ p_{n+1} − x p̄_n after the loop. Solving for
    w rather than z̄ gives β̄ without dividing by β (which may be 0).
    """

    @staticmethod
    def forward(ctx, q, k, v, beta, W0, chunk_size):
        B, H, Q, d_dot = q.shape
        d_v = v.shape[-1]
        dtype = compute_dtype(q, k, v, beta, W0)
        kc, vc, bc = split_chunks([k, v, beta[..., None]], chunk_size, dtype)
        n_chunks, C = kc.shape[2], kc.shape[3]
        G = B * H
        K = kc.reshape(G, n_chunks, C, d_dot)
        b = bc.reshape(G, n_chunks, C, 1)
        L = (K @ K.mT).mul_(b)                                 # diag(β) K Kᵀ
        P = q.to(dtype).reshape(G, Q, d_dot)
        # per-chunk views made once (unbind) and results stacked once: on CPU each indexing or
        # copy into a slice is a dispatch costing as much as the small matmuls of the loop
        K_n, L_n, b_n = K.unbind(1), L.mT.unbind(1), b.unbind(1)
        P_in, U, X = [None] * n_chunks, [None] * n_chunks, [None] * n_chunks
        for n in reversed(range(n_chunks)):
            P_in[n] = P                                        # p_{n+1}, the query entering chunk n
            U[n] = torch.linalg.solve_triangular(L_n[n], K_n[n] @ P.mT, upper=True, unitriangular=True)
            X[n] = U[n] * b_n[n]
            P = torch.baddbmm(P, X[n].mT, K_n[n], alpha=-1)
        P_in, U, X = torch.stack(P_in, 1), torch.stack(U, 1), torch.stack(X, 1)
        V = vc.reshape(G, n_chunks * C, d_v)
        y = X.view(G, n_chunks * C, Q).mT @ V                  # Σ_n V_nᵀ x_n, all chunks at once
        W0_32 = None if W0 is None else W0.to(dtype).reshape(G, d_v, d_dot)
        if W0_32 is not None:
            y = torch.baddbmm(y, P, W0_32.mT)                  # + S_0ᵀ p_0
        ctx.save_for_backward(K, V, b, L, P_in, U, X, P, W0_32)
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, beta.dtype, None if W0 is None else W0.dtype)
        ctx.T = k.shape[2]
        return y.view(B, H, Q, d_v)

    @staticmethod
    def backward(ctx, grad_y):
        if torch.is_grad_enabled():
            # create_graph=True: the saved intermediates are constants to autograd, so a graph of
            # this backward would give wrong second derivatives; once_differentiable would give
            # None or zeros from autograd.grad. Refuse, naming the way that supports them.
            raise VariantError(
                "write_read: second-order gradients (create_graph=True) are not supported by the "
                "delta rule's fused write-then-read; use read(q, write(k, v, beta)) instead"
            )
        K, V, b, L, P_in, U, X, P0, W0_32 = ctx.saved_tensors
        G, n_chunks, C, d_dot = K.shape
        Q, d_v = P_in.shape[2], V.shape[-1]
        B, H = grad_y.shape[:2]
        T = ctx.T
        grad_y = grad_y.to(K.dtype).reshape(G, Q, d_v)
        need_q, need_k, need_v, need_beta, need_W0 = ctx.needs_input_grad[:5]
        grad_X = (V @ grad_y.mT).view(G, n_chunks, C, Q)       # ∂/∂x_n of y += V_nᵀ x_n
        grad_P = grad_y @ W0_32 if W0_32 is not None else P0.new_zeros(G, Q, d_dot)
        K_n, L_n, b_n, grad_X_n = K.unbind(1), L.mT.unbind(1), b.unbind(1), grad_X.unbind(1)
        grad_P_out, Wsol, grad_Z = [None] * n_chunks, [None] * n_chunks, [None] * n_chunks
        for n in range(n_chunks):
            grad_P_out[n] = grad_P                             # p̄_n, the gradient leaving chunk n
            grad_x = torch.baddbmm(grad_X_n[n], K_n[n], grad_P.mT, alpha=-1)
            Wsol[n] = torch.linalg.solve_triangular(L_n[n], grad_x, upper=False, unitriangular=True)
            grad_Z[n] = Wsol[n] * b_n[n]                       # z̄ = β ⊙ w
            grad_P = torch.baddbmm(grad_P, grad_Z[n].mT, K_n[n])
        grad_P_out, Wsol, grad_Z = torch.stack(grad_P_out, 1), torch.stack(Wsol, 1), torch.stack(grad_Z, 1)

        grad_q = grad_P.view(B, H, Q, d_dot).to(ctx.dtypes[0]) if need_q else None
        grad_k = None
        if need_k:
            strictly_lower = torch.ones(C, C, dtype=torch.bool, device=K.device).tril_(-1)
            grad_gram = (X @ grad_Z.mT).mul_(strictly_lower).neg_()   # Ḡ = −tril(x z̄ᵀ, −1)
            grad_K = (grad_gram + grad_gram.mT) @ K
            if Q == 1:  # rank-1 terms as broadcast products: a bmm with inner size 1 runs far slower
                grad_K.addcmul_(grad_Z, P_in).addcmul_(X, grad_P_out, value=-1)
            else:
                grad_K = torch.baddbmm(grad_K.flatten(0, 1), grad_Z.flatten(0, 1), P_in.flatten(0, 1))
                grad_K = torch.baddbmm(grad_K, X.flatten(0, 1), grad_P_out.flatten(0, 1), alpha=-1)
            grad_k = grad_K.reshape(B, H, n_chunks * C, d_dot)[:, :, :T].to(ctx.dtypes[1])
        grad_beta = None
        if need_beta:
            grad_beta = (U * Wsol).sum(-1).view(B, H, n_chunks * C)[:, :, :T].to(ctx.dtypes[3])
        grad_v = None
        if need_v:
            grad_v = (X.view(G, n_chunks * C, Q) @ grad_y).view(B, H, n_chunks * C, d_v)[:, :, :T].to(ctx.dtypes[2])
        grad_W0 = (grad_y.mT @ P0).view(B, H, d_v, d_dot).to(ctx.dtypes[4]) if need_W0 else None
        return grad_q, grad_k, grad_v, grad_beta, grad_W0, None


def delta_rule_parallel(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The masked quadratic form: the whole sequence as one chunk, solved directly.

        U' = (I + tril(diag(β) K Kᵀ, −1))⁻¹ diag(β) (V − K S_0)       (= U − W_c S_0)
        Y  = Q S_0 + tril(Q Kᵀ) U',   S_T = S_0 + Kᵀ U'

    O(T²) memory and an O(T²·(d_dot + d_v)) triangular solve; for short sequences and tests.
    """
    dtype = compute_dtype(q, k, v, beta, W0)
    W = _initial_state(k, v, W0, dtype)
    if k.shape[2] == 0:
        return v.new_zeros(v.shape), W
    q32, k32, v32, b32 = q.to(dtype), k.to(dtype), v.to(dtype), beta.to(dtype)[..., None]
    S0 = W.mT
    corrections = torch.linalg.solve_triangular(
        gram(k32) * b32, b32 * (v32 - k32 @ S0), upper=False, unitriangular=True
    )
    scores = (q32 @ k32.mT).tril()
    # finite inputs can still overflow in K Kᵀ (a key near 1e19 in fp32): the rows of the corrections
    # from that token on are then non-finite, and the zeros of tril(Q Kᵀ) must not carry them back
    masked_product = torch.matmul if all_finite(q, k, v, beta, corrections) else causal_matmul
    y = q32 @ S0 + masked_product(scores, corrections)
    return y.to(v.dtype), (S0 + k32.mT @ corrections).mT


def delta_rule_read(q: Tensor, W: Tensor) -> Tensor:
    """Read the memory with sum-normalised φ-mapped queries (B, H, T_q, d_dot): y = W q, in the
    compute dtype of q and W."""
    dtype = compute_dtype(q, W)
    return q.to(dtype) @ W.to(dtype).mT
