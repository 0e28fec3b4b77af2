"""Errors the harness raises for bad input; the command line turns each into one line and exit 2."""

from __future__ import annotations


class FwbenchError(ValueError):
    """A user-facing error: bad grid file, profile, device, results directory or option.

    Messages name the argument, the value received and what is allowed.
    """


def refuse_empty_path(option: str, value: object, expected: str) -> None:
    """Refuse ``''`` for a path option (``--out "$UNSET"``): ``Path("")`` is the working directory, so
    records, reports or data would be written to, or read from, wherever the command was started.

    Raises:
        FwbenchError: ``value`` is the empty string, naming ``option`` and ``expected``.
    """
    if not str(value):
        raise FwbenchError(f"{option}: got ''; expected {expected} (the empty string would be the working directory)")
