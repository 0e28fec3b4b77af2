"""Attention modules behind one interface: softmax, and fast-weight attention with any φ and rule.

Every module maps already-projected queries, keys and values to outputs, and carries a state:

    attention = build_attention(spec, d_key, form="auto", chunk_size=None)   # settings chosen once
    y, state = attention(q, k, v, beta=None, state=None)

q, k: (B, H, T, d_key); v: (B, H, T, d_v); beta: (B, H, T) write strengths in (0, 1), required by
rules that use it (``attention.uses_beta``); y: (B, H, T, d_v). Passing the returned state into the
next call continues the sequence: two calls on a split sequence equal one call on all of it.

``write(k, v, beta, state)`` stores tokens without reading and ``read(q, state)`` queries the memory
without writing: the paper's view of a linear Transformer as a fast-weight programmer (Section 3),
used by the retrieval tasks, which write a sequence and then ask one query.

The attention ``form`` (``auto``, ``parallel``, ``chunk``, ``recurrent``) and ``chunk_size`` are
chosen when the module is built and kept on it (``attention.form``, ``attention.chunk_size``); every
call uses them. ``forward(..., form=, chunk_size=)`` and ``write(..., chunk_size=)`` accept a per-call
override for tests and streaming; task models never pass one.

An empty sequence (T = 0) is not an error: it returns an empty output (B, H, 0, d_v) and the state
unchanged. Bad calls raise :class:`VariantError` naming the argument: wrong rank, mismatched
B/H/T/D, dtypes or devices between q, k, v, β and the carried state; a state from another variant,
dtype or device. With ``check_finite`` on (``attention.check_finite = True``, or
:func:`variants.set_check_finite` on a whole model, as the harness does) a NaN or ±inf in q, k, v, β
or the state raises :class:`~variants.errors.NonFiniteError`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor, nn

from .checks import (
    check_dense,
    check_dtype_and_device,
    check_finite,
    check_key_size,
    check_state_position,
    check_state_recordable,
    check_state_tensor,
    recording_with_inference_state,
)
from .errors import VariantError, bad_value, true_or_false
from .feature_maps import FeatureMap, positive_int
from .kernels import softmax as softmax_kernels
from .kernels.chunking import DEFAULT_CHUNK_SIZE
from .kernels.precision import cat, compute_dtype, run_in_fp32
from .rules import UpdateRule, get_rule
from .state import FastWeightState, KVCacheState

FORMS = ("auto", "parallel", "chunk", "recurrent")
__all__ = ["DEFAULT_CHUNK_SIZE", "FORMS", "Attention", "FastWeightAttention", "SoftmaxAttention", "set_check_finite",
           "using_form"]


def write_read_path(form: str) -> str:
    """The path :meth:`Attention.write_read` takes for a module built with ``form``: ``write_read``
    (the rule's fused kernel) for ``auto``, ``write`` for ``chunk``, else the form itself."""
    return {"auto": "write_read", "chunk": "write"}.get(form, form)


def check_qkv(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, needs_beta: bool, rule: str = "delta") -> None:
    """Raise :class:`VariantError` unless q, k, v (and β) have consistent (B, H, T, D) shapes and β,
    where given, is a tensor (``needs_beta``: β is required, by the rule the messages name ``rule``)."""
    # write() and write_read() pass their keys as q too: name them k, the argument the caller gave
    # (a write of integer keys was refused as 'q.dtype', one of the wrong d_key as 'q: got d_key 3')
    named = (("k", k), ("v", v)) if q is k else (("q", q), ("k", k), ("v", v))
    for name, x in named:
        if isinstance(x, Tensor):
            check_dense(name, x)  # first: a nested tensor's shape raises
        if not hasattr(x, "dim") or x.dim() != 4:
            shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
            raise bad_value(name, shape, "a tensor of shape (B, H, T, D) with 4 dimensions")
        if not x.is_floating_point():
            raise bad_value(f"{name}.dtype", x.dtype, "a floating-point dtype")
    if q.shape[:3] != k.shape[:3] or k.shape[:3] != v.shape[:3]:
        got = ", ".join(f"{name} {tuple(x.shape)}" for name, x in named)
        raise VariantError(f"{', '.join(name for name, _ in named)}: (B, H, T) must agree; got {got}")
    if q.shape[-1] != k.shape[-1]:
        raise VariantError(f"q, k: d_key must agree; got q {q.shape[-1]}, k {k.shape[-1]}")
    # before the dtype and device checks, which read beta.dtype: a float or a list raised AttributeError
    # there, for every rule (the sum rule ignores β but checks what it is given)
    if beta is not None and not isinstance(beta, Tensor):
        # "or None" only where None is taken: a delta-rule user told it passed None, to be refused next
        needed = f" for the {rule} rule" if needs_beta else " or None"
        raise bad_value("beta", type(beta).__name__, f"a tensor of shape (B, H, T) = {tuple(k.shape[:3])}{needed}")
    if beta is not None:
        check_dense("beta", beta)
    if needs_beta:
        if beta is None:
            # the rule's own name: the FWM rule's answer said "for the delta rule"
            raise bad_value("beta", None, f"a tensor of shape (B, H, T) = {tuple(k.shape[:3])} for the {rule} rule")
        if tuple(beta.shape) != tuple(k.shape[:3]):
            raise bad_value("beta", tuple(beta.shape), f"shape (B, H, T) = {tuple(k.shape[:3])}")


def check_queries(q: Tensor, k: Tensor) -> None:
    """Raise :class:`VariantError` unless queries q (B, H, T_q, d_key) fit keys k (B, H, T, d_key)."""
    if not isinstance(q, Tensor) or q.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        shape = tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__
        expected = (*k.shape[:2], "T_q", k.shape[-1])
        raise bad_value("q", shape, f"a tensor of shape (B, H, T_q, d_key) = {expected}")


def check_queries_like_keys(q: Tensor, k: Tensor, same_compute_dtype: bool = False) -> None:
    """Raise :class:`VariantError` unless queries q of a write-then-read share the keys' device and dtype
    (``same_compute_dtype``: their compute dtype, fp32 for fp16, bf16 and fp32 alike, as a fast-weight
    :meth:`~FastWeightAttention.read` takes q beside the state that k wrote).

    :meth:`Attention.write_read` writes with k and reads with q. Unchecked, the fused sum- and delta-rule
    reads took q on another device than k (a meta q gave a CPU output; a CUDA q, a deep torch error) and
    q float64 against float32 keys, which every other form refused by the dtype of the state it had just
    written, an argument the caller never gave."""
    if q.device != k.device:
        raise bad_value("q.device", str(q.device), f"the device of k ({k.device})")
    if not same_compute_dtype:
        if q.dtype != k.dtype:
            raise VariantError(f"q.dtype: got {q.dtype}; expected the dtype of k ({k.dtype}): q, k and v must share "
                               "one dtype")
    elif compute_dtype(q) != compute_dtype(k):
        # fp16 or bf16 queries beside fp32 keys are the retrieval model's under autocast (its keys add an
        # fp32 table to a projection): a fast-weight read computes both in fp32, as read(q, write(k, v)) does
        alike = "torch.float64" if compute_dtype(k) == torch.float64 else "torch.float16, torch.bfloat16 or torch.float32"
        raise VariantError(f"q.dtype: got {q.dtype}; expected one computed in the dtype of k ({k.dtype}): {alike}")


def _kept_state(W: Tensor, z: Tensor | None, dtype: torch.dtype, state: FastWeightState | None,
                T: int) -> FastWeightState:
    """The state after T more tokens, W and z in the compute dtype ``dtype`` that :class:`FastWeightState`
    promises and the next call checks: under CPU autocast the chunked kernels' products come back in
    bf16/fp16, and a bf16 W carried to the next segment was refused ('state.W.dtype: got torch.bfloat16;
    expected torch.float32'). The cast is exact and leaves the outputs as they were."""
    return FastWeightState(W.to(dtype), None if z is None else z.to(dtype),
                           (0 if state is None else int(state.position)) + T)


def check_form(form: str, chunk_size: int | None) -> None:
    if form not in FORMS:
        raise bad_value("form", form, f"one of {', '.join(FORMS)}")
    if chunk_size is not None:
        positive_int("chunk_size", chunk_size)


class Attention(nn.Module):
    """Base class of every variant; see the module docstring for the calling convention."""

    #: whether ``forward`` and ``write`` need β (the delta rule)
    uses_beta = False
    #: raise NonFiniteError on NaN/inf in q, k, v, β or the state (one pass over them; off by default)
    check_finite = False

    def __init__(self, d_key: int, form: str = "auto", chunk_size: int | None = None):
        super().__init__()
        self.d_key = positive_int("d_key", d_key)
        check_form(form, chunk_size)
        #: the form every call runs (``auto``: the variant's fastest); chosen once, when built
        self.form = form
        #: the longest chunk of chunked kernels; ``None``: the rule's default for each path
        #: (:data:`DEFAULT_CHUNK_SIZE`, or a measured per-path value the rule declares)
        self.chunk_size = None if chunk_size is None else int(chunk_size)

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
        after storing every (k_t, v_t), through the module's form: ``parallel`` and ``recurrent``
        write with :meth:`forward` in that form, the others with :meth:`write`. Variants override it
        with a cheaper fused computation for ``auto``.

        Raises:
            VariantError: as :meth:`forward` for k, v and β; q not a floating (B, H, T_q, d_key) tensor
                of the keys' B, H, dtype and device."""
        self._check_write_read(k, v, q, beta)
        if write_read_path(self.form) in ("parallel", "recurrent"):
            _, state = self(k, k, v, beta=beta, state=state)
            return self.read(q, state)
        return self.read(q, self.write(k, v, beta, state))

    def _check_write_read(self, k: Tensor, v: Tensor, q: Tensor, beta: Tensor | None) -> None:
        """The checks of every :meth:`write_read`, whatever its path: keys and values as in a write,
        queries that fit them (:func:`check_queries`, :func:`check_queries_like_keys`)."""
        check_qkv(k, k, v, beta, self.uses_beta, getattr(self, "rule", "delta"))
        self._check_inputs(k, k, v, beta)
        self._check_query(q)
        check_queries(q, k)
        check_queries_like_keys(q, k, isinstance(self, FastWeightAttention))

    def _check_inputs(self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None) -> None:
        """Dtype, device and key-size checks every call makes after :func:`check_qkv`."""
        check_dtype_and_device(q, k, v, beta, "k" if q is k else "q")
        if q is not k:  # write() passes its keys as q
            check_key_size("q", q, self.d_key)
        check_key_size("k", k, self.d_key)

    def _check_query(self, q: Tensor) -> None:
        """Queries of :meth:`read`: a floating (B, H, T_q, d_key) tensor."""
        if isinstance(q, Tensor):
            check_dense("q", q)  # first: a nested tensor's shape raises
        if not isinstance(q, Tensor) or q.dim() != 4:
            shape = tuple(q.shape) if hasattr(q, "shape") else type(q).__name__
            raise bad_value("q", shape, "a tensor of shape (B, H, T, D) with 4 dimensions")
        if not q.is_floating_point():
            raise bad_value("q.dtype", q.dtype, "a floating-point dtype")
        check_key_size("q", q, self.d_key)


def _beta_for(beta: Tensor | None, x: Tensor) -> Tensor | None:
    """β in the compute dtype of the keys x (fp32, or float64 for float64 keys). β may come in another
    floating dtype (:func:`~variants.checks.check_dtype_and_device`), but the kernels compute in the widest
    dtype they are given: a float64 β beside fp32 q, k, v gave a float64 state, which the next call with
    the same inputs refused (two calls no longer equalled one) and the other forms' write-then-read too."""
    return None if beta is None else beta.to(compute_dtype(x))


class FastWeightAttention(Attention):
    """Linear attention as a fast-weight programmer: feature map φ plus an update rule.

    The rule (:mod:`variants.rules`) holds the kernels of each form, the state and whether β and
    sum normalisation are used; this module checks the calls and delegates. Built-in rules:
    ``"sum"``: W += v φ(k)ᵀ with the attention normaliser (paper Eq. 16–18).
    ``"delta"``: sum-normalised φ, W += β (v − W φ(k)) φ(k)ᵀ, y = W φ(q) (Eq. 23–26).
    ``"delta-unnorm"``: the delta rule on φ that is not sum-normalised (Section 4.2 ablation).
    ``"fwm"``: the FWM of Schlag et al. 2021 (ICLR): the delta-rule write on φ that is not
    sum-normalised, W rescaled by max(1, ‖W‖_F) after each write, y = LayerNorm(W φ(q)); it has
    only the recurrent form (``form="auto"`` picks it; ``"parallel"`` and ``"chunk"`` raise).

    ``sum_normalize`` overrides whether φ(k), φ(q) are divided by their sum (default: the rule's).
    ``rule="delta", sum_normalize=False`` is the ablation of paper Section 4.2: the write
    W += β (v − W φ(k)) φ(k)ᵀ is then only stable while β ‖φ(k)‖² < 2. ``form`` and ``chunk_size``:
    see :class:`Attention`.

    A learnable φ (or a subclass's :meth:`phi`) must hold its learnable tensors as ``nn.Parameter`` of
    this module or of the feature map (constants as buffers): under CPU autocast φ and the kernel run in
    one autograd node that routes gradients to the module's parameters only, so a plain tensor with
    ``requires_grad=True`` in an attribute or a closure gets no gradient there (it does without autocast).
    That node keeps φ's graph for every backward, so φ runs once a forward, as without autocast; see
    :func:`~variants.kernels.precision.run_in_fp32`.

    Raises:
        VariantError: for an unknown rule, a form the rule lacks, a ``sum_normalize`` that is not a
            bool or None, or for bad shapes, form, chunk size or state at call time.
    """

    def __init__(self, feature_map: FeatureMap, rule: str | UpdateRule = "sum", sum_normalize: bool | None = None,
                 form: str = "auto", chunk_size: int | None = None):
        super().__init__(feature_map.d_key, form, chunk_size)
        update_rule = get_rule(rule)
        if sum_normalize is not None:  # 'no' normalised silently
            update_rule = update_rule.with_sum_normalize(true_or_false("sum_normalize", sum_normalize))
        self.update_rule = update_rule
        self.feature_map = feature_map
        self._kernel_form(form)  # refuse, at construction, a form the rule has no kernel for

    @property
    def rule(self) -> str:
        """The rule family's name (``sum``, ``delta``, ``fwm``), as written in records."""
        return self.update_rule.name

    @property
    def uses_beta(self) -> bool:
        return self.update_rule.uses_beta

    @property
    def sum_normalize(self) -> bool:
        return self.update_rule.sum_normalize

    @property
    def d_dot(self) -> int:
        return self.feature_map.d_dot

    def redraw_features(self) -> None:
        self.feature_map.redraw_features()

    def state_nbytes(self, batch: int, n_heads: int, d_v: int, tokens: int) -> int:
        z = self.d_dot if self.update_rule.carries_normalizer else 0
        return 4 * batch * n_heads * (d_v * self.d_dot + z)

    def phi(self, x: Tensor, query: bool = False) -> Tensor:
        """φ applied to keys or queries, sum-normalised where the rule asks for it (the delta rule).
        A rule whose read divides by the normaliser zᵀφ(q) (the sum rule) cancels any positive
        factor per query token, so its queries (``query=True``) may carry one
        (:meth:`FeatureMap.for_queries`)."""
        if self.sum_normalize:
            return self.feature_map.normalized(x)
        if query and self.update_rule.carries_normalizer:
            return self.feature_map.for_queries(x)
        return self.feature_map(x)

    def _kernel_form(self, form: str) -> str:
        """The rule's kernel form that ``form`` runs; raises for a form the rule has no kernel for."""
        return self.update_rule.kernel_form(form)

    def _chunk_size(self, path: str, chunk_size: int | None) -> int:
        """The chunk size ``path`` runs with: the call's, else the module's, else the rule's default."""
        chosen = chunk_size if chunk_size is not None else self.chunk_size
        return chosen if chosen is not None else self.update_rule.default_chunk_size(path)

    def _check_state(self, state, B: int, H: int, d_v: int | None, device: torch.device, dtype: torch.dtype,
                     *inputs: Tensor | None) -> None:
        """``d_v``: the values' size, or ``None`` for a read, which has no values: any W's own d_v.
        ``inputs``: the call's tensors, for :func:`~variants.checks.check_state_recordable`."""
        if state is None:
            return
        if not isinstance(state, FastWeightState):
            raise bad_value("state", type(state).__name__, f"a FastWeightState from a {self.rule}-rule variant")
        check_state_position(state.position)
        if (state.z is not None) != self.update_rule.carries_normalizer:  # only the sum rule keeps z
            other, has_z = ("sum", "with") if state.z is not None else ("delta", "without")
            raise VariantError(
                f"state: got a FastWeightState from a {other}-rule variant ({has_z} normaliser z); "
                f"expected one from a {self.rule}-rule variant"
            )
        why = "fast-weight states are kept in the compute dtype: fp32, or float64 for float64 inputs"
        check_state_tensor("state.W", state.W, device, dtype, why)
        if d_v is None:  # a read: W's d_v, once W is known to be 4-D (read took W.shape[2] unchecked)
            d_v = state.W.shape[2] if state.W.dim() == 4 else "d_v"
        expected = (B, H, d_v, self.d_dot)
        if tuple(state.W.shape) != expected:
            raise bad_value("state.W", tuple(state.W.shape), f"shape (B, H, d_v, d_dot) = {expected}")
        if state.z is not None:
            check_state_tensor("state.z", state.z, device, dtype, why)
            if tuple(state.z.shape) != (B, H, self.d_dot):
                raise bad_value("state.z", tuple(state.z.shape), f"shape (B, H, d_dot) = {(B, H, self.d_dot)}")
        check_state_recordable((state.W, state.z), itertools.chain(inputs, self.parameters()))

    def _check_finite_values(self, state: FastWeightState | None, **tensors: Tensor | None) -> None:
        if self.check_finite:
            check_finite(**tensors, state_W=None if state is None else state.W,
                         state_z=None if state is None else state.z)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None = None,
        state: FastWeightState | None = None, form: str | None = None, chunk_size: int | None = None,
    ) -> tuple[Tensor, FastWeightState]:
        """Outputs (B, H, T, d_v) and the state after the last token; see the module docstring.
        ``form``/``chunk_size``: a per-call override of the module's (tests, streaming)."""
        check_qkv(q, k, v, beta, self.uses_beta, self.rule)
        form = self.form if form is None else form
        check_form(form, chunk_size)
        self._check_inputs(q, k, v, beta)
        kernel_form = self._kernel_form(form)
        B, H, T, _ = q.shape
        self._check_state(state, B, H, v.shape[-1], q.device, compute_dtype(q), q, k, v, beta)
        self._check_finite_values(state, q=q, k=k, v=v, beta=beta)
        W0, z0 = (None, None) if state is None else (state.W, state.z)
        kernel, size = self.update_rule.kernels[kernel_form], self._chunk_size(kernel_form, chunk_size)
        y, W, z = run_in_fp32(lambda q, k, v, beta, W0, z0: kernel(self.phi(q, query=True), self.phi(k), v, beta, W0, z0, size),
                              q, k, v, _beta_for(beta, q), W0, z0, params=self.parameters(), module=self)
        return y, _kept_state(W, z, compute_dtype(q), state, T)

    def write(
        self, k: Tensor, v: Tensor, beta: Tensor | None = None, state: FastWeightState | None = None,
        chunk_size: int | None = None,
    ) -> FastWeightState:
        """Store every (k_t, v_t) in the fast weight without computing outputs."""
        check_qkv(k, k, v, beta, self.uses_beta, self.rule)
        check_form("auto", chunk_size)
        self._check_inputs(k, k, v, beta)
        B, H, T, _ = k.shape
        self._check_state(state, B, H, v.shape[-1], k.device, compute_dtype(k), k, v, beta)
        self._check_finite_values(state, k=k, v=v, beta=beta)
        W0, z0 = (None, None) if state is None else (state.W, state.z)
        size = self._chunk_size("write", chunk_size)
        W, z = run_in_fp32(lambda k, v, beta, W0, z0: self.update_rule.write(self.phi(k), v, beta, W0, z0, size),
                           k, v, _beta_for(beta, k), W0, z0, params=self.parameters(), module=self)
        return _kept_state(W, z, compute_dtype(k), state, T)

    def write_read(self, k: Tensor, v: Tensor, q: Tensor, beta: Tensor | None = None,
                   state: FastWeightState | None = None) -> Tensor:
        """Write every (k_t, v_t), then read with q: (B, H, T_q, d_v) in fp32 (float64 for float64 inputs).

        Equal to ``read(q, write(k, v, beta, state))``. With the module's form ``auto`` the rule's
        fused kernel runs, which forms no fast weight W where the rule has one (the delta rule
        carries the queries back through the chunks, :func:`delta_rule_write_read`; the sum rule
        reads Vᵀ(Kq)): the fastest path for tasks that write a sequence and then ask a few queries
        (the retrieval tasks). With ``chunk`` it runs :meth:`write`; with ``parallel`` or
        ``recurrent`` it runs :meth:`forward` in that form, then :meth:`read`.
        """
        path = write_read_path(self.form)
        if path != "write_read":
            return super().write_read(k, v, q, beta, state)
        self._check_write_read(k, v, q, beta)
        self._check_state(state, k.shape[0], k.shape[1], v.shape[-1], k.device, compute_dtype(k), q, k, v, beta)
        self._check_finite_values(state, q=q, k=k, v=v, beta=beta)
        W0, z0 = (None, None) if state is None else (state.W, state.z)
        size = self._chunk_size("write_read", None)
        y, = run_in_fp32(lambda k, v, q, beta, W0, z0: (self.update_rule.write_read(
            self.phi(q, query=True), self.phi(k), v, beta, W0, z0, size),), k, v, q, _beta_for(beta, k), W0, z0,
            params=self.parameters(), module=self)
        return y

    def read(self, q: Tensor, state: FastWeightState) -> Tensor:
        """Query the memory, (B, H, T_q, d_key) → (B, H, T_q, d_v) in fp32 (float64 for float64
        inputs), writing nothing."""
        if state is None:
            raise bad_value("state", None, "the FastWeightState returned by write() or forward()")
        self._check_query(q)
        self._check_state(state, q.shape[0], q.shape[1], None, q.device, compute_dtype(q), q)
        self._check_finite_values(state, q=q)
        y, = run_in_fp32(lambda q, W, z: (self.update_rule.read(self.phi(q, query=True), W, z),), q, state.W, state.z,
                         params=self.parameters(), module=self)
        return y

    def extra_repr(self) -> str:
        return (f"rule={self.update_rule.key}, sum_normalize={self.sum_normalize}, form={self.form}, "
                f"chunk_size={self.chunk_size}")


class SoftmaxAttention(Attention):
    """Causal softmax attention; its carried state is a KV cache (optionally windowed).

    The parallel and chunk forms are one call to ``scaled_dot_product_attention``; the recurrent
    form attends one query at a time against the growing cache.
    """

    def __init__(self, d_key: int, window: int | None = None, form: str = "auto", chunk_size: int | None = None):
        super().__init__(d_key, form, chunk_size)
        self.window = None if window is None else positive_int("window", window)

    def state_nbytes(self, batch: int, n_heads: int, d_v: int, tokens: int) -> int:
        kept = tokens if self.window is None else min(tokens, self.window - 1)
        return 4 * batch * n_heads * kept * (self.d_key + d_v)

    def _check_state(self, state, q: Tensor, v: Tensor, *inputs: Tensor) -> KVCacheState | None:
        """The carried cache against q and v (a read passes the cache's v); ``inputs``: the call's other
        tensors. Returns the cache the call reads: ``state``, or a copy of one made under
        ``torch.inference_mode()`` where the call records autograd (autograd cannot save an inference tensor,
        and a cache is keys and values, no running sum whose history matters: a prompt read under
        inference_mode continues in a training step, as it did before row L119, in every form)."""
        if state is None:
            return None
        if not isinstance(state, KVCacheState):
            raise bad_value("state", type(state).__name__, "a KVCacheState from a softmax variant")
        check_state_position(state.position)
        why = "a KV cache continues a sequence of the same dtype"
        check_state_tensor("state.k", state.k, q.device, q.dtype, why)
        check_state_tensor("state.v", state.v, q.device, q.dtype, why)
        # the cache's own shapes first: a read passes state.v as v, and the kernels broadcast: a v cache
        # of B = 2 (or H = 2, or 3 dimensions) beside a k cache of B = 1 read an output of B = 2, and
        # one of another P raised deep in torch's bmm (so did forward and write, or kept it)
        if state.k.dim() != 4 or state.v.dim() != 4 or state.k.shape[:3] != state.v.shape[:3]:
            raise VariantError(
                f"state: cache k {tuple(state.k.shape)} / v {tuple(state.v.shape)} is not a KV cache; "
                "expected k (B, H, P, d_key) and v (B, H, P, d_v) with one B, H and P"
            )
        if state.k.shape[:2] != q.shape[:2] or state.k.shape[-1] != q.shape[-1] or state.v.shape[-1] != v.shape[-1]:
            raise VariantError(
                f"state: cache k {tuple(state.k.shape)} / v {tuple(state.v.shape)} does not fit "
                f"q {tuple(q.shape)} and v {tuple(v.shape)} (B, H and D must agree)"
            )
        if recording_with_inference_state((state.k, state.v), (q, v, *inputs)):
            state = KVCacheState(state.k.clone(), state.v.clone(), state.position)
        return state

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None = None,
        state: KVCacheState | None = None, form: str | None = None, chunk_size: int | None = None,
    ) -> tuple[Tensor, KVCacheState]:
        """Outputs and the KV cache after the last token; ``form``: a per-call override (the chunk
        size never acts: no softmax kernel is chunked)."""
        check_qkv(q, k, v, None, False)
        form = self.form if form is None else form
        check_form(form, chunk_size)
        self._check_inputs(q, k, v, None)
        state = self._check_state(state, q, v, k)
        if self.check_finite:
            check_finite(q=q, k=k, v=v, state_k=None if state is None else state.k,
                         state_v=None if state is None else state.v)
        k_cache = None if state is None else state.k
        v_cache = None if state is None else state.v
        kernel = softmax_kernels.softmax_recurrent if form == "recurrent" else softmax_kernels.softmax_parallel
        y, k_cache, v_cache = kernel(q, k, v, k_cache, v_cache, self.window)
        position = (0 if state is None else int(state.position)) + q.shape[2]
        return y, KVCacheState(k_cache, v_cache, position)

    def write(self, k: Tensor, v: Tensor, beta: Tensor | None = None, state: KVCacheState | None = None,
              chunk_size: int | None = None) -> KVCacheState:
        """Append keys and values to the cache (trimmed to the window, if any)."""
        check_qkv(k, k, v, None, False)
        check_form("auto", chunk_size)
        self._check_inputs(k, k, v, None)
        state = self._check_state(state, k, v)
        if self.check_finite:
            check_finite(k=k, v=v, state_k=None if state is None else state.k,
                         state_v=None if state is None else state.v)
        if state is not None:
            k, v = cat([state.k.to(k.dtype), k], dim=2), cat([state.v.to(v.dtype), v], dim=2)
        position = (0 if state is None else int(state.position)) + k.shape[2] - (0 if state is None else state.k.shape[2])
        if self.window is not None and k.shape[2] > self.window:  # a slice past 2**63: torch warned it truncated
            k, v = k[:, :, -self.window:], v[:, :, -self.window:]
        return KVCacheState(k, v, position)

    def write_read(self, k: Tensor, v: Tensor, q: Tensor, beta: Tensor | None = None, state=None) -> Tensor:
        """``read(q, write(k, v, beta, state))`` whatever the module's form: the cache is the keys and
        values themselves, which no form computes differently. (Writing with ``forward`` in the
        parallel or recurrent form, as other variants do, kept ``window − 1`` tokens, what the next
        token's query needs beside its own key, so under a window a read saw one key fewer than after
        :meth:`write`, and the retrieval task's answers changed with the form.)"""
        self._check_write_read(k, v, q, None)
        return self.read(q, self.write(k, v, beta, state))

    def read(self, q: Tensor, state: KVCacheState) -> Tensor:
        """Every query attends to every cached key (under a window, the last ``window``); nothing is written."""
        if state is None:
            raise bad_value("state", None, "the KVCacheState returned by write() or forward()")
        self._check_query(q)
        state = self._check_state(state, q, getattr(state, "v", q))
        if self.check_finite:
            check_finite(q=q, state_k=state.k, state_v=state.v)
        keys, values = state.k, state.v
        # a longer cache (a module's of no or a longer window) read every key, where write (write_read), forward
        # and the recurrent form keep the last `window`
        if self.window is not None and keys.shape[2] > self.window:
            keys, values = keys[:, :, -self.window:], values[:, :, -self.window:]
        return softmax_kernels.softmax_read(q, keys, values)

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, window={self.window}, form={self.form}"


def check_module(module: object) -> None:
    """Raise :class:`VariantError` unless ``module`` is an ``nn.Module`` (a model to walk for attention
    modules): an int or a bare Attention's state raised AttributeError ('modules')."""
    if not isinstance(module, nn.Module):
        raise bad_value("module", type(module).__name__, "a torch.nn.Module (a model or an attention module)")


def set_check_finite(module: nn.Module, enabled: bool = True) -> int:
    """Switch the NaN/inf input check on (or off) in every attention module inside ``module``.

    Returns the number of attention modules changed. The check makes each call raise
    :class:`NonFiniteError` when q, k, v, β or the carried state holds a NaN or ±inf.

    Raises:
        VariantError: ``module`` not an ``nn.Module``, or ``enabled`` not a bool (``"no"`` switched
            the check on).
    """
    check_module(module)
    if not isinstance(enabled, (bool, np.bool_)):
        raise bad_value("enabled", enabled, "True or False")
    changed = 0
    for sub in module.modules():
        if isinstance(sub, Attention):
            sub.check_finite = bool(enabled)
            changed += 1
    return changed


@contextmanager
def using_form(module: nn.Module, form: str) -> Iterator[int]:
    """Run every attention module inside ``module`` in ``form`` for the ``with`` block, then restore
    the forms they were built with (generation reads a prompt in the model's form, then samples token
    by token in the recurrent form). Yields the number of attention modules switched.

    Raises:
        VariantError: ``module`` not an ``nn.Module``; ``form`` outside :data:`FORMS`, or one a
            module's rule has no kernel for.
    """
    check_module(module)
    check_form(form, None)
    modules = [sub for sub in module.modules() if isinstance(sub, Attention)]
    for sub in modules:
        if isinstance(sub, FastWeightAttention):
            sub._kernel_form(form)
    before = [sub.form for sub in modules]
    try:
        for sub in modules:
            sub.form = form
        yield len(modules)
    finally:
        for sub, form_before in zip(modules, before):
            sub.form = form_before
