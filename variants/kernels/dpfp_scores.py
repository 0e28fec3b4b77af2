"""Sum-rule read scores φ(k_t)·φ(q) of DPFP keys against one query, with a backward in key space.

The sum rule's read of one query (paper Eq. 16–18) needs the T scores φ(k_t)·φ(q); for DPFP
(Eq. 27–28) each φ(k_t) is 2·d_key·ν wide. Through autograd the backward forms the outer product
ḡ φ(q)ᵀ (T × 2·d_key·ν), passes it through the feature map's backward on r = [relu(k), relu(−k)]
(T × 2·d_key) and subtracts the halves: on CPU at Setting 1's S=600 these full-width passes over
memory were the largest cost of a training step. This op gives the same scores and gradients
(the forward is the same product; the backward sums the same terms in another order) and its
backward works on d_key-wide tensors only.

Key-space form, for one roll i: with k' = [k, −k_0, …, −k_{i−1}], every feature of block i is
relu(k'_m) relu(k'_{m+i}) or relu(−k'_m) relu(−k'_{m+i}) (m = 0 … d_key−1): a product a_m =
k'_m k'_{m+i} of two coordinates of one sign, taken where a_m > 0. The sign of k'_{m+i} picks the
feature, i.e. the query weight w_m: φ(q) at index m+i (both positive) or (m+i+d_key) mod 2·d_key
(both negative). So score = Σ_i Σ_m [a_m > 0] w_m a_m, and ∂score/∂k'_m = s_m w_m k'_{m+i},
∂score/∂k'_{m+i} = s_m w_m k'_m with s_m = 1 where k'_m and k'_{m+i} are of one sign (as [a_m > 0]
in exact arithmetic; a product that underflows to 0, 5e-324 · 0.4 in float64, keeps its gradient
as relu's does); −k_j's gradient is subtracted from k_j's. At a zero coordinate: no gradient, as
relu'(0) = 0 gives the autograd path. Under
``create_graph=True`` the backward differentiates the feature product instead
(:mod:`.double_backward`), so second derivatives are exact.

On CPU (fp32 and float64) the forward and backward run as compiled loops, one pass per key row
(:mod:`.compiled_scores`) where φ(q) is finite; elsewhere (CUDA, a φ(q) holding ±inf or NaN, and the
tensor form's reference tests) as the tensor operations below.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from ..errors import VariantError
from . import compiled_scores
from .double_backward import apply_unrecorded_in_inference_mode, grad_by_recomputation
from .dpfp import dpfp_composed
from .precision import compute_dtype

#: (x, y, 0) → x where y > 0, else 0, in one vectorised pass (bool masks and torch.where take ~20×
#: longer on CPU)
_where_positive = torch.ops.aten.threshold_backward


def _roll_weights(phi_q: Tensor, i: int, d: int) -> tuple[Tensor, Tensor]:
    """The query weights (…, 1, d) of roll i's pairs (k'_m, k'_{m+i}): the feature index m+i where
    both are positive, (m+i+d) mod 2d where both are negative."""
    block = phi_q[..., (i - 1) * 2 * d : i * 2 * d]
    return block[..., i : i + d], torch.cat([block[..., d + i :], block[..., :i]], dim=-1)


def query_roll_weights(phi_q: Tensor, nu: int, d: int) -> tuple[Tensor, Tensor]:
    """Every roll's query weights from φ(q) (R, 1, 2·d·ν): P (both coordinates of a pair positive)
    and N (both negative), each (R, ν, d) contiguous, as the compiled loops read them
    (:mod:`.compiled_scores`)."""
    weights = [_roll_weights(phi_q, i, d) for i in range(1, nu + 1)]
    return (torch.cat([positive for positive, _ in weights], dim=-2).contiguous(),
            torch.cat([negative for _, negative in weights], dim=-2).contiguous())


def roll_weights_gradient(grad_P: Tensor, grad_N: Tensor, nu: int, d: int) -> Tensor:
    """The inverse of :func:`query_roll_weights` for gradients: grad_P, grad_N (R, ν, d) → the
    gradient of φ(q) (R, 1, 2·d·ν)."""
    return torch.cat([_scatter_roll_weights(grad_P[:, i - 1 : i], grad_N[:, i - 1 : i], i, d)
                      for i in range(1, nu + 1)], dim=-1)


def _scatter_roll_weights(positive: Tensor, negative: Tensor, i: int, d: int) -> Tensor:
    """The inverse of :func:`_roll_weights`: the (…, 1, 2d) block of φ(q) indices they came from."""
    block = positive.new_empty(*positive.shape[:-1], 2 * d)
    block[..., i : i + d] = positive
    block[..., d + i :] = negative[..., : d - i]
    block[..., :i] = negative[..., d - i :]
    return block


def _pair_features(extended: Tensor, i: int, d: int) -> tuple[Tensor, Tensor]:
    """The pair's two features of φ(k), each (…, T, d): relu(k'_m) relu(k'_{m+i}) (weighted by P) and
    relu(−k'_m) relu(−k'_{m+i}) (by N), as the paper defines them, so that an infinite coordinate
    meeting 0 or one of the other sign gives NaN (inf · 0) in the feature φ(k) has it in: relu of the
    product gave 0 there, a finite score for an infinite key (k = [1, −1, inf], ν = 1: 0 where
    φ(k)·φ(q) is NaN), and one feature picked by the sign of k'_{m+i} put φ(q)'s NaN gradient on the
    other weight (k = [0, 0, inf])."""
    left, right = extended[..., :d], extended[..., i : i + d]
    return (left.clamp(min=0).mul_(right.clamp(min=0)),
            left.neg().clamp_(min=0).mul_(right.neg().clamp_(min=0)))


def _extend(k: Tensor, nu: int) -> Tensor:
    """k' = [k, −k_0, …, −k_{ν−1}] (…, T, d + ν)."""
    return torch.cat([k, k[..., :nu].neg()], dim=-1)


class _DPFPQueryScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k: Tensor, phi_q: Tensor, nu: int) -> Tensor:
        dtype = compute_dtype(k, phi_q)
        *lead, T, d = k.shape
        ctx.nu, ctx.k_dtype, ctx.q_dtype, ctx.k_shape, ctx.q_shape = nu, k.dtype, phi_q.dtype, k.shape, phi_q.shape
        rows = math.prod(lead)  # not -1: with T = 0 keys a reshape cannot infer it
        keys, query = k.to(dtype).reshape(rows, T, d), phi_q.to(dtype).reshape(rows, 1, phi_q.shape[-1])
        # the loops weight each pair by the one query weight its nonzero feature meets, so a φ(q)
        # past the dtype's range (q = [1e20, 2e20, −1] in fp32) scored 0 where φ(k)·φ(q) has 0 · inf,
        # NaN; the tensor form multiplies every feature by its weight
        ctx.compiled = compiled_scores.runs_here(keys) and bool(query.isfinite().all())
        if ctx.compiled:  # one pass per key row instead of ~10 over the whole (R, T, d) tensors
            keys = keys.contiguous()
            P, N = query_roll_weights(query, nu, d)
            ctx.save_for_backward(k, phi_q, keys, P, N)
            return compiled_scores.scores(keys, P, N).view(*lead, T, 1)
        out = keys.new_empty(keys.shape[0], T, 1)
        extended = _extend(keys, nu)
        saved = []
        for i in range(1, nu + 1):
            positive, negative = _roll_weights(query, i, d)
            features_positive, features_negative = _pair_features(extended, i, d)
            saved += [features_positive, features_negative]
            # Σ_m relu(k'_m) relu(k'_{m+i}) P_m + relu(−k'_m) relu(−k'_{m+i}) N_m, two matrix-vector products
            if i == 1:
                torch.bmm(features_positive, positive.mT, out=out)
            else:
                out.baddbmm_(features_positive, positive.mT)
            out.baddbmm_(features_negative, negative.mT)
        ctx.save_for_backward(k, phi_q, extended, query, *saved)
        return out.view(*lead, T, 1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        k, phi_q, *saved = ctx.saved_tensors
        nu = ctx.nu
        if torch.is_grad_enabled():  # create_graph=True: the saved features would be constants below
            return (*grad_by_recomputation(lambda k, phi_q: (_scores_composed(k, phi_q, nu),), (k, phi_q), (grad,)), None)
        if ctx.compiled:
            keys, P, N = saved
            g = grad.to(keys.dtype).reshape(keys.shape[:2]).contiguous()
            grad_k, grad_P, grad_N = compiled_scores.scores_backward(keys, P, N, g)
            grad_q = None
            if ctx.needs_input_grad[1]:
                grad_q = roll_weights_gradient(grad_P, grad_N, nu, keys.shape[-1]).view(ctx.q_shape).to(ctx.q_dtype)
            grad_k = grad_k.view(ctx.k_shape).to(ctx.k_dtype) if ctx.needs_input_grad[0] else None
            return grad_k, grad_q, None
        extended, query, *saved = saved
        rows, T, d = extended.shape[0], extended.shape[1], extended.shape[2] - nu
        g = grad.to(extended.dtype).reshape(rows, T, 1)
        grad_k = extended.new_empty(rows, T, d) if ctx.needs_input_grad[0] else None
        grad_q = torch.empty_like(query) if ctx.needs_input_grad[1] else None
        left = extended[..., :d]
        for i in range(1, nu + 1):
            positive, negative = _roll_weights(query, i, d)
            right, features_positive, features_negative = extended[..., i : i + d], saved[2 * i - 2], saved[2 * i - 1]
            if grad_q is not None:  # ∂/∂P_m = Σ_t ḡ_t relu(k'_m) relu(k'_{m+i}), ∂/∂N_m with −k'
                grad_q[..., (i - 1) * 2 * d : i * 2 * d] = _scatter_roll_weights(
                    (features_positive.mT @ g).mT, (features_negative.mT @ g).mT, i, d)
            if grad_k is not None:
                # ḡ_t s_m w_m, w_m = P_m where k'_{m+i} > 0 else N_m
                weight = _where_positive((positive - negative).expand(right.shape), right, 0).add_(negative)
                # where k'_m and k'_{m+i} are of one sign; f_m > 0 dropped pairs whose product underflows
                weight = _where_positive(weight.mul_(g), left.sign().mul_(right.sign()), 0)
                # k'_m gets w_m k'_{m+i}; k'_{m+i} gets w_m k'_m, which is k_{m+i} for m+i < d
                # and −k_{m+i−d} beyond
                if i == 1:
                    torch.mul(weight, right, out=grad_k)
                else:
                    grad_k.addcmul_(weight, right)
                grad_k[..., i:].addcmul_(weight[..., : d - i], left[..., : d - i])
                grad_k[..., :i].addcmul_(weight[..., d - i :], left[..., d - i :], value=-1)
        return (None if grad_k is None else grad_k.view(ctx.k_shape).to(ctx.k_dtype),
                None if grad_q is None else grad_q.view(ctx.q_shape).to(ctx.q_dtype), None)


def _scores_composed(k: Tensor, phi_q: Tensor, nu: int) -> Tensor:
    """The op's value as the product of plain differentiable DPFP features (for second derivatives)."""
    dtype = compute_dtype(k, phi_q)
    # φ(k) in the wider dtype: fp32 keys beside a float64 φ(q) must not round the second order to fp32
    return dpfp_composed(k.to(dtype), nu) @ phi_q.to(dtype).mT


def dpfp_query_scores(k: Tensor, phi_q: Tensor, nu: int) -> Tensor:
    """φ(k) φ(q)ᵀ for DPFP keys and one query's features, with a key-space backward.

    k: (…, T, d_key) keys; phi_q: (…, 1, 2·d_key·ν) the query's DPFP features φ(q) (any tensor of
    that shape: its gradient is φ(k)ᵀ ḡ); ν ≤ d_key. Returns (…, T, 1) in the wider of the inputs'
    dtypes and fp32. Equal to ``dpfp(k, nu) @ phi_q.mT`` and its gradients (paper Eq. 27–28),
    to any order (second derivatives by recomputation, :mod:`.double_backward`).

    Raises:
        VariantError: ``phi_q`` is not one query of 2·d_key·ν features per key sequence (its leading
            dimensions those of ``k``), or ν is not an integer (Python or NumPy) in [1, d_key].
    """
    d = k.shape[-1]
    # an integer (Python or NumPy; not a bool, not 2.0, which failed in range() deep in the op)
    if isinstance(nu, bool) or not isinstance(nu, numbers.Integral) or not 1 <= nu <= d:
        raise VariantError(f"nu: got {nu!r}; expected an integer in [1, d_key={d}] for the key-space backward")
    nu = int(nu)
    if phi_q.shape[-2:] != (1, 2 * d * nu):
        raise VariantError(f"phi_q: got shape {tuple(phi_q.shape)}; expected (…, 1, 2·d_key·ν = {2 * d * nu})")
    if phi_q.shape[:-2] != k.shape[:-2]:  # the compiled loops read one query per key row, unchecked
        raise VariantError(f"phi_q: got shape {tuple(phi_q.shape)}; expected k's leading dimensions "
                           f"{tuple(k.shape[:-2])} before (1, {2 * d * nu})")
    return apply_unrecorded_in_inference_mode(_DPFPQueryScores, k, phi_q, nu)
