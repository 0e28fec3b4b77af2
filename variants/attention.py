"""Attention modules behind one interface: softmax, and fast-weight attention with any φ and rule.

Every module maps already-projected queries, keys and values to outputs, and carries a state:

    y, state = attention(q, k, v, beta=None, state=None, form="auto")

q, k: (B, H, T, d_key); v: (B, H, T, d_v); beta: (B, H, T) write strengths in (0, 1), required by
rules that use it (``attention.uses_beta``); y: (B, H, T, d_v). Passing the returned state into the
next call continues the sequence: two calls on a split sequence equal one call on all of it.

``write(k, v, beta, state)`` stores tokens without reading and ``read(q, state)`` queries the memory
without writing: the paper's view of a linear Transformer as a fast-weight programmer (Section 3),
used by the retrieval tasks, which write a sequence and then ask one query.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .errors import VariantError, bad_value
from .feature_maps import FeatureMap, positive_int
from .kernels import delta_rule as delta_kernels
from .kernels import softmax as softmax_kernels
from .kernels import sum_rule as sum_kernels
from .state import FastWeightState, KVCacheState

FORMS = ("auto", "parallel", "chunk", "recurrent")
#: Chunk size of the chunk form when none is given (chosen by ``fwbench bench`` on CPU).
DEFAULT_CHUNK_SIZE = 64


def check_qkv(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, needs_beta: bool) -> None:
    """Raise :class:`VariantError` unless q, k, v (and β) have consistent (B, H, T, D) shapes."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "dim") or x.dim() != 4:
            shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
            raise bad_value(name, shape, "a tensor of shape (B, H, T, D) with 4 dimensions")
        if not x.is_floating_point():
            raise bad_value(f"{name}.dtype", x.dtype, "a floating-point dtype")
    if q.shape[:3] != k.shape[:3] or k.shape[:3] != v.shape[:3]:
        raise VariantError(
            f"q, k, v: (B, H, T) must agree; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise VariantError(f"q, k: d_key must agree; got q {q.shape[-1]}, k {k.shape[-1]}")
    if needs_beta:
        if beta is None:
            raise bad_value("beta", None, f"a tensor of shape (B, H, T) = {tuple(k.shape[:3])} for the delta rule")
        if tuple(beta.shape) != tuple(k.shape[:3]):
            raise bad_value("beta", tuple(beta.shape), f"shape (B, H, T) = {tuple(k.shape[:3])}")


def check_queries(q: Tensor, k: Tensor) -> None:
    """Raise :class:`VariantError` unless queries q (B, H, T_q, d_key) fit keys k (B, H, T, d_key)."""
    if not isinstance(q, Tensor) or q.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        shape = tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__
        expected = (*k.shape[:2], "T_q", k.shape[-1])
        raise bad_value("q", shape, f"a tensor of shape (B, H, T_q, d_key) = {expected}")


def check_form(form: str, chunk_size: int | None) -> None:
    if form not in FORMS:
        raise bad_value("form", form, f"one of {', '.join(FORMS)}")
    if chunk_size is not None:
        positive_int("chunk_size", chunk_size)


class Attention(nn.Module):
    """Base class of every variant; see the module docstring for the calling convention."""

    #: whether ``forward`` and ``write`` need β (the delta rule)
    uses_beta = False

    def __init__(self, d_key: int):
        super().__init__()
        self.d_key = positive_int("d_key", d_key)

    @property
    def d_dot(self) -> int | None:
        """Size of φ's output, the fast weight's column count; ``None`` for softmax."""
        return None

    def redraw_features(self) -> None:
        """Draw new random features, where the variant has any (FAVOR+); else nothing."""

    def state_nbytes(self, batch: int, n_heads: int, d_v: int, tokens: int) -> int:
        """Bytes of fp32 state after ``tokens`` tokens (constant for fast weights)."""
        raise NotImplementedError

    def write_read(self, k: Tensor, v: Tensor, q: Tensor, beta: Tensor | None = None, state=None) -> Tensor:
        """``read(q, write(k, v, beta, state))``: the memory's answer (B, H, T_q, d_v) to queries q
        after storing every (k_t, v_t). Variants override it with a cheaper fused computation."""
        return self.read(q, self.write(k, v, beta, state))


class FastWeightAttention(Attention):
    """Linear attention as a fast-weight programmer: feature map φ plus an update rule.

    ``rule="sum"``: W += v φ(k)ᵀ with the attention normaliser (paper Eq. 16–18).
    ``rule="delta"``: sum-normalised φ, W += β (v − W φ(k)) φ(k)ᵀ, y = W φ(q) (Eq. 23–26).

    Raises:
        VariantError: for an unknown rule, or for bad shapes, form, chunk size or state at call time.
    """

    RULES = ("sum", "delta")

    def __init__(self, feature_map: FeatureMap, rule: str = "sum"):
        super().__init__(feature_map.d_key)
        if rule not in self.RULES:
            raise bad_value("rule", rule, f"one of {', '.join(self.RULES)}")
        self.feature_map = feature_map
        self.rule = rule
        self.uses_beta = rule == "delta"

    @property
    def d_dot(self) -> int:
        return self.feature_map.d_dot

    def redraw_features(self) -> None:
        self.feature_map.redraw_features()

    def state_nbytes(self, batch: int, n_heads: int, d_v: int, tokens: int) -> int:
        z = 0 if self.rule == "delta" else self.d_dot
        return 4 * batch * n_heads * (d_v * self.d_dot + z)

    def phi(self, x: Tensor) -> Tensor:
        """φ applied to keys or queries, sum-normalised for the delta rule."""
        return self.feature_map.normalized(x) if self.rule == "delta" else self.feature_map(x)

    def _check_state(self, state, B: int, H: int, d_v: int) -> None:
        if state is None:
            return
        if not isinstance(state, FastWeightState) or (state.z is None) != (self.rule == "delta"):
            kind = "FastWeightState without z" if self.rule == "delta" else "FastWeightState with z"
            raise bad_value("state", type(state).__name__, f"a {kind} from a {self.rule}-rule variant")
        expected = (B, H, d_v, self.d_dot)
        if tuple(state.W.shape) != expected:
            raise bad_value("state.W", tuple(state.W.shape), f"shape (B, H, d_v, d_dot) = {expected}")

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None = None,
        state: FastWeightState | None = None, form: str = "auto", chunk_size: int | None = None,
    ) -> tuple[Tensor, FastWeightState]:
        """Outputs (B, H, T, d_v) and the state after the last token; see the module docstring."""
        check_qkv(q, k, v, beta, self.uses_beta)
        check_form(form, chunk_size)
        B, H, T, _ = q.shape
        self._check_state(state, B, H, v.shape[-1])
        chunk_size = chunk_size or DEFAULT_CHUNK_SIZE
        pq, pk = self.phi(q), self.phi(k)
        W0 = None if state is None else state.W
        position = (0 if state is None else state.position) + T
        if self.rule == "sum":
            z0 = None if state is None else state.z
            if form == "parallel":
                y, W, z = sum_kernels.sum_rule_parallel(pq, pk, v, W0, z0)
            elif form == "recurrent":
                y, W, z = sum_kernels.sum_rule_recurrent(pq, pk, v, W0, z0)
            else:
                y, W, z = sum_kernels.sum_rule_chunk(pq, pk, v, W0, z0, chunk_size=chunk_size)
            return y, FastWeightState(W, z, position)
        if form == "parallel":
            y, W = delta_kernels.delta_rule_parallel(pq, pk, v, beta, W0)
        elif form == "recurrent":
            y, W = delta_kernels.delta_rule_recurrent(pq, pk, v, beta, W0)
        else:
            y, W = delta_kernels.delta_rule_chunk(pq, pk, v, beta, W0, chunk_size=chunk_size)
        return y, FastWeightState(W, None, position)

    def write(
        self, k: Tensor, v: Tensor, beta: Tensor | None = None, state: FastWeightState | None = None,
        chunk_size: int | None = None,
    ) -> FastWeightState:
        """Store every (k_t, v_t) in the fast weight without computing outputs."""
        check_qkv(k, k, v, beta, self.uses_beta)
        B, H, T, _ = k.shape
        self._check_state(state, B, H, v.shape[-1])
        pk = self.phi(k)
        W0 = None if state is None else state.W
        position = (0 if state is None else state.position) + T
        if self.rule == "sum":
            W, z = sum_kernels.sum_rule_write(pk, v, W0, None if state is None else state.z)
            return FastWeightState(W, z, position)
        _, W = delta_kernels.delta_rule_chunk(None, pk, v, beta, W0, chunk_size or DEFAULT_CHUNK_SIZE)
        return FastWeightState(W, None, position)

    def write_read(self, k: Tensor, v: Tensor, q: Tensor, beta: Tensor | None = None,
                   state: FastWeightState | None = None) -> Tensor:
        """Write every (k_t, v_t), then read with q, without forming the fast weight W.

        Equal to ``read(q, write(k, v, beta, state))``. The delta rule carries the queries back
        through the chunks instead of carrying W forward (:func:`delta_rule_write_read`), so no
        (d_dot × d_v) state is formed: the fastest path for tasks that write a sequence and then
        ask a few queries (the retrieval tasks). Returns (B, H, T_q, d_v) fp32.
        """
        check_qkv(k, k, v, beta, self.uses_beta)
        check_queries(q, k)
        self._check_state(state, k.shape[0], k.shape[1], v.shape[-1])
        pq, pk = self.phi(q), self.phi(k)
        W0 = None if state is None else state.W
        if self.rule == "sum":
            return sum_kernels.sum_rule_write_read(pq, pk, v, W0, None if state is None else state.z)
        return delta_kernels.delta_rule_write_read(pq, pk, v, beta, W0)

    def read(self, q: Tensor, state: FastWeightState) -> Tensor:
        """Query the memory, (B, H, T_q, d_key) → (B, H, T_q, d_v) in fp32, writing nothing."""
        if state is None:
            raise bad_value("state", None, "the FastWeightState returned by write() or forward()")
        self._check_state(state, q.shape[0], q.shape[1], state.W.shape[2])
        pq = self.phi(q)
        if self.rule == "sum":
            return sum_kernels.sum_rule_read(pq, state.W, state.z)
        return delta_kernels.delta_rule_read(pq, state.W)

    def extra_repr(self) -> str:
        return f"rule={self.rule}"


class SoftmaxAttention(Attention):
    """Causal softmax attention; its carried state is a KV cache (optionally windowed).

    The parallel and chunk forms are one call to ``scaled_dot_product_attention``; the recurrent
    form attends one query at a time against the growing cache.
    """

    def __init__(self, d_key: int, window: int | None = None):
        super().__init__(d_key)
        self.window = None if window is None else positive_int("window", window)

    def state_nbytes(self, batch: int, n_heads: int, d_v: int, tokens: int) -> int:
        kept = tokens if self.window is None else min(tokens, self.window - 1)
        return 4 * batch * n_heads * kept * (self.d_key + d_v)

    def _check_state(self, state, q: Tensor, v: Tensor) -> None:
        if state is None:
            return
        if not isinstance(state, KVCacheState):
            raise bad_value("state", type(state).__name__, "a KVCacheState from a softmax variant")
        if state.k.shape[:2] != q.shape[:2] or state.k.shape[-1] != q.shape[-1] or state.v.shape[-1] != v.shape[-1]:
            raise VariantError(
                f"state: cache k {tuple(state.k.shape)} / v {tuple(state.v.shape)} does not fit "
                f"q {tuple(q.shape)} and v {tuple(v.shape)} (B, H and D must agree)"
            )

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None = None,
        state: KVCacheState | None = None, form: str = "auto", chunk_size: int | None = None,
    ) -> tuple[Tensor, KVCacheState]:
        check_qkv(q, k, v, None, False)
        check_form(form, chunk_size)
        self._check_state(state, q, v)
        k_cache = None if state is None else state.k
        v_cache = None if state is None else state.v
        kernel = softmax_kernels.softmax_recurrent if form == "recurrent" else softmax_kernels.softmax_parallel
        y, k_cache, v_cache = kernel(q, k, v, k_cache, v_cache, self.window)
        position = (0 if state is None else state.position) + q.shape[2]
        return y, KVCacheState(k_cache, v_cache, position)

    def write(self, k: Tensor, v: Tensor, beta: Tensor | None = None, state: KVCacheState | None = None,
              chunk_size: int | None = None) -> KVCacheState:
        """Append keys and values to the cache (trimmed to the window, if any)."""
        check_qkv(k, k, v, None, False)
        self._check_state(state, k, v)
        if state is not None:
            k, v = torch.cat([state.k.to(k.dtype), k], dim=2), torch.cat([state.v.to(v.dtype), v], dim=2)
        position = (0 if state is None else state.position) + k.shape[2] - (0 if state is None else state.k.shape[2])
        if self.window is not None:
            k, v = k[:, :, -self.window:], v[:, :, -self.window:]
        return KVCacheState(k, v, position)

    def read(self, q: Tensor, state: KVCacheState) -> Tensor:
        """Every query attends to every cached key; nothing is written."""
        if state is None:
            raise bad_value("state", None, "the KVCacheState returned by write() or forward()")
        return softmax_kernels.softmax_read(q, state.k, state.v)

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, window={self.window}"
