"""A planted slowdown for checking the performance gate: a kernel that runs twice per call, forward and backward.

``benchmarks/conftest.py`` plants it with ``--plant-slowdown MODULE:FUNCTION``; a gate that does not
fail on it could not catch a real 2× regression of that kernel (issue 14 item 11).
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch


def plant_slowdown(target: str) -> Callable[[], None]:
    """Replace ``MODULE:FUNCTION`` with a version that calls it twice and returns the second result,
    joined to the first so that a backward through it runs the backward of both (the gradients stay
    the second call's: the first's gets zeros).

    Every loaded ``fwbench`` module that holds the function under some name (``from .dpfp_scores
    import dpfp_query_scores``) gets the replacement too: replacing it only in its own module would
    leave its callers on the original, and the gate green. Returns a function that undoes the plant.

    Raises:
        ValueError: ``target`` is not ``MODULE:FUNCTION`` with the module named as fwbench imports it
            (``fwbench.variants.kernels.delta_rule``, not the file path ``variants.kernels.delta_rule``,
            a second copy that no case calls), names no function of it (a class: its callers use its
            attributes, ``_FlushedScan.apply``, which a function lacks), or names a function that is
            also held where no module name reaches it (an update rule's ``kernels`` table holds
            ``fwbench.variants.rules.delta:_chunk``: the plant changed nothing its callers call), or names
            a function that compiled (numba) code calls (``fwbench.variants.kernels.compiled_scores:row_score``:
            a compiled caller bound it when it was compiled, so the plant changed nothing it runs).
    """
    module_name, _, function_name = target.partition(":")
    if not module_name.startswith("fwbench.") or not function_name:
        raise ValueError(f"--plant-slowdown: got {target!r}; expected MODULE:FUNCTION with the module as "
                         "fwbench imports it, e.g. fwbench.variants.kernels.delta_rule:delta_rule_chunk")
    try:
        original = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--plant-slowdown: got {target!r}; expected MODULE:FUNCTION of a kernel ({exc})") from None
    if not callable(original) or isinstance(original, type):
        raise ValueError(f"--plant-slowdown: got {target!r}; {function_name} is not a function")

    def twice(*args, **kwargs):
        first = original(*args, **kwargs)
        # the second call's values, with the first call's graph joined to it: a backward through the
        # result runs both calls' backwards, as a kernel twice as slow would (returning the second
        # result alone doubled only the forward: softmax_parallel_fwd_bwd_T1024 grew 1.29x,
        # fwm_setting2_train_step_S60 1.29x, under the gate's 1.5, and the plant went uncaught)
        return _join_backward(original(*args, **kwargs), first)

    replaced = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "fwbench" or name.startswith("fwbench.")):
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, twice)
                replaced.append((module, attribute))

    def undo() -> None:
        for module, attribute in replaced:
            setattr(module, attribute, original)

    holder = _holder_beyond_modules(original) or _compiled_caller({attribute for _, attribute in replaced})
    if holder is not None:
        undo()
        raise ValueError(f"--plant-slowdown: got {target!r}; {function_name} is also held in a {holder}, which the "
                         "plant cannot replace, so its callers would run it once; expected a kernel its callers "
                         "look up by module name, e.g. fwbench.variants.kernels.delta_rule:delta_rule_chunk")
    return undo


class _BackwardOfBoth(torch.autograd.Function):
    """``kept`` as it is (a copy), whose backward also runs ``dropped``'s, with a zero gradient:
    the work of both, the gradients of ``kept`` alone (exactly: zeros add nothing)."""

    @staticmethod
    def forward(ctx, kept, dropped):
        return kept.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.zeros_like(grad)


def _join_backward(kept: Any, dropped: Any) -> Any:
    """``kept`` (a tensor, or a tuple or list of tensors and other values) with every tensor that
    requires a gradient joined to its counterpart in ``dropped`` by :class:`_BackwardOfBoth`."""
    if isinstance(kept, torch.Tensor):
        if isinstance(dropped, torch.Tensor) and kept.requires_grad and dropped.requires_grad and torch.is_grad_enabled():
            return _BackwardOfBoth.apply(kept, dropped)
        return kept
    if isinstance(kept, (tuple, list)) and isinstance(dropped, (tuple, list)) and len(kept) == len(dropped):
        joined = [_join_backward(k, d) for k, d in zip(kept, dropped, strict=True)]
        # a NamedTuple (fla_dispatch.decide's Decision) takes its fields one by one
        return type(kept)(*joined) if hasattr(kept, "_fields") else type(kept)(joined)
    return kept


def _compiled_caller(names: set[str]) -> str | None:
    """A description of a numba-compiled function of a loaded ``fwbench`` module whose code names one of
    ``names`` (a global or an attribute it calls); ``None`` when there is none. Compiled code looks its
    callees up when it is compiled (or loads them from numba's cache), not at each call."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "fwbench" or module_name.startswith("fwbench.")):
            continue
        for attribute, value in list(vars(module).items()):
            code = getattr(getattr(value, "py_func", None), "__code__", None)  # a numba dispatcher's Python source
            if code is not None and names & set(code.co_names):
                return f"compiled (numba) function {module_name}.{attribute}"
    return None


def _holder_beyond_modules(function: object) -> str | None:
    """A description of a table (a dict other than a module's namespace, such as an update rule's
    ``kernels``) that still holds ``function`` once every module name for it is replaced; ``None``
    when there is none. Closures are not counted: the plant's own undo holds the original in one."""
    namespaces = {id(vars(module)) for module in list(sys.modules.values()) if module is not None}
    for referrer in gc.get_referrers(function):
        if isinstance(referrer, dict) and id(referrer) not in namespaces:
            keys = [key for key, value in referrer.items() if value is function]
            return f"dict under {', '.join(map(repr, keys))} (a table, such as an update rule's kernels)"
    return None
