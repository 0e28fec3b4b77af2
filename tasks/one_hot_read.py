"""The memory's answer when every stored value is a one-hot code, without forming the codes.

The retrieval tasks store v_t = onehot(value_t) ∈ R^S. For softmax attention and the sum rule the
answer to a query is linear in the values, y = Σ_t a_t v_t with read weights a_t that depend only
on the keys and the query, so y is the weights a_t added into the columns value_t:
O(B·T·T_q) work instead of the O(B·T·T_q·S) product with a dense (B, T, S) table of codes (and
the O(B·T·S) gather that builds it), which at S=600 dominated a training step. What is computed
is the variant's own read (same scores, same normaliser and floor); only the sum's order changes.
The delta and FWM rules' read weights depend on the values through the write, so they keep the
dense codes (:func:`one_hot_codes`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fwbench.variants import Attention, FastWeightAttention, SoftmaxAttention
from fwbench.variants.attention import check_queries
from fwbench.variants.checks import check_finite
from fwbench.variants.feature_maps import DPFP
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores
from fwbench.variants.kernels.limits import floor_for
from fwbench.variants.kernels.precision import all_finite, compute_dtype
from fwbench.variants.rules.sum import SumRule

from .key_rows import KeyRows, table_scores, table_scores_apply


def reads_one_hot(attention: Attention) -> bool:
    """Whether :func:`one_hot_write_read` has a code-free path for ``attention``: softmax without a
    window, or a fast-weight variant with the sum rule, each with the built-in ``write_read`` (the
    sum rule's fused read, :class:`~variants.rules.sum.SumRule`). Not every rule that carries a
    normaliser z: a rule of a user's own with another read (one that halves the sum rule's) was
    answered with the sum rule's weights."""
    if isinstance(attention, SoftmaxAttention):
        return attention.window is None and type(attention).write_read is SoftmaxAttention.write_read
    return (isinstance(attention, FastWeightAttention) and type(attention).write_read is FastWeightAttention.write_read
            and type(attention.update_rule).write_read is SumRule.write_read)


def coded_write_read(attention: Attention, k: Tensor, codes: Tensor, q: Tensor, beta: Tensor | None) -> Tensor:
    """``attention.write_read(k, codes, q, beta=beta)`` with q cast to k's dtype, the retrieval models'
    write-then-read on materialised keys (:class:`~fwbench.tasks.retrieval.RetrievalModel`, its packed
    twin). Why: under autocast the keys add an fp32 table to a bf16/fp16 projection and come out fp32, the
    queries bf16/fp16, and softmax takes one dtype for q, k and v ('q.dtype: got torch.bfloat16; expected
    the dtype of k (torch.float32)'); fast weights compute both in fp32 either way, and without autocast
    the cast is a no-op. Shapes: those of ``write_read``; raises what it raises."""
    return attention.write_read(k, codes, q.to(k.dtype), beta=beta)


def one_hot_write_read(attention: Attention, k: Tensor | KeyRows, values: Tensor, q: Tensor, S: int) -> Tensor:
    """``attention.write_read(k, onehot(values), q)`` without the one-hot codes.

    k: (B, H, T, d_key) keys, or one head's keys as table rows (:class:`~fwbench.tasks.key_rows.KeyRows`,
    (B, T)); values: (B, T) int64 value ids in [0, S) (the same for every head); q: (B, H, T_q, d_key)
    queries. Returns (B, H, T_q, S) in fp32 (float64 for float64 inputs).

    Softmax: weights softmax(q·k/√d_key) over the T keys (paper Eq. 1–2). Sum rule: weights
    φ(q)·φ(k_t) / max(Σ_t φ(q)·φ(k_t), floor) (paper Eq. 16–18, the sum rule's normaliser and its
    floor for the compute dtype, :func:`~variants.kernels.limits.floor_for`). With keys as table
    rows, one query per sequence on CPU, softmax's and DPFP's scores come straight from the tables
    (:func:`~fwbench.tasks.key_rows.table_scores`); otherwise the keys are looked up first.

    Raises:
        ValueError: ``attention`` has no code-free path (see :func:`reads_one_hot`).
        VariantError: q is not (B, H, T_q, d_key) for keys of (B, H, ·, d_key) (H = 1 for table rows),
            as the variant's ``write_read`` refuses it.
        NonFiniteError: q or k holds a NaN or ±inf while ``attention.check_finite`` is on (keys as
            table rows: a key that reads a table row holding one, or two finite rows whose sum
            overflows, named as ``k`` at the key's (B, 1, T, d_key) index as the lookup path names
            it; a row no token reads is not a key).
    """
    if not reads_one_hot(attention):
        raise ValueError(f"attention: got {attention!r}; expected softmax without a window or a sum-rule variant")
    # the queries the variant's own write_read takes (B and H those of the keys): two heads of queries
    # against one head's keys were broadcast by softmax and the dot-product reads and refused by DPFP's
    # as a phi_q shape (an argument the caller never gave)
    keys_shape = (*k.ids_a.shape[:1], 1, *k.ids_a.shape[1:], k.table_a.shape[-1]) if isinstance(k, KeyRows) else k.shape
    check_queries(q, torch.empty(keys_shape, device="meta"))
    kind = _table_kind(attention, k, q)
    if kind is None and isinstance(k, KeyRows):
        k = k.materialise()
    if attention.check_finite and kind is None:
        check_finite(q=q, k=k)
    elif attention.check_finite:
        check_finite(q=q)
        if not all_finite(k.table_a, k.table_b):
            # the keys the lookup path checks (one pass over the small tables first): a NaN in a row no
            # token reads was refused here and not there (a CPU run diverged where a CUDA run went on),
            # and a NaN that is read was named at the table's index, (3, 2), not the key's
            check_finite(k=k.materialise())
    if kind is not None:
        scores = _table_key_query_scores(attention, k, q, kind)
        if attention.check_finite and not bool(torch.isfinite(scores).all()):
            # finite tables whose rows sum past the dtype's range give inf keys, which the lookup
            # path refuses; the scores are where they show (the keys are never formed)
            check_finite(k=k.materialise())
        dtype, d_key = scores.dtype, k.table_a.shape[-1]
    else:
        dtype, d_key = compute_dtype(q, k), k.shape[-1]
    if isinstance(attention, SoftmaxAttention):
        # K qᵀ (B, H, T, T_q), as the sum rule below: with one query per sequence the backward's key
        # gradient comes out as (T, d_key) rows, where q kᵀ's came out transposed and was copied
        if kind is None:
            scores = k.to(dtype) @ q.to(dtype).mT
        weights = torch.softmax(scores / math.sqrt(d_key), dim=-2).mT  # (B, H, T_q, T)
    else:
        # K φ(q) (B, H, T, T_q) as the sum rule's kernel forms it: a matrix-vector product over
        # contiguous rows of φ(k) for one query, faster than φ(q) φ(k)ᵀ on CPU
        keys_q = (_key_query_scores(attention, k, q) if kind is None else scores).to(dtype)
        weights = (keys_q / keys_q.sum(dim=2, keepdim=True).clamp(min=floor_for(dtype))).mT
    columns = values[:, None, None, :].expand(weights.shape)
    return weights.new_zeros(*weights.shape[:-1], S).scatter_add_(-1, columns, weights)


def _table_kind(attention: Attention, k: Tensor | KeyRows, q: Tensor) -> str | None:
    """Which :func:`~fwbench.tasks.key_rows.table_scores` serves this read (``"dot"``: softmax,
    ``"dpfp"``: the DPFP sum rule as :func:`_key_query_scores` takes it), or ``None``."""
    if not isinstance(k, KeyRows) or not table_scores_apply(k, q):
        return None
    if isinstance(attention, SoftmaxAttention):
        return "dot"
    if _reads_dpfp_scores(attention, k.table_a.shape[-1]):
        return "dpfp"
    return None


def _table_key_query_scores(attention: Attention, keys: KeyRows, q: Tensor, kind: str) -> Tensor:
    """The scores (B, 1, T, 1) of one query per sequence against keys as table rows."""
    query = q[:, 0, 0] if kind == "dot" else attention.phi(q, query=True)[:, 0, 0]
    nu = attention.feature_map.nu if kind == "dpfp" else 0
    scores = table_scores(keys, query, kind, nu)
    return scores.view(scores.shape[0], 1, scores.shape[1], 1)


def _reads_dpfp_scores(attention: FastWeightAttention, d_key: int) -> bool:
    """Whether one query's sum-rule scores are DPFP's key-space ones (:func:`dpfp_query_scores`):
    φ(k) is DPFP's own (a subclass whose ``forward`` maps keys otherwise, φ(k) = DPFP(k) + 1, was
    scored with DPFP(k))."""
    feature_map = attention.feature_map
    return (isinstance(feature_map, DPFP) and type(feature_map).forward is DPFP.forward and not attention.sum_normalize
            and feature_map.nu <= d_key)


def _key_query_scores(attention: FastWeightAttention, k: Tensor, q: Tensor) -> Tensor:
    """φ(k) φ(q)ᵀ (B, H, T, T_q) of a sum-rule read. DPFP with one query per sequence (Setting 1's
    training batches) takes :func:`dpfp_query_scores`, whose backward never forms the T × d_dot
    features or their gradient; other maps, and many queries, the product of the features."""
    phi_q = attention.phi(q, query=True)
    if q.shape[-2] == 1 and _reads_dpfp_scores(attention, k.shape[-1]):
        return dpfp_query_scores(k, phi_q, attention.feature_map.nu)
    dtype = compute_dtype(q, k)
    return attention.phi(k).to(dtype) @ phi_q.to(dtype).mT


def one_hot_codes(values: Tensor, S: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The one-hot codes (B, T, S) of value ids (B, T) in ``dtype``, written by a scatter into zeros
    (cheaper than gathering rows of an (S × S) identity)."""
    return torch.zeros(*values.shape, S, device=values.device, dtype=dtype).scatter_(-1, values[..., None], 1.0)
