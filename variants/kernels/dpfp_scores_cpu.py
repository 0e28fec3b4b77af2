"""Compiled CPU loops for :mod:`.dpfp_scores`: the DPFP read scores of one query and their backward,
each in one pass over the keys.

The tensor form of :func:`~.dpfp_scores.dpfp_query_scores` makes about ten passes over (R, T, d_key)
tensors per roll (products, masks, two matrix-vector products; the backward as many again), and at
Setting 1's S = 600 each pass streams megabytes through memory: the op was about half of a training
step on one CPU thread. These loops compute the same terms per key row while the row is in cache:
for roll i (paper Eq. 27–28 with k' = [k, −k_0, …, −k_{ν−1}]) and m = 0 … d_key−1,

    a_m = k'_m k'_{m+i},   w_m = P_m if k'_{m+i} > 0 else N_m,   score += max(a_m, 0) w_m,

with the query's weights P (both coordinates positive) and N (both negative) taken from φ(q) by
:func:`~.dpfp_scores._roll_weights`. The backward adds ḡ w_m k'_{m+i} to k'_m and ḡ w_m k'_m to
k'_{m+i} where a_m > 0 (−k_j's share subtracted from k_j), and ḡ max(a_m, 0) to P_m or N_m.

The loops are compiled by numba (``fastmath`` limited to reassociation and fused multiply-add, so
that sums vectorise while NaN and ±inf keep IEEE semantics: a NaN key gives a NaN score at its own
position only). Sums run in another order than the tensor form's, so results agree to fp32
rounding, not bit for bit; the same machine gives the same numbers every time. fp32 and float64
arrays get one compiled loop each, cached on disk after the first call (about 2 s).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

#: reassociation lets the sums over m vectorise; contraction allows fused multiply-add. No
#: ``nnan``/``ninf``: a NaN or inf input must come out as it does from the tensor form.
_FASTMATH = {"reassoc", "contract"}


@numba.njit(cache=True, fastmath=_FASTMATH, nogil=True)
def _forward(k, P, N, out):  # pragma: no cover - compiled; tested through scores()
    rows, T, d = k.shape
    nu = P.shape[1]
    right = np.empty(d, k.dtype)
    for r in range(rows):
        for t in range(T):
            x = k[r, t]
            total = 0.0
            for i in range(1, nu + 1):
                for m in range(d - i):
                    right[m] = x[m + i]
                for m in range(d - i, d):
                    right[m] = -x[m + i - d]
                for m in range(d):
                    a = x[m] * right[m]
                    w = P[r, i - 1, m] if right[m] > 0 else N[r, i - 1, m]
                    total += (0.0 if a <= 0 else a) * w
            out[r, t] = total


@numba.njit(cache=True, fastmath=_FASTMATH, nogil=True)
def _backward(k, P, N, g, grad_k, grad_P, grad_N):  # pragma: no cover - compiled; tested through scores_backward()
    rows, T, d = k.shape
    nu = P.shape[1]
    right = np.empty(d, k.dtype)
    weighted = np.empty(d, k.dtype)
    for r in range(rows):
        for t in range(T):
            x = k[r, t]
            gx = grad_k[r, t]
            gt = g[r, t]
            for m in range(d):
                gx[m] = 0.0
            for i in range(1, nu + 1):
                for m in range(d - i):
                    right[m] = x[m + i]
                for m in range(d - i, d):
                    right[m] = -x[m + i - d]
                for m in range(d):
                    a = x[m] * right[m]
                    positive = right[m] > 0
                    w = P[r, i - 1, m] if positive else N[r, i - 1, m]
                    weighted[m] = gt * w if a > 0 else 0.0
                    gx[m] += weighted[m] * right[m]
                    feature = gt * (0.0 if a <= 0 else a)
                    grad_P[r, i - 1, m] += feature if positive else 0.0
                    grad_N[r, i - 1, m] += 0.0 if positive else feature
                # k'_{m+i} is k_{m+i} below d_key and −k_{m+i−d} beyond
                for m in range(d - i):
                    gx[m + i] += weighted[m] * x[m]
                for m in range(d - i, d):
                    gx[m + i - d] -= weighted[m] * x[m]


def runs_here(k: Tensor) -> bool:
    """Whether the compiled loops serve ``k``: a CPU tensor computed in fp32 or float64."""
    return k.device.type == "cpu" and k.dtype in (torch.float32, torch.float64)


def scores(k: Tensor, P: Tensor, N: Tensor) -> Tensor:
    """Σ_i Σ_m max(a_m, 0) w_m for each key row (the module docstring's sum).

    k: (R, T, d_key) contiguous CPU keys; P, N: (R, ν, d_key) the query's roll weights, in k's
    dtype (fp32 or float64). Returns (R, T) in that dtype.
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
