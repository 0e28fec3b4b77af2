"""Compiled CPU loops for the read scores of one query: DPFP's (:mod:`.dpfp_scores`) and, for keys
given as sums of two table rows (the retrieval tasks' keys, :mod:`fwbench.tasks.key_rows`), DPFP's
and softmax's dot product; each with its backward, in one pass over the keys.

The tensor form of :func:`~.dpfp_scores.dpfp_query_scores` makes about ten passes over (R, T, d_key)
tensors per roll (products, masks, two matrix-vector products; the backward as many again), and at
Setting 1's S = 600 each pass streams megabytes through memory: the op was about half of a training
step on one CPU thread. These loops compute the same terms per key row while the row is in cache:
for roll i (paper Eq. 27–28 with k' = [k, −k_0, …, −k_{ν−1}]) and m = 0 … d_key−1,

    a_m = k'_m k'_{m+i},   w_m = P_m if k'_{m+i} > 0 else N_m,   score += f_m w_m,

where f_m = relu(k'_m) relu(k'_{m+i}) + relu(−k'_m) relu(−k'_{m+i}) (the pair's two features, one of
them 0) is max(a_m, 0) for finite keys, and NaN, as in φ(k), where an infinite coordinate meets one
of the other sign or 0 (inf · 0); max(a_m, 0) alone gave 0 there (a_m = −inf), a finite score for
an infinite key (k = [−1, inf, −1], ν = 1: 0 where φ(k)·φ(q) is NaN; the tensor form, which CUDA
runs, computes the same features),
with the query's weights P (both coordinates positive) and N (both negative) taken from φ(q) by
:func:`~.dpfp_scores.query_roll_weights`. The backward adds ḡ w_m k'_{m+i} to k'_m and ḡ w_m k'_m to
k'_{m+i} where both are of one sign (−k_j's share subtracted from k_j; a_m > 0 alone dropped the
gradient of a pair whose product underflows, k = [0, 0.4, 5e-324] in float64: 0 where φ(k)'s autograd
gives 0.4 w), and ḡ relu(k'_m) relu(k'_{m+i}) to P_m, ḡ relu(−k'_m) relu(−k'_{m+i}) to N_m (φ(k)'s two
features of the pair, so that a NaN lands on the weight whose feature holds it).

The loops are compiled by numba (``fastmath`` limited to reassociation and fused multiply-add, so
that sums vectorise while NaN and ±inf keep IEEE semantics: a NaN key gives a NaN score at its own
position only). Each feature and term is computed in the arrays' dtype, as φ(k) has it (a
product that overflows fp32 is inf, one that underflows is 0, in the backward too); a row's sum
is accumulated in float64. Sums run in another order than the tensor form's, so results agree to fp32
rounding, not bit for bit; the same machine gives the same numbers every time. fp32 and float64
arrays get one compiled loop each, cached on disk after the first call (a few seconds; compiled in
each process where numba finds no writable cache directory, see :func:`_compiled`). Every loop
lives in this one file: numba's disk cache notices a change to the file of the function it
compiled, not to another file whose functions were inlined into it.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

#: reassociation lets the sums over m vectorise; contraction allows fused multiply-add. No
#: ``nnan``/``ninf``: a NaN or inf input must come out as it does from φ(k)·φ(q) by the paper's definition.
_FASTMATH = {"reassoc", "contract"}


def _compiled(**options):
    """``numba.njit`` with this module's options, cached on disk where numba finds a writable cache
    directory (beside this file, else the user's cache directory or ``NUMBA_CACHE_DIR``). Where it
    finds none (a read-only install run by a user whose home is read-only too), numba's ``cache=True``
    raises ``RuntimeError: cannot cache function ...: no locator available`` at import, which made
    ``import fwbench.tasks`` fail; the loops are then compiled in each process instead."""
    def decorate(function):
        try:
            return numba.njit(cache=True, fastmath=_FASTMATH, nogil=True, **options)(function)
        except RuntimeError as error:
            if "no locator available" not in str(error):
                raise
            return numba.njit(cache=False, fastmath=_FASTMATH, nogil=True, **options)(function)
    return decorate


@_compiled(inline="always")
def row_score(x, P, N, right):  # pragma: no cover - compiled; tested through scores()
    """The score of one key row x (d,) for one query's roll weights P, N (ν, d); ``right`` is a
    (d,) work buffer. Called from the compiled loops of this file only (the key path's and the table
    path's; :mod:`fwbench.tasks.key_rows` calls those, and a loop elsewhere would miss numba's cache
    invalidation, see the module docstring)."""
    d = x.shape[0]
    zero = x.dtype.type(0)  # not 0.0, a float64 literal: each term is computed in x's dtype, as φ(k)·φ(q)
    total = 0.0
    for i in range(1, P.shape[0] + 1):
        for m in range(d - i):
            right[m] = x[m + i]
        for m in range(d - i, d):
            right[m] = -x[m + i - d]
        for m in range(d):
            a = x[m] * right[m]
            w = P[i - 1, m] if right[m] > 0 else N[i - 1, m]
            total += (a if a > 0 else (x[m] + right[m]) * zero) * w
    return total


@_compiled(inline="always")
def row_backward(x, P, N, g, gx, grad_P, grad_N, right, weighted):  # pragma: no cover - compiled
    """For one key row x (d,) and its score's gradient g: writes the row's gradient into gx (d,) and
    adds the roll weights' shares into grad_P, grad_N (ν, d); ``right``, ``weighted``: (d,) buffers."""
    d = x.shape[0]
    # x's dtype, not the float64 literal 0.0: numba widens `y if c else 0.0` to float64, so in fp32
    # the features below were products in float64, finite where φ(k)'s overflow to inf (1e20 · 1e20)
    # and nonzero where they underflow to 0 (1e-25 · 1e-25): φ(q)'s gradient 1e30 where ḡ φ(k) is inf
    zero = x.dtype.type(0)
    for m in range(d):
        gx[m] = zero
    for i in range(1, P.shape[0] + 1):
        for m in range(d - i):
            right[m] = x[m + i]
        for m in range(d - i, d):
            right[m] = -x[m + i - d]
        for m in range(d):
            positive = right[m] > 0
            w = P[i - 1, m] if positive else N[i - 1, m]
            # both coordinates of one sign, not a > 0: a product that underflows to 0 (5e-324 · 0.4)
            # still passes relu's gradient to each coordinate, as φ(k)'s autograd does
            same_sign = (x[m] > 0 and right[m] > 0) or (x[m] < 0 and right[m] < 0)
            weighted[m] = g * w if same_sign else zero
            gx[m] += weighted[m] * right[m]
            # each of the pair's two features as φ(k) has it (relu(NaN) = NaN): picking one by the sign
            # of k'_{m+i} put the NaN of [inf, −0] on N's gradient where φ(k) has it on P's
            x_positive = x[m] if not x[m] <= 0 else zero
            x_negative = -x[m] if not x[m] >= 0 else zero
            right_positive = right[m] if not right[m] <= 0 else zero
            right_negative = -right[m] if not right[m] >= 0 else zero
            grad_P[i - 1, m] += g * (x_positive * right_positive)
            grad_N[i - 1, m] += g * (x_negative * right_negative)
        # k'_{m+i} is k_{m+i} below d_key and −k_{m+i−d} beyond
        for m in range(d - i):
            gx[m + i] += weighted[m] * x[m]
        for m in range(d - i, d):
            gx[m + i - d] -= weighted[m] * x[m]


@_compiled()
def _forward(k, P, N, out):  # pragma: no cover - compiled; tested through scores()
    right = np.empty(k.shape[2], k.dtype)
    for r in range(k.shape[0]):
        for t in range(k.shape[1]):
            out[r, t] = row_score(k[r, t], P[r], N[r], right)


@_compiled()
def _backward(k, P, N, g, grad_k, grad_P, grad_N):  # pragma: no cover - compiled; tested through scores_backward()
    right = np.empty(k.shape[2], k.dtype)
    weighted = np.empty(k.shape[2], k.dtype)
    for r in range(k.shape[0]):
        for t in range(k.shape[1]):
            row_backward(k[r, t], P[r], N[r], g[r, t], grad_k[r, t], grad_P[r], grad_N[r], right, weighted)


# Keys as sums of two table rows, k = a[ia] + b[ib] (the retrieval tasks' keys,
# fwbench.tasks.key_rows): the row is built in a buffer, scored, and its gradient added into both
# tables' rows, in token order as index_add adds them.


@_compiled()
def table_dot_forward(a, ia, b, ib, q, out):  # pragma: no cover - compiled; tested through table_scores()
    d = a.shape[1]
    for r in range(ia.shape[0]):
        for t in range(ia.shape[1]):
            ra, rb = a[ia[r, t]], b[ib[r, t]]
            total = 0.0
            for m in range(d):
                total += (ra[m] + rb[m]) * q[r, m]
            out[r, t] = total


@_compiled()
def table_dot_backward(a, ia, b, ib, q, g, grad_a, grad_b, grad_q):  # pragma: no cover - compiled
    d = a.shape[1]
    for r in range(ia.shape[0]):
        for t in range(ia.shape[1]):
            ra, rb, ga, gb = a[ia[r, t]], b[ib[r, t]], grad_a[ia[r, t]], grad_b[ib[r, t]]
            gt = g[r, t]
            for m in range(d):
                share = gt * q[r, m]
                ga[m] += share
                gb[m] += share
                grad_q[r, m] += gt * (ra[m] + rb[m])


@_compiled()
def table_dpfp_forward(a, ia, b, ib, P, N, out):  # pragma: no cover - compiled; tested through table_scores()
    d = a.shape[1]
    x = np.empty(d, a.dtype)
    right = np.empty(d, a.dtype)
    for r in range(ia.shape[0]):
        for t in range(ia.shape[1]):
            ra, rb = a[ia[r, t]], b[ib[r, t]]
            for m in range(d):
                x[m] = ra[m] + rb[m]
            out[r, t] = row_score(x, P[r], N[r], right)


@_compiled()
def table_dpfp_backward(a, ia, b, ib, P, N, g, grad_a, grad_b, grad_P, grad_N):  # pragma: no cover - compiled
    d = a.shape[1]
    x, gx = np.empty(d, a.dtype), np.empty(d, a.dtype)
    right, weighted = np.empty(d, a.dtype), np.empty(d, a.dtype)
    for r in range(ia.shape[0]):
        for t in range(ia.shape[1]):
            ra, rb, ga, gb = a[ia[r, t]], b[ib[r, t]], grad_a[ia[r, t]], grad_b[ib[r, t]]
            for m in range(d):
                x[m] = ra[m] + rb[m]
            row_backward(x, P[r], N[r], g[r, t], gx, grad_P[r], grad_N[r], right, weighted)
            for m in range(d):
                ga[m] += gx[m]
                gb[m] += gx[m]



def runs_here(k: Tensor) -> bool:
    """Whether the compiled loops serve ``k``: a CPU tensor computed in fp32 or float64."""
    return k.device.type == "cpu" and k.dtype in (torch.float32, torch.float64)


def scores(k: Tensor, P: Tensor, N: Tensor) -> Tensor:
    """Σ_i Σ_m f_m w_m for each key row (the module docstring's sum; was max(a_m, 0), which is 0
    where an infinite coordinate meets 0 or the other sign and f_m is NaN).

    k: (R, T, d_key) contiguous CPU keys; P, N: (R, ν, d_key) the query's roll weights, in k's
    dtype (fp32 or float64), finite (each pair meets one of its two weights: an infinite other
    weight would give φ(k)·φ(q) a 0 · inf, NaN, that this sum leaves out). Returns (R, T) in that dtype.
    """
    out = k.new_empty(k.shape[0], k.shape[1])
    _forward(k.detach().numpy(), P.detach().numpy(), N.detach().numpy(), out.numpy())
    return out


def scores_backward(k: Tensor, P: Tensor, N: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of :func:`scores` for the incoming gradient ``g`` (R, T): grad_k (R, T, d_key),
    grad_P and grad_N (R, ν, d_key), all in k's dtype."""
    grad_k = torch.empty_like(k)
    grad_P, grad_N = torch.zeros_like(P), torch.zeros_like(N)
    _backward(k.detach().numpy(), P.detach().numpy(), N.detach().numpy(), g.detach().numpy(),
              grad_k.numpy(), grad_P.numpy(), grad_N.numpy())
    return grad_k, grad_P, grad_N
