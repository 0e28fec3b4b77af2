"""Importing a user's own variant modules: files or importable modules that call
:func:`variants.register_feature_map` / :func:`variants.register_rule` when imported.

A grid names them with ``variant_modules = ["my_attention.py"]`` (paths relative to the grid file, or
module names), ``fwbench bench`` and ``fwbench report`` with ``--variant-module``; every process that
builds a model imports them first (the harness passes them with each run, so Ray and torchrun workers
do too). Each file is imported once per process, however often it is named.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

from .errors import VariantError

#: Prefix of the module names user files are imported under (``sys.modules`` keys).
MODULE_PREFIX = "fwbench_user_variants"


def _is_path(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def resolve_variant_module(entry: str, relative_to: str | Path | None = None,
                           argument: str = "variant_modules") -> str:
    """An entry as it is passed to workers: a file path made absolute (relative paths against
    ``relative_to``, e.g. the grid file's folder), or a module name unchanged. ``argument`` names
    the setting in errors (``variant_modules`` in a grid, ``--variant-module`` on the command line).

    Raises:
        VariantError: an empty entry, a file that does not exist, a directory, or a file whose name
            does not end in ``.py`` (Python has no loader for it: importing raised an AttributeError).
    """
    if not isinstance(entry, str) or not entry.strip():
        raise VariantError(f"{argument}: got {entry!r}; expected a path to a .py file or a module name")
    entry = entry.strip()
    if not _is_path(entry):
        return entry
    path = Path(entry).expanduser()
    if not path.is_absolute() and relative_to is not None:
        path = Path(relative_to) / path
    path = path.resolve()
    where = f" (relative paths are read from {relative_to})" if relative_to is not None else ""
    if path.is_dir():  # "does not exist" would misname it
        raise VariantError(f"{argument}: {str(path)!r} is a directory; expected a .py file{where}")
    if not path.is_file():
        raise VariantError(f"{argument}: file {str(path)!r} does not exist; expected a .py file{where}")
    if path.suffix != ".py":
        raise VariantError(f"{argument}: file {str(path)!r} is not a .py file; expected a .py file (Python imports "
                           "no other) or a module name")
    return str(path)


def import_variant_module(entry: str, relative_to: str | Path | None = None,
                          argument: str = "variant_modules") -> str:
    """Import one variant module (a ``.py`` path or a module name) unless this process already has;
    returns the resolved entry.

    Raises:
        VariantError: the entry cannot be found, or importing it raised (the error names the file
            and the exception's first line) or called ``sys.exit`` (the error names the file and the
            status).
    """
    entry = resolve_variant_module(entry, relative_to, argument)
    try:
        if not _is_path(entry):
            importlib.import_module(entry)
            return entry
        digest = hashlib.sha256(entry.encode()).hexdigest()[:12]
        name = f"{MODULE_PREFIX}.{Path(entry).stem}_{digest}"
        if name in sys.modules:
            return entry
        spec = importlib.util.spec_from_file_location(name, entry)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    except VariantError:
        raise
    except SystemExit as exc:  # not an Exception: it would end the command silently with the module's status
        raise VariantError(
            f"{argument}: importing {entry!r} called sys.exit({exc.code!r}); expected a module that imports "
            "cleanly (and registers its variants), without exiting"
        ) from None
    except Exception as exc:
        first_line = (str(exc).splitlines() or [""])[0]
        raise VariantError(
            f"{argument}: importing {entry!r} failed: {type(exc).__name__}: {first_line}; expected a module "
            "that imports cleanly (and registers its variants)"
        ) from exc
    return entry


def import_variant_modules(entries: Iterable[str], relative_to: str | Path | None = None,
                           argument: str = "variant_modules") -> tuple[str, ...]:
    """Import every entry (see :func:`import_variant_module`); returns the resolved entries in order."""
    return tuple(import_variant_module(entry, relative_to, argument) for entry in entries)
