"""Errors the harness raises for bad input; the command line turns each into one line and exit 2."""

from __future__ import annotations


class FwbenchError(ValueError):
    """A user-facing error: bad grid file, profile, device, results directory or option.

    Messages name the argument, the value received and what is allowed.
    """


def one_line(path: object) -> str:
    """``path`` (a path, or any text) for a one-line message: each character that is not printable (a newline, a
    tab, a lone surrogate from bytes that are not UTF-8) escaped as ``repr`` escapes it ('\\n'), every other one
    as it is (a space, ': ', 'é'), so that a plain path reads as it did and a message stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(path))


def refuse_empty_path(option: str, value: object, expected: str) -> None:
    """Refuse ``''`` for a path option (``--out "$UNSET"``): ``Path("")`` is the working directory, so
    records, reports or data would be written to, or read from, wherever the command was started.

    Raises:
        FwbenchError: ``value`` is the empty string, naming ``option`` and ``expected``.
    """
    if not str(value):
        raise FwbenchError(f"{option}: got ''; expected {expected} (the empty string would be the working directory)")
