"""Several retrieval runs as one model: every weight stacked along a leading run axis R.

A pack of R runs of one variant and one S (same d_key, embedding size, form and chunk size) trains as
one model: the projections are batched matmuls with per-run weights ((R, N, in) @ (R, in, out)), the
row lookups index one flattened (R·S, ·) table with ids offset by r·S, and the attention sees the R
runs' B sequences as one batch of R·B rows. The retrieval model has one layer and one head, and each
row of an attention batch is computed on its own, so a row of run r only ever meets run r's weights:
the pack computes exactly the R runs (up to fp32 summation order), faster because the per-op
overhead of small tensors is paid once for all of them.

Only variants whose attention holds no parameter and no buffer are packed (:func:`packable_model`):
FAVOR+'s random features Ω are per-run state, redrawn from each run's own stream, which a shared
attention module cannot hold.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .key_rows import KeyRows, row_sums, rows
from .one_hot_read import coded_write_read, one_hot_codes, one_hot_write_read, reads_one_hot
from .retrieval import RetrievalModel


def packable_model(model: RetrievalModel) -> bool:
    """Whether ``model``'s runs can share one attention module: it has no parameter and no buffer
    (no per-run state such as FAVOR+'s Ω)."""
    attention = model.attention
    return next(attention.parameters(), None) is None and next(attention.buffers(), None) is None


def _stacked(tensors: list[Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]).contiguous())


def _project(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Per-run ``nn.Linear``: x (R, N, in), weight (R, out, in), bias (R, out) → (R, N, out)."""
    return torch.baddbmm(bias[:, None, :], x, weight.mT)


class PackedRetrievalModel(nn.Module):
    """R :class:`~fwbench.tasks.retrieval.RetrievalModel` runs stacked into one module.

    Every parameter has the run axis first: key_embedding (R, S, e), query_weight (R, d_key, e),
    query_bias (R, d_key), key_by_value (R, S, d_key), key_weight (R, d_key, e), key_bias (R, d_key),
    beta_by_value (R, S, 1), beta_weight (R, 1, e), beta_bias (R, 1). Adam over these stacked
    tensors is R independent Adams (it is elementwise) as long as the loss is the *sum* of the runs'
    own losses.

    Raises:
        ValueError: ``models`` is empty, or its models differ in shapes, variant path or attention,
            or one holds per-run attention state (see :func:`packable_model`).
    """

    def __init__(self, models: list[RetrievalModel]):
        super().__init__()
        if not models:
            raise ValueError("models: got an empty list; expected at least one RetrievalModel")
        first = models[0]
        shapes = {tuple((n, tuple(p.shape)) for n, p in m.named_parameters()) for m in models}
        if len(shapes) != 1 or len({repr(m.attention) for m in models}) != 1:
            raise ValueError("models: got runs of different shapes or attention; expected one variant, S and d_key")
        if not packable_model(first):
            # the module's repr on one line: FAVOR+'s spans four (its feature map's), and a refusal is one line
            named = " ".join(repr(first.attention).split())
            raise ValueError(f"models: {named} holds per-run state; expected a stateless attention")
        self.S, self.embedding_size, self.attention = first.S, first.embedding_size, first.attention
        self.key_embedding = _stacked([m.key_embedding.weight for m in models])
        self.query_weight = _stacked([m.W_q.weight for m in models])
        self.query_bias = _stacked([m.W_q.bias for m in models])
        self.key_by_value = _stacked([m.key_by_value for m in models])
        self.key_weight = _stacked([m.key_projection.weight for m in models])
        self.key_bias = _stacked([m.key_projection.bias for m in models])
        self.beta_by_value = _stacked([m.beta_by_value for m in models])
        self.beta_weight = _stacked([m.beta_projection.weight for m in models])
        self.beta_bias = _stacked([m.beta_projection.bias for m in models])

    @property
    def runs(self) -> int:
        """R, the number of runs in the pack."""
        return self.key_embedding.shape[0]

    def parameters_per_run(self) -> int:
        """Parameter count of one run (what its solo model has)."""
        return sum(p[0].numel() for p in self.parameters())

    def forward(self, keys: Tensor, values: Tensor, queries: Tensor, runs: Tensor | None = None) -> Tensor:
        """Each run writes its own sequences and reads its own queries.

        keys, values: (R', B, L) int64 ids in [0, S); queries: (R', B, Q). ``runs``: the indices (R',)
        of the runs these batches belong to (default: all R, in order). Returns v̂ (R', B, Q, S) in
        fp32, row r equal to what run ``runs[r]`` alone computes (:meth:`RetrievalModel.forward`).
        """
        weights = {n: (p if runs is None else p[runs]) for n, p in self.named_parameters()}
        R, B, L = keys.shape
        S, d_key = self.S, weights["key_bias"].shape[-1]
        offsets = torch.arange(R, device=keys.device).view(R, 1, 1) * S
        key_ids, value_ids = keys + offsets, values + offsets
        embedding = weights["key_embedding"]
        key_by_key = _project(embedding, weights["key_weight"], weights["key_bias"])  # (R, S, d_key)
        key_rows = KeyRows(weights["key_by_value"].reshape(R * S, d_key), value_ids.view(R * B, L),
                           key_by_key.reshape(R * S, d_key), key_ids.view(R * B, L))
        q = self._queries(weights, queries + offsets, queries.shape[1] * queries.shape[2])
        q = q.view(R * B, 1, queries.shape[2], d_key)
        flat_values = values.reshape(R * B, L)
        if self.attention.form == "auto" and reads_one_hot(self.attention):
            output = one_hot_write_read(self.attention, key_rows, flat_values, q, S)
        else:
            k = key_rows.materialise()  # (R·B, 1, L, d_key)
            beta_by_key = _project(embedding, weights["beta_weight"], weights["beta_bias"])  # (R, S, 1)
            beta = torch.sigmoid(row_sums(weights["beta_by_value"].reshape(R * S, 1), value_ids,
                                          beta_by_key.reshape(R * S, 1), key_ids)).view(R * B, 1, L)
            codes = one_hot_codes(flat_values, S, dtype=k.dtype)[:, None]
            output = coded_write_read(self.attention, k, codes, q, beta)
        output = output[:, 0]
        output = output if output.dtype == torch.float64 else output.float()
        return output.view(R, B, queries.shape[2], S)

    def _queries(self, weights: dict[str, Tensor], query_ids: Tensor, per_run: int) -> Tensor:
        """W_q e(k) + b_q for offset query ids (R, B, Q) → (R, B, Q, d_key), on the same path as
        :meth:`RetrievalModel.query_projections` takes for ``per_run`` queries of one run."""
        R = query_ids.shape[0]
        embedding = weights["key_embedding"]
        if per_run < self.S:  # project each query's own embedding
            picked = rows(embedding.reshape(R * self.S, -1), query_ids).view(R, per_run, -1)
            projected = _project(picked, weights["query_weight"], weights["query_bias"])
            return projected.view(*query_ids.shape, -1)
        table = _project(embedding, weights["query_weight"], weights["query_bias"])  # (R, S, d_key)
        return rows(table.reshape(R * self.S, -1), query_ids)
