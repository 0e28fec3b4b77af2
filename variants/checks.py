"""Checks on what a caller hands an attention module, beyond shapes: dtype and device agreement,
the key size the module was built for, carried states from another dtype or device, and
(optionally) NaN/inf values.

Every check raises :class:`~variants.errors.VariantError` naming the argument, the value received
and what is allowed. The value check (:func:`check_finite`) reads every element, so it costs one
pass over the inputs (and a device synchronisation on GPU); it is off by default in the library and
switched on by the harness (``fwbench.run.training.fit``) with :func:`set_check_finite`, so that a run
that goes non-finite is stopped at the first bad tensor, named, and recorded as diverged.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import torch
from torch import Tensor

from .errors import NonFiniteError, VariantError, bad_value


def check_dense(name: str, x: Tensor) -> None:
    """Raise :class:`VariantError` unless ``x`` is a dense (strided) tensor: a sparse q, v, β, state or
    layer input raised NotImplementedError or "reshape is not implemented for sparse tensors" from
    inside the kernels (and every kernel reshapes, slices and multiplies dense rows). Run it before
    reading ``x.shape``: a nested tensor (``torch.nested``, strided or jagged) has none, and its
    sizes raised "Internal error: NestedTensorImpl doesn't support sizes" from the checks themselves."""
    if x.is_nested:  # strided nested tensors pass the layout test; neither kind has .to_dense()
        raise VariantError(f"{name}: got a nested tensor (layout {x.layout}); expected a dense tensor "
                           "(torch.strided); pad it with .to_padded_tensor(0.0)")
    if x.layout != torch.strided:
        raise bad_value(f"{name}.layout", x.layout, "a dense tensor (torch.strided); convert it with .to_dense()")


def check_dtype_and_device(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, reference: str = "q") -> None:
    """q, k and v must share one dtype; q, k, v and β must live on one device. ``reference``: the name
    the messages give q (``"k"`` for a write, which passes its keys as q).

    β may have another floating dtype (the modules read it in the compute dtype of q, k, v: fp32, or
    float64 for float64 inputs), but not another device.
    """
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise VariantError(f"{name}.dtype: got {x.dtype}; expected the dtype of {reference} ({q.dtype}): "
                               "q, k and v must share one dtype")
    for name, x in (("k", k), ("v", v), ("beta", beta)):
        if x is not None and x.device != q.device:
            raise bad_value(f"{name}.device", str(x.device), f"the device of {reference} ({q.device})")
    if beta is not None and not beta.is_floating_point():
        raise bad_value("beta.dtype", beta.dtype, "a floating-point dtype (write strengths in (0, 1))")


def check_key_size(name: str, x: Tensor, d_key: int) -> None:
    """The last axis of queries and keys must be the ``d_key`` the module was built for."""
    if x.shape[-1] != d_key:
        raise VariantError(
            f"{name}: got d_key {x.shape[-1]} (last dimension of shape {tuple(x.shape)}); "
            f"expected {d_key}, the d_key this attention was built for"
        )


def check_state_tensor(name: str, x: Tensor, device: torch.device, dtype: torch.dtype, why: str) -> None:
    """A carried state's tensor must be on the inputs' device and of the dtype the module keeps."""
    if not isinstance(x, Tensor):
        raise bad_value(name, type(x).__name__, "a tensor")
    check_dense(name, x)
    if x.device != device:
        raise bad_value(f"{name}.device", str(x.device), f"the device of q ({device}); move the state with .to()")
    if x.dtype != dtype:
        raise VariantError(f"{name}.dtype: got {x.dtype}; expected {dtype} ({why})")


def recording_with_inference_state(state_tensors: Iterable[Tensor | None], inputs: Iterable[Tensor | None]) -> bool:
    """Whether this call records autograd (grad mode on outside ``torch.inference_mode()``, a nested
    ``torch.enable_grad()`` recording nothing, and some input or state tensor requiring a gradient) with a
    carried state tensor made under ``torch.inference_mode()``, which autograd cannot save."""
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return False
    carried = [t for t in state_tensors if isinstance(t, Tensor)]
    if not any(t.is_inference() for t in carried):
        return False
    return any(isinstance(t, Tensor) and t.requires_grad for t in (*inputs, *carried))


def check_state_recordable(state_tensors: Iterable[Tensor | None], inputs: Iterable[Tensor | None]) -> None:
    """Refuse a carried state made under ``torch.inference_mode()`` in a call that records autograd (grad
    mode on and some input or state tensor requiring a gradient): autograd cannot save an inference
    tensor for the backward, and torch answered from deep inside a kernel, in several lines ('Inference
    tensors cannot be saved for backward. …'), and only in the forms whose ops saved it. A state made
    under ``torch.no_grad()`` serves both; so does any state in a call that records nothing (grad mode off,
    or inside ``torch.inference_mode()``, a nested ``torch.enable_grad()`` included). Softmax's KV cache is not
    refused: it is copied (:meth:`~variants.attention.SoftmaxAttention._check_state`).

    Raises:
        VariantError: naming ``state``."""
    if recording_with_inference_state(state_tensors, inputs):
        raise VariantError("state: got a state made under torch.inference_mode(); expected one made outside it "
                           "(under torch.no_grad(), say) for a call that records autograd")


def check_state_position(position: object) -> None:
    """A carried state's ``position`` counts the tokens it has seen: an integer >= 0. Each call adds
    its T to it (``None`` or a string raised a bare TypeError there; a float or a tensor was carried
    into every later state, and the language model cuts its segments at it). The callers add to
    ``int(position)``: a NumPy integer adds in its own width, so a count held as np.uint8(250) wrapped
    to 4 after 10 more tokens (np.int8(127) to -128), silently."""
    if isinstance(position, bool) or not isinstance(position, numbers.Integral) or position < 0:  # NumPy's too
        raise bad_value("state.position", position, "the number of tokens the state has seen (an integer >= 0)")


def all_finite(tensors: Iterable[Tensor]) -> bool:
    """Whether every element of every tensor is finite (no NaN, no ±inf); sparse tensors too.

    One reduction per tensor and one host synchronisation in all: a sum is finite only if every
    element is (NaN and ±inf propagate), so the common case reads each tensor once and writes no
    mask. A sum that overflows on finite values falls through to the exact, per-element check.
    Tensors on ``meta`` (a shape-only run) hold no values and count as finite.
    """
    present = [x for x in tensors if x.numel() and not x.is_meta]
    if not present:
        return True
    sums = torch.stack([x.sum(dtype=torch.float32) if x.is_floating_point() else x.new_zeros((), dtype=torch.float32)
                        for x in present])
    if bool(torch.isfinite(sums).all()):
        return True
    return all(bool(torch.isfinite(x.coalesce().values() if x.is_sparse else x).all()) for x in present)


def check_finite(**tensors: Tensor | None) -> None:
    """Raise :class:`NonFiniteError` naming the first tensor with a NaN or ±inf and where it is.

    Args:
        tensors: name → tensor (``None`` entries are skipped), e.g. ``q=q, k=k, state_W=W``.
    """
    present = {name: x for name, x in tensors.items() if x is not None}
    if all_finite(present.values()):
        return
    for name, x in present.items():
        finite = torch.isfinite(x)
        if bool(finite.all()):
            continue
        index = tuple(int(i) for i in (~finite).nonzero()[0])
        value = x[index].item()
        raise NonFiniteError(
            f"{name.replace('_', '.')}: got {value} at index {index}; "
            "expected finite values (NaN/inf check on: check_finite=True)"
        )
