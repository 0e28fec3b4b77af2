"""Retrieval keys as sums of two table rows, and the read scores of one query taken from the tables.

A retrieval token is [onehot(v); e(k)], so its key W_k x + b_k is key_by_value[v] + key_by_key[k]
(:meth:`fwbench.tasks.retrieval.RetrievalModel.token_projections`): two row lookups. :class:`KeyRows`
holds the tables and ids. Setting 1's training batches read one query per sequence, and their only
use of the (B, T, d_key) keys is the T scores of that query; on CPU :func:`table_scores` computes
those scores straight from the tables (each key row is built in cache, scored, and its gradient
added back into the table rows), so the keys and their gradient never pass through memory. At
S = 600 those passes (two lookups, a sum, a product, two index-adds) cost a third of a step.

Scores (paper §6.1's models):

- softmax: q·k_t (the caller scales by 1/√d_key and normalises, paper Eq. 1–2);
- DPFP: φ(q)·φ(k_t) (Eq. 27–28), as :func:`fwbench.variants.kernels.dpfp_scores.dpfp_query_scores`
  computes it, through the same compiled row loops (:mod:`fwbench.variants.kernels.compiled_scores`).

Each key row is the tables' rows summed in the compute dtype (the wider of the inputs' and fp32):
for fp32 and float64 tables, the keys the lookup path forms, so DPFP's scores are those of
:func:`~fwbench.variants.kernels.dpfp_scores.dpfp_query_scores` on the looked-up keys bit for bit;
softmax's dot products, and the tables' gradients (added row by row in token order), agree with
the lookup path's matrix products and index-adds to rounding. Second derivatives
(``create_graph=True``) differentiate the lookup path again (:mod:`~fwbench.variants.kernels.double_backward`).
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from fwbench.variants.errors import shown
from fwbench.variants.kernels import compiled_scores
from fwbench.variants.kernels.double_backward import apply_unrecorded_in_inference_mode, grad_by_recomputation
from fwbench.variants.kernels.dpfp import dpfp_composed
from fwbench.variants.kernels.dpfp_scores import query_roll_weights, roll_weights_gradient
from fwbench.variants.kernels.precision import compute_dtype


def rows(table: Tensor, ids: Tensor) -> Tensor:
    """``table[ids]`` for a (n, …) table and integer ids of any shape → (*ids.shape, …).

    ``index_select`` on the flattened ids, whose backward is an index_add: on CPU about 3× faster
    forward and 2× faster backward than advanced indexing, whose backward is an accumulating
    index_put.
    """
    return table.index_select(0, ids.reshape(-1)).view(*ids.shape, *table.shape[1:])


def row_sums(table_a: Tensor, ids_a: Tensor, table_b: Tensor, ids_b: Tensor) -> Tensor:
    """``table_a[ids_a] + table_b[ids_b]`` for ids of one shape → (*ids_a.shape, …).

    The sum is added into the first lookup's buffer while it is in cache, before the reshape (an
    in-place op on a view would make autograd copy the whole tensor in the backward).
    """
    flat = table_a.index_select(0, ids_a.reshape(-1)).add_(table_b.index_select(0, ids_b.reshape(-1)))
    return flat.view(*ids_a.shape, *table_a.shape[1:])


class KeyRows(NamedTuple):
    """Keys k[b, t] = table_a[ids_a[b, t]] + table_b[ids_b[b, t]].

    table_a: (n_a, d_key), table_b: (n_b, d_key), one dtype and device; ids_a, ids_b: (B, T) int64
    row indices into each.
    """

    table_a: Tensor
    ids_a: Tensor
    table_b: Tensor
    ids_b: Tensor

    def materialise(self) -> Tensor:
        """The keys as a tensor (B, 1, T, d_key) (one head)."""
        return row_sums(self.table_a, self.ids_a, self.table_b, self.ids_b)[:, None]


def table_scores_apply(keys: KeyRows, q: Tensor) -> bool:
    """Whether :func:`table_scores` serves these keys and queries: CPU, one query per sequence."""
    return keys.table_a.device.type == "cpu" and q.shape[-2] == 1 and q.shape[1] == 1


def table_scores(keys: KeyRows, query: Tensor, kind: str, nu: int = 0) -> Tensor:
    """The scores of each sequence's one query against its keys, from the key tables.

    keys: the (B, T) keys as table rows, CPU tensors (:func:`table_scores_apply`); query: (B, d_key)
    the softmax query, or φ(q) (B, 2·d_key·ν) for ``kind="dpfp"``; ``nu``: DPFP's ν (1 ≤ ν ≤ d_key).
    Returns (B, T) in the wider of the inputs' dtypes and fp32: q·k_t (``kind="dot"``) or φ(q)·φ(k_t)
    (``kind="dpfp"``), differentiable in both tables and the query. A φ(q) holding ±inf or NaN is
    scored by the plain lookup and product (the compiled loops meet each pair with one query weight
    only, not with 0 · inf).

    Raises:
        ValueError: ``kind`` is neither, a tensor not on the CPU, ``nu`` not an integer in [1, d_key]
            for DPFP, an id outside its table, ids that are not (B, T) integers of one shape, tables
            that are not (n, d_key) of one d_key, or a query of another shape, naming the argument.
    """
    if kind not in ("dot", "dpfp"):
        raise ValueError(f"kind: got {kind!r}; expected 'dot' or 'dpfp'")
    # the loops read the tensors' memory through NumPy: a CUDA (or meta) tensor raised "TypeError: can't
    # convert cuda:0 device type tensor to numpy" deep in the op
    for name, tensor in (("table_a", keys.table_a), ("ids_a", keys.ids_a), ("table_b", keys.table_b),
                         ("ids_b", keys.ids_b), ("query", query)):
        if tensor.device.type != "cpu":
            raise ValueError(f"{name}: got a tensor on {tensor.device}; expected a CPU tensor (the compiled loops "
                             f"run on CPU; elsewhere look the keys up with KeyRows.materialise())")
    # the compiled loops index without bounds checks: a mismatch read past the tables' memory
    if keys.table_a.dim() != 2:
        raise ValueError(f"table_a: got shape {tuple(keys.table_a.shape)}; expected an (n, d_key) table")
    if keys.table_b.dim() != 2 or keys.table_b.shape[1] != keys.table_a.shape[1]:
        raise ValueError(f"table_b: got shape {tuple(keys.table_b.shape)} beside table_a's "
                         f"{tuple(keys.table_a.shape)}; expected two (n, d_key) tables of one d_key")
    for name, ids in (("ids_a", keys.ids_a), ("ids_b", keys.ids_b)):
        if ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64) or ids.shape != keys.ids_a.shape:
            raise ValueError(f"{name}: got {ids.dtype} ids of shape {tuple(ids.shape)}; expected int64 (or int32) "
                             f"ids of shape (B, T), one shape for ids_a and ids_b")
    d = keys.table_a.shape[-1]
    # an integer as the feature maps take one (Python or NumPy, not a bool): isinstance(nu, int)
    # refused np.int64(2) as "not an integer" and took True as ν = 1
    if kind == "dpfp" and (isinstance(nu, bool) or not isinstance(nu, numbers.Integral) or not 1 <= nu <= d):
        raise ValueError(f"nu: got {shown(nu)}; expected an integer in [1, d_key={d}] for kind='dpfp'")
    nu = int(nu) if kind == "dpfp" else 0
    width = d if kind == "dot" else 2 * d * nu
    if query.shape != (keys.ids_a.shape[0], width):
        raise ValueError(f"query: got shape {tuple(query.shape)}; expected ({keys.ids_a.shape[0]}, {width})")
    for name, ids, table in (("ids_a", keys.ids_a, keys.table_a), ("ids_b", keys.ids_b, keys.table_b)):
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < table.shape[0]:
            raise ValueError(f"{name}: got ids in [{int(ids.min())}, {int(ids.max())}]; "
                             f"expected rows of its table, in [0, {table.shape[0]})")
    if kind == "dpfp" and not bool(query.isfinite().all()):
        # the compiled loops weight each pair by one of its two query weights, so a φ(q) past the
        # dtype's range scored 0 where φ(k)·φ(q) has 0 · inf, NaN: the plain lookup and product here
        return _scores_composed(keys.table_a, keys.ids_a, keys.table_b, keys.ids_b, query, kind, nu)
    return apply_unrecorded_in_inference_mode(_TableScores, keys.table_a, keys.ids_a, keys.table_b, keys.ids_b, query, kind, nu)


class _TableScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table_a, ids_a, table_b, ids_b, query, kind, nu):
        dtype = compute_dtype(table_a, table_b, query)
        ctx.kind, ctx.nu = kind, nu
        a, b = table_a.to(dtype).contiguous(), table_b.to(dtype).contiguous()
        ia, ib = ids_a.contiguous(), ids_b.contiguous()
        out = a.new_empty(ids_a.shape)
        if kind == "dot":
            operands = (query.to(dtype).contiguous(),)
            compiled_scores.table_dot_forward(_np(a), _np(ia), _np(b), _np(ib), _np(operands[0]), out.numpy())
        else:
            operands = query_roll_weights(query.to(dtype)[:, None], nu, a.shape[-1])
            compiled_scores.table_dpfp_forward(_np(a), _np(ia), _np(b), _np(ib), *map(_np, operands), out.numpy())
        ctx.save_for_backward(table_a, table_b, query, a, ia, b, ib, *operands)
        return out

    @staticmethod
    def backward(ctx, grad):
        table_a, table_b, query, a, ia, b, ib, *operands = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the plain lookup-and-score again
            kind, nu = ctx.kind, ctx.nu
            grads = grad_by_recomputation(lambda ta, tb, q: (_scores_composed(ta, ia, tb, ib, q, kind, nu),),
                                          (table_a, table_b, query), (grad,))
            return grads[0], None, grads[1], None, grads[2], None, None
        g = grad.to(a.dtype).contiguous()
        grad_a, grad_b = torch.zeros_like(a), torch.zeros_like(b)
        if ctx.kind == "dot":
            (q,) = operands
            grad_q = torch.zeros_like(q)
            compiled_scores.table_dot_backward(_np(a), _np(ia), _np(b), _np(ib), _np(q), _np(g), grad_a.numpy(),
                                               grad_b.numpy(), grad_q.numpy())
        else:
            P, N = operands
            grad_P, grad_N = torch.zeros_like(P), torch.zeros_like(N)
            compiled_scores.table_dpfp_backward(_np(a), _np(ia), _np(b), _np(ib), _np(P), _np(N), _np(g),
                                                grad_a.numpy(), grad_b.numpy(), grad_P.numpy(), grad_N.numpy())
            grad_q = roll_weights_gradient(grad_P, grad_N, ctx.nu, a.shape[-1])[:, 0]
        needs = ctx.needs_input_grad
        return (grad_a.to(table_a.dtype) if needs[0] else None, None, grad_b.to(table_b.dtype) if needs[2] else None,
                None, grad_q.to(query.dtype) if needs[4] else None, None, None)


def _scores_composed(table_a: Tensor, ids_a: Tensor, table_b: Tensor, ids_b: Tensor, query: Tensor, kind: str,
                     nu: int) -> Tensor:
    """:func:`table_scores` as plain differentiable ops on the looked-up keys (for second derivatives)."""
    dtype = compute_dtype(table_a, table_b, query)
    k = row_sums(table_a, ids_a, table_b, ids_b).to(dtype)  # (B, T, d_key)
    features = k if kind == "dot" else dpfp_composed(k, nu)
    return (features @ query.to(dtype)[:, :, None])[..., 0]


def _np(x: Tensor) -> np.ndarray:
    return x.detach().numpy()


__all__ = ["KeyRows", "row_sums", "rows", "table_scores", "table_scores_apply"]
