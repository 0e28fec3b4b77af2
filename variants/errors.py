"""Errors raised for bad input to the attention variants.

Every error names the argument, the value received and what is allowed, so that a user sees
the mistake in one line instead of a stack trace deep inside torch.
"""

from __future__ import annotations

import math

import numpy as np

#: The largest size a torch tensor dimension holds (int64). A larger int passed the size checks and raised
#: torch's ``TypeError`` ("Overflow when unpacking long long") or an ``OverflowError`` deep in the constructor
#: or generator that passed it on.
MAX_SIZE = 2**63 - 1


class VariantError(ValueError):
    """Bad variant spec, parameter, tensor shape or carried state.

    A ``ValueError`` so that callers who already catch ``ValueError`` keep working; the
    command line maps it to exit status 2.
    """


def bad_value(argument: str, received: object, allowed: str) -> VariantError:
    """Build the one-line error for ``argument``: what was received and what is allowed."""
    return VariantError(f"{argument}: got {received!r}; expected {allowed}")


def too_large(argument: str, value: int, maximum: int = MAX_SIZE, why: str = "") -> str:
    """The one-line message for an integer ``value`` of ``argument`` above ``maximum``: ``ARGUMENT: got
    VALUE; expected at most MAXIMUM (WHY)``; ``why`` defaults to the reason for :data:`MAX_SIZE`. An
    integer of more than 40 digits is shown by its length: ``repr`` of one over 4300 digits raised a
    ``ValueError`` of its own (Python's ``int_max_str_digits``)."""
    value = int(value)
    if value.bit_length() > 133:  # 2**133 ≈ 1.1e40
        shown = f"an integer of about {math.floor(value.bit_length() * math.log10(2)) + 1} digits"
    else:
        shown = repr(value)
    why = why or ("2**63 - 1, the largest size a torch tensor has" if maximum == MAX_SIZE else "")
    return f"{argument}: got {shown}; expected at most {maximum}" + (f" ({why})" if why else "")


def true_or_false(argument: str, value: object) -> bool:
    """``value`` as a ``bool`` if it is one (Python's or NumPy's), else raise :class:`VariantError` naming
    ``argument``: a truthy non-bool (``"no"``, ``0.5``, ``1``) switched a flag on silently."""
    if not isinstance(value, (bool, np.bool_)):
        raise bad_value(argument, value, "True or False")
    return bool(value)


def check_name(argument: str, name: object) -> str:
    """``name`` if it can be written in a spec string and a report's lines: a non-empty ``str`` without
    ``:``, ``,``, ``=`` (the spec syntax), whitespace or non-printable characters, and without an outer
    ``-`` (rule suffixes join with one). Used for every registered name: feature maps, their parameters
    and update rules' keys.

    Raises:
        VariantError: naming ``argument``, the value and what is allowed.
    """
    # whitespace and control characters too, not only the space: a name holding a line break or a tab
    # broke the report's lines (the diverged-runs list, the samples' headings) and no spec could name it
    if not isinstance(name, str) or not name or any(c in ":,=" or c.isspace() or not c.isprintable() for c in name) \
            or name != name.strip("-"):
        raise bad_value(argument, name, "a non-empty name without ':', ',', '=', whitespace, control characters "
                                        "or an outer '-'")
    return name


class NonFiniteError(VariantError):
    """A NaN or ±inf in the inputs or carried state of an attention call made with
    ``check_finite=True`` (on in the harness). The training loop records it as a divergence."""
