"""Second-order gradients for the kernels whose backward is written by hand.

A hand-written backward (:class:`~.dpfp._DPFP`, :class:`~.fwm_rule._FlushedScan`) reads tensors
saved in the forward as constants, so a graph built through it (``create_graph=True``: Hessian-vector
products, gradient penalties, ``torch.autograd.gradgradcheck``) would miss every path through them and
give wrong second derivatives without a word. Under ``create_graph=True`` those backwards call
:func:`grad_by_recomputation` instead: the forward is run again with plain autograd ops on the saved
*inputs* (which are still connected to the caller's graph), and differentiated with
``create_graph=True``; the result is differentiable to any order. It costs one more forward, and
only where a second derivative was asked for; the first-order backward stays the fast one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor


def apply_unrecorded_in_inference_mode(function: type[torch.autograd.Function], *args):
    """``function.apply(*args)``, recording nothing inside ``torch.inference_mode()``, as torch's own ops do, also
    under a nested ``torch.enable_grad()``: there grad mode is on, so ``apply`` recorded a node for an input that
    requires a gradient (a parameter, or a tensor made before the block) and saved tensors made inside it, and
    torch raised 'Inference tensors cannot be saved for backward' where a plain op answers. The kernels call their
    hand-written autograd functions through it. A function, not an ``apply`` override on a base class: torch.compile
    cannot trace an overridden ``apply`` ('AutogradFunctionVariable() is not a constant', every variant with such a
    function, with or without autocast)."""
    if torch.is_inference_mode_enabled() and torch.is_grad_enabled():
        with torch.no_grad():
            return function.apply(*args)
    return function.apply(*args)


def autocast_state(x: Tensor) -> tuple[str, bool, torch.dtype] | None:
    """The autocast state (device type, enabled, dtype) for ``x``'s device, taken in a forward, so a
    recomputation in the backward (which runs under the caller's state then, not the forward's) gives
    the forward's values; None where the device has no autocast (``meta``)."""
    device = x.device.type
    if not torch.amp.is_autocast_available(device):
        return None
    return device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)


def under_autocast(state: tuple[str, bool, torch.dtype] | None) -> AbstractContextManager:
    """A context that sets the autocast state :func:`autocast_state` took (none for None)."""
    if state is None:
        return nullcontext()
    device, enabled, dtype = state
    return torch.autocast(device, dtype=dtype, enabled=enabled)


def kept_graph(ctx, rebuild: Callable[[], object]):
    """The graph an autograd function's forward kept in ``ctx.graph`` for its first-order backward,
    let go here: kept past the backward (for a second one), it held the inner graph's saved tensors
    for as long as anything kept the outer graph, which autograd's own backward frees. A second
    backward (``retain_graph=True`` before) finds none and gets ``rebuild()``, run under the
    forward's autocast state (``ctx.autocast``, :func:`autocast_state`), so its gradients are the
    first's; under the caller's state a bf16-autocast forward gave a second backward fp32 gradients.
    The functions that keep a graph: softmax's ``_FusedAttention``, the FWM rule's ``_FlushedScan``."""
    graph, ctx.graph = ctx.graph, None
    if graph is None:
        with under_autocast(ctx.autocast):
            graph = rebuild()
    return graph


def grad_by_recomputation(
    forward: Callable[..., Sequence[Tensor | None]], inputs: Sequence[Tensor | None],
    grad_outputs: Sequence[Tensor | None],
) -> tuple[Tensor | None, ...]:
    """∂(Σ_o ⟨grad_outputs[o], forward(*inputs)[o]⟩)/∂inputs, as a differentiable graph.

    Args:
        forward: the kernel written with differentiable torch ops; returns a sequence of outputs
            (``None`` entries allowed), in the order of ``grad_outputs``.
        inputs: the kernel's tensor inputs as autograd saved them (``None`` allowed); a gradient is
            computed for those that require one.
        grad_outputs: the incoming gradient of each output (``None``: the output is not used).

    Returns:
        One gradient per input: a tensor in the input's dtype, or ``None`` for an input that is
        ``None`` or needs none (also for one the outputs do not depend on).
    """
    # each input through a node of its own (a view), which only this forward reads: autograd.grad
    # with respect to the caller's tensor itself counts every path to it, so a tensor passed twice
    # (q = k = v), or one that another input is made of (v = x, k = tanh(x)), had its gradient
    # added again for each (float64, softmax with q = k = v: 3 times the plain backward's)
    with torch.enable_grad():
        inputs = [x.view_as(x) if x is not None and x.requires_grad else x for x in inputs]
        outputs = forward(*inputs)
    wanted = [x for x in inputs if x is not None and x.requires_grad]
    pairs = [(out, grad) for out, grad in zip(outputs, grad_outputs, strict=True)
             if out is not None and grad is not None and out.requires_grad]
    if not wanted or not pairs:
        return (None,) * len(inputs)
    grads = iter(torch.autograd.grad([out for out, _ in pairs], wanted, [grad.to(out.dtype) for out, grad in pairs],
                                     create_graph=True, allow_unused=True))
    result: list[Tensor | None] = []
    for x in inputs:
        grad = next(grads) if x is not None and x.requires_grad else None
        result.append(None if grad is None else grad.to(x.dtype))
    return tuple(result)
