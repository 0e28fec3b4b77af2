"""A planted slowdown for checking the performance gate: a kernel that runs twice per call.

``benchmarks/conftest.py`` plants it with ``--plant-slowdown MODULE:FUNCTION``; a gate that does not
fail on it could not catch a real 2× regression of that kernel (issue 14 item 11).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def plant_slowdown(target: str) -> Callable[[], None]:
    """Replace ``MODULE:FUNCTION`` with a version that calls it twice and returns the second result.

    Every loaded ``fwbench`` module that holds the function under some name (``from .dpfp_scores
    import dpfp_query_scores``) gets the replacement too: replacing it only in its own module would
    leave its callers on the original, and the gate green. Returns a function that undoes the plant.

    Raises:
        ValueError: ``target`` is not ``MODULE:FUNCTION`` with the module named as fwbench imports it
            (``fwbench.variants.kernels.delta_rule``, not the file path ``variants.kernels.delta_rule``,
            a second copy that no case calls), or names no function of it.
    """
    module_name, _, function_name = target.partition(":")
    if not module_name.startswith("fwbench.") or not function_name:
        raise ValueError(f"--plant-slowdown: got {target!r}; expected MODULE:FUNCTION with the module as "
                         "fwbench imports it, e.g. fwbench.variants.kernels.delta_rule:delta_rule_chunk")
    try:
        original = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--plant-slowdown: got {target!r}; expected MODULE:FUNCTION of a kernel ({exc})") from None
    if not callable(original):
        raise ValueError(f"--plant-slowdown: got {target!r}; {function_name} is not a function")

    def twice(*args, **kwargs):
        original(*args, **kwargs)
        return original(*args, **kwargs)

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

    return undo
