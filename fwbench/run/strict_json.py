"""Strict JSON and standard CSV for every file the suite writes (``runs.jsonl``, ``bench.jsonl``,
the bench baseline, the CSV tables): no ``NaN``, ``Infinity`` or ``-Infinity`` token, which strict
JSON parsers reject and jq reads as ±1.797e308.

A value that was never measured is ``null`` where it is made (a run that diverged before its first
evaluation has no best loss). Any other non-finite float left in a record is replaced by ``null``
at the write, and the record says what it was: ``non_finite`` maps each replaced value's path
(``metrics.final_eval_loss``, ``curve.3.eval_loss``) to ``"nan"``, ``"inf"`` or ``"-inf"``; the
reason the run went there is its ``status`` and ``diverged_reason``. In a CSV the cell is empty.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: The record key listing the values written as ``null`` because they were NaN or infinite.
NON_FINITE_KEY = "non_finite"
#: What ``non_finite`` says a value was (``repr`` of the float): the only values it restores.
NON_FINITE_VALUES = frozenset({"nan", "inf", "-inf"})


def _replace_non_finite(value: Any, path: str, replaced: dict[str, str]) -> Any:
    """``value`` with every non-finite float set to ``None``; ``replaced[path]`` says what each was.

    NumPy scalars and arrays and torch tensors become Python numbers and lists first: ``json`` cannot
    write a ``numpy.float32`` (a metric averaged with NumPy), and a record that cannot be written
    would lose a finished run.
    """
    if isinstance(value, (np.generic, np.ndarray, torch.Tensor)):
        value = value.tolist()  # a 0-d array or tensor, or a NumPy scalar, gives a Python scalar
    if isinstance(value, float) and not math.isfinite(value):
        replaced[path] = repr(float(value))  # 'nan', 'inf', '-inf'
        return None
    if isinstance(value, dict):
        return {k: _replace_non_finite(v, f"{path}.{k}" if path else str(k), replaced) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace_non_finite(v, f"{path}.{i}" if path else str(i), replaced) for i, v in enumerate(value)]
    return value


def sanitize_record(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` in which every NaN/±inf float (at any depth) is ``None``, listed in
    ``record["non_finite"]`` (merged with what is already there); the record itself is unchanged."""
    replaced: dict[str, str] = {}
    clean = _replace_non_finite(record, "", replaced)
    if replaced:
        clean[NON_FINITE_KEY] = {**(record.get(NON_FINITE_KEY) or {}), **replaced}
    return clean


def restore_non_finite(record: dict[str, Any]) -> dict[str, Any]:
    """A copy of a record read back from a strict file with each value its ``non_finite`` lists put
    back as the float it was (``nan``, ``inf``, ``-inf``), so that the analysis computes with an
    overflowed perplexity as it was measured (inf / inf is NaN, a ratio of null and null a TypeError
    traceback in ``fwbench report``). A path that no longer leads to a value, or leads to one that is not
    null, is left as it is; so is one whose listed value is not one this module writes (``"nan"``, ``"inf"``,
    ``"-inf"``): a hand-edited ``non_finite`` of ``10**400`` raised OverflowError (a traceback in ``fwbench
    report``), and one of ``"0.5"`` or ``true`` turned a value never measured into a finite number.
    """
    replaced = record.get(NON_FINITE_KEY)
    if not isinstance(replaced, dict) or not replaced:
        return record
    restored = json.loads(json.dumps(record))  # a deep copy: the caller's record is unchanged
    for path, value in replaced.items():
        if not isinstance(value, str) or value not in NON_FINITE_VALUES:  # a list is unhashable
            continue
        *parents, last = str(path).split(".")
        container: Any = restored
        try:
            for part in parents:
                container = container[int(part)] if isinstance(container, list) else container[part]
            index = int(last) if isinstance(container, list) else last
            if container[index] is None:
                container[index] = float(value)
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return restored


def strict_dumps(record: dict[str, Any], **kwargs: Any) -> str:
    """``json.dumps`` of :func:`sanitize_record` (``record``), refusing any non-finite value left
    (``allow_nan=False``); ``kwargs`` go to ``json.dumps`` (``indent``, ``sort_keys``)."""
    return json.dumps(sanitize_record(record), allow_nan=False, **kwargs)


def write_csv(frame, path: str | Path, **kwargs: Any) -> None:
    """Write a pandas DataFrame as standard CSV: NaN and ±inf become empty cells, never ``inf``.

    ``kwargs`` go to ``DataFrame.to_csv`` (``index``, ``float_format``).
    """
    frame.replace([math.inf, -math.inf], math.nan).to_csv(path, na_rep="", **kwargs)
