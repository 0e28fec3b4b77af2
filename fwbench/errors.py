"""Errors the harness raises for bad input; the command line turns each into one line and exit 2."""

from __future__ import annotations


class FwbenchError(ValueError):
    """A user-facing error: bad grid file, profile, device, results directory or option.

    Messages name the argument, the value received and what is allowed.
    """
