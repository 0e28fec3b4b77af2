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


#: Seeds are below 2**31. torch's CPU generator reads only a seed's low 32 bits (``manual_seed(1)`` and
#: ``manual_seed(2**32 + 1)`` draw alike), so seeds 1 and 2**32 + 1 were two run ids for one computation, and the
#: statistics counted them as two independent seeds. A run draws its streams from ``seed`` + up to 2_000_003
#: (:mod:`fwbench.run.training`), which stays below 2**32 from any seed below 2**31.
SEED_LIMIT = 2**31


def check_seed(value: object, option: str) -> int:
    """``value`` as a seed, named ``option`` in the message (``--seed``, ``grid … profile …: seed``).

    Raises:
        FwbenchError: ``value`` is not an integer in [0, 2**31) (:data:`SEED_LIMIT`).
    """
    from fwbench.variants.errors import shown  # here, not at the top: importing fwbench.variants loads torch

    if isinstance(value, bool) or not isinstance(value, int):
        raise FwbenchError(f"{option}: got {shown(value)} ({type(value).__name__}); expected a non-negative integer "
                           "below 2**31")
    if not 0 <= value < SEED_LIMIT:
        why = ""
        if 2**32 <= value < 2**64:  # above, torch refuses the seed ('Overflow when unpacking long long')
            why = f" (torch's CPU generator reads only a seed's low 32 bits: it draws as seed {value % 2**32})"
        raise FwbenchError(f"{option}: got {shown(value)}; expected a non-negative integer below 2**31{why}")
    return value
