"""The chunk forms of the sum and delta rules on CUDA through fla-core's Triton kernels, where they can
serve the call; our own chunk kernels everywhere else.

fla-core (``pip install fwbench[gpu]``; triton comes with torch's CUDA builds) ships chunkwise kernels for both rules:
``fla.ops.simple_gla.chunk_simple_gla`` (linear attention with an optional gate; without one it is the
sum rule's numerator W_t q_t) and ``fla.ops.delta_rule.chunk_delta_rule`` (the delta rule in the same
UT-transform form as ours, Yang et al. 2024). Their contract (fla-core 0.6.0) differs from ours in
four ways, all translated here:

- layout: fla's tensors are (B, T, H, D) and β (B, T, H); ours are (B, H, T, D) and (B, H, T);
- scale: fla multiplies q by ``scale``, d_key^−½ when not given; the paper's rules have none, so
  ``scale=1.0`` is always passed;
- state: fla's state is S = Wᵀ (B, H, d_dot, d_v) in fp32; ours is W (B, H, d_v, d_dot);
- normaliser: fla's linear attention adds 1e-10 to zᵀq and sums the keys in their own dtype. The sum
  rule's normaliser is therefore computed here, in fp32, as in :mod:`.sum_rule` (z_t = z_0 + Σ_{s≤t}
  k_s, y_t = W_t q_t / max(z_tᵀ q_t, floor)); only the numerator W_t q_t comes from fla. It is an
  O(T·d_dot) element-wise pass beside fla's matmuls.

Which calls fla serves (:func:`decide`, each refusal with its reason):

- the module-level switch: ``FWBENCH_FLA=0`` in the environment (read on first use; any value but
  1/on/true/yes, 0/off/false/no or unset is a ``VariantError``) or :func:`set_fla_enabled` turns the
  dispatch off;
- CUDA tensors only, and fla's kernels must import (they need triton);
- float64 → ours: fla computes in fp32 at most; gradcheck and the float64 references need ours;
- fla runs in v's dtype (the model's; fla asserts one dtype for q, k, v): φ(q), φ(k), which the
  feature maps return in fp32 for fp16/bf16 inputs, are rounded to it (a relative error of 2⁻⁹ in
  bf16, the rounding any bf16 model applies before fla's kernels); the sum rule's normaliser uses the
  fp32 φ. q or k in another 16-bit dtype than v → ours;
- float32: the delta rule → ours (fla's ``chunk_delta_rule`` rejects fp32); the sum rule → fla only
  while fp32 matmuls may use TF32 (``torch.backends.cuda.matmul.allow_tf32``, e.g. after
  ``torch.set_float32_matmul_precision("high")``), since Triton's fp32 dots round their inputs to TF32
  (10-bit mantissa): with TF32 off the caller asked for full fp32 products, which only ours give;
- d_dot > 256 with the delta rule → ours (fla's state kernel holds d_dot in one tile of ≤ 256);
- fp16/bf16 with an odd d_dot or d_v → ours (fla's backward asserts even sizes in 16-bit);
- T = 0 → ours (nothing to compute).

Differences that remain on the fla path (documented, not checked per call, since a check would cost a
host synchronisation every step): fla's tiling is its own (chunk size 64; our ``chunk_size`` only
changes rounding); its backward is first-order only (no ``create_graph``); and a NaN or ±inf token may
reach earlier outputs of its chunk, where our kernels keep non-finite values causal
(:func:`~.precision.causal_matmul`) — the harness's ``check_finite`` raises on such inputs first.
In fp16/bf16 fla keeps the per-chunk states of the sum rule in the input dtype, so its outputs carry
16-bit rounding of the state (of order 2⁻⁸ relative) where ours accumulate it in fp32.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ..errors import VariantError
from . import delta_rule, sum_rule
from .chunking import DEFAULT_CHUNK_SIZE
from .limits import floor_for

#: Environment variable whose value ``0`` turns the dispatch off (read once, on first use).
FLA_ENV = "FWBENCH_FLA"
#: Largest d_dot fla's delta-rule state kernel accepts (``fla/ops/common/chunk_delta_h.py``).
FLA_DELTA_MAX_D_DOT = 256
#: Device types the dispatch sends to fla (tests widen it to run a CPU stand-in of fla's contract).
FLA_DEVICE_TYPES: tuple[str, ...] = ("cuda",)
#: Dtypes fla's kernels compute in natively.
HALF_DTYPES = (torch.float16, torch.bfloat16)

_SWITCH_ON, _SWITCH_OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
#: the switch: ``None`` until :func:`fla_enabled` first reads ``FWBENCH_FLA``
_enabled: bool | None = None


class FlaKernels(NamedTuple):
    """fla's two chunk kernels: ``sum`` is ``chunk_simple_gla``, ``delta`` is ``chunk_delta_rule``."""

    sum: Callable
    delta: Callable


class Decision(NamedTuple):
    """Where one chunk-form call runs: ``backend`` is ``"fla"`` or ``"ours"``; ``reason`` says why."""

    backend: str
    reason: str

    @property
    def uses_fla(self) -> bool:
        return self.backend == "fla"


def set_fla_enabled(enabled: bool) -> None:
    """Turn the fla dispatch on or off for this process, whatever ``FWBENCH_FLA`` says."""
    global _enabled
    _enabled = bool(enabled)


def fla_enabled() -> bool:
    """Whether the dispatch may send calls to fla (the module-level switch; fla may still be absent).

    Read from ``FWBENCH_FLA`` on first use (1/on/true/yes or unset: on; 0/off/false/no: off), unless
    :func:`set_fla_enabled` was called first.

    Raises:
        VariantError: ``FWBENCH_FLA`` holds anything else.
    """
    global _enabled
    if _enabled is None:
        setting = os.environ.get(FLA_ENV, "1").strip().lower()
        if setting not in _SWITCH_ON + _SWITCH_OFF:
            raise VariantError(f"${FLA_ENV}: got {os.environ[FLA_ENV]!r}; expected 1 (on, the default) or 0 (off)")
        _enabled = setting in _SWITCH_ON
    return _enabled


@functools.cache
def load_fla_kernels() -> tuple[FlaKernels | None, str]:
    """fla's Triton kernels, or ``None`` and why they cannot be imported (cached; imports fla once)."""
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as exc:  # ImportError without triton or fla; anything fla raises on import
        return None, f"fla's Triton kernels cannot be imported ({type(exc).__name__}: {exc}); pip install fwbench[gpu]"
    return FlaKernels(sum=chunk_simple_gla, delta=chunk_delta_rule), ""


def tf32_allowed() -> bool:
    """Whether fp32 CUDA matmuls may round to TF32 (``torch.backends.cuda.matmul.allow_tf32``)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def decide(rule: str, q: Tensor, k: Tensor, v: Tensor) -> Decision:
    """Whether fla serves a chunk-form call of ``rule`` (``"sum"`` or ``"delta"``) on these inputs.

    Args:
        q, k: (B, H, T, d_dot) φ-mapped queries and keys; v: (B, H, T, d_v).

    Returns a :class:`Decision`; the rules are listed in the module docstring, checked in that order.
    Never synchronises with the device (shapes, dtypes and devices only).

    Raises:
        VariantError: ``FWBENCH_FLA`` is neither on nor off (:func:`fla_enabled`).
    """
    if not fla_enabled():
        return Decision("ours", f"the fla dispatch is off ({FLA_ENV}=0 or set_fla_enabled(False))")
    if q.device.type not in FLA_DEVICE_TYPES:
        return Decision("ours", f"tensors on {q.device.type}, fla's kernels run on CUDA")
    kernels, why_not = load_fla_kernels()
    if kernels is None:
        return Decision("ours", why_not)
    dtype = v.dtype  # the model's dtype: φ(q), φ(k) come from the feature maps in fp32 (or float64)
    if torch.float64 in (q.dtype, k.dtype, dtype):
        return Decision("ours", "float64: fla computes in fp32 at most")
    if q.dtype not in (dtype, torch.float32) or k.dtype not in (dtype, torch.float32) or (
            dtype == torch.float32 and q.dtype != k.dtype):
        return Decision("ours", f"q, k, v dtypes {q.dtype}, {k.dtype}, {dtype}: fla takes φ in v's dtype or fp32")
    if dtype == torch.float32 and rule == "delta":
        return Decision("ours", "float32: fla's chunk_delta_rule accepts fp16/bf16 only")
    if dtype == torch.float32 and not tf32_allowed():
        return Decision("ours", "float32 with TF32 matmuls off: fla's Triton dots would round to TF32")
    if dtype not in (*HALF_DTYPES, torch.float32):
        return Decision("ours", f"dtype {dtype}: fla takes fp16, bf16 or fp32")
    d_dot, d_v = k.shape[-1], v.shape[-1]
    if rule == "delta" and d_dot > FLA_DELTA_MAX_D_DOT:
        return Decision("ours", f"d_dot {d_dot} > {FLA_DELTA_MAX_D_DOT}: beyond fla's delta-rule state kernel")
    if dtype in HALF_DTYPES and (d_dot % 2 or d_v % 2):
        return Decision("ours", f"odd d_dot {d_dot} or d_v {d_v} in {dtype}: fla's backward needs even sizes")
    if k.shape[2] == 0:
        return Decision("ours", "T = 0: nothing to compute")
    return Decision("fla", f"fla's {'chunk_delta_rule' if rule == 'delta' else 'chunk_simple_gla'} on CUDA")


def _bthd(x: Tensor) -> Tensor:
    """(B, H, T, ·) ↔ (B, T, H, ·), contiguous: fla's layout; β (B, H, T) ↔ (B, T, H) alike."""
    return x.transpose(1, 2).contiguous()


def _fla_state(W0: Tensor | None) -> Tensor | None:
    """Our W (B, H, d_v, d_dot) as fla's initial state S = Wᵀ (B, H, d_dot, d_v) fp32."""
    return None if W0 is None else W0.to(torch.float32).mT.contiguous()


def fla_sum_rule_chunk(
    kernel: Callable, q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    normalize: bool = True, floor: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The sum rule's chunk form with the numerator from fla's ``chunk_simple_gla`` (``kernel``).

    Same contract as :func:`~.sum_rule.sum_rule_chunk`: q, k (B, H, T, d_dot), v (B, H, T, d_v), W0
    (B, H, d_v, d_dot), z0 (B, H, d_dot) or ``None``; returns (y (B, H, T, d_v) in v's dtype, W_T fp32,
    z_T fp32). fla runs in v's dtype (q, k rounded to it); the normaliser is ours, in fp32 from the
    unrounded q, k (module docstring); no gate, ``scale=1.0``.
    """
    numerator, S = kernel(_bthd(q.to(v.dtype)), _bthd(k.to(v.dtype)), _bthd(v), g=None, scale=1.0,
                          initial_state=_fla_state(W0), output_final_state=True)
    numerator = numerator.transpose(1, 2)                                   # (B, H, T, d_v)
    k32 = k.to(torch.float32)
    z_T = k32.sum(dim=2) if z0 is None else z0.to(torch.float32) + k32.sum(dim=2)
    y = numerator
    if normalize:
        z_t = k32.cumsum(dim=2)                                             # Σ_{s≤t} k_s
        if z0 is not None:
            z_t = z_t + z0.to(torch.float32)[:, :, None]
        mass = (q.to(torch.float32) * z_t).sum(-1, keepdim=True)           # z_tᵀ q_t
        y = numerator.to(torch.float32) / mass.clamp(min=floor_for(torch.float32, floor))  # fla: fp32 at most
    return y.to(v.dtype), S.to(torch.float32).mT, z_T


def fla_delta_rule_chunk(
    kernel: Callable, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The delta rule's chunk form by fla's ``chunk_delta_rule`` (``kernel``).

    Same contract as :func:`~.delta_rule.delta_rule_chunk` with a query: q, k (B, H, T, d_dot)
    sum-normalised φ-mapped, v (B, H, T, d_v), beta (B, H, T), W0 (B, H, d_v, d_dot) or ``None``;
    returns (y (B, H, T, d_v) in v's dtype, W_T (B, H, d_v, d_dot) fp32). fla runs in v's dtype (q, k,
    β rounded to it); ``scale=1.0``, no L2 norm.
    """
    y, S = kernel(*(_bthd(x.to(v.dtype)) for x in (q, k, v, beta)), scale=1.0,
                  initial_state=_fla_state(W0), output_final_state=True, use_qk_l2norm_in_kernel=False)
    return y.transpose(1, 2).to(v.dtype), S.to(torch.float32).mT


def sum_rule_chunk_dispatch(
    q: Tensor, k: Tensor, v: Tensor, W0: Tensor | None = None, z0: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor, Tensor]:
    """The sum rule's normalised chunk form: fla's kernel where :func:`decide` allows, else
    :func:`~.sum_rule.sum_rule_chunk`. Shapes and returns as there."""
    if decide("sum", q, k, v).uses_fla:
        return fla_sum_rule_chunk(load_fla_kernels()[0].sum, q, k, v, W0, z0)
    return sum_rule.sum_rule_chunk(q, k, v, W0, z0, chunk_size=chunk_size)


def delta_rule_chunk_dispatch(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Tensor, Tensor]:
    """The delta rule's chunk form: fla's kernel where :func:`decide` allows, else
    :func:`~.delta_rule.delta_rule_chunk`. Shapes and returns as there (q is required)."""
    if decide("delta", q, k, v).uses_fla:
        return fla_delta_rule_chunk(load_fla_kernels()[0].delta, q, k, v, beta, W0)
    return delta_rule.delta_rule_chunk(q, k, v, beta, W0, chunk_size=chunk_size)
