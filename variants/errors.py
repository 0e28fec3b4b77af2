"""Errors raised for bad input to the attention variants.

Every error names the argument, the value received and what is allowed, so that a user sees
the mistake in one line instead of a stack trace deep inside torch.
"""

from __future__ import annotations

import math
from fractions import Fraction

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


def shown(value: object) -> str:
    """``value`` as an error message shows it: its ``repr``, except that an integer of more than 40 digits (and
    a ``Fraction`` holding one) is named by its digit count, as ``an integer of 401 digits``. The ``repr`` of an
    integer over 4300 digits raised a ``ValueError`` of its own (Python's ``int_max_str_digits``) while the
    message naming the argument was built, and one of a few hundred digits filled the line."""
    if isinstance(value, int) and not isinstance(value, bool) and _digits(value) > 40:
        return f"{'a negative' if value < 0 else 'an'} integer of {_digits(value)} digits"
    if isinstance(value, Fraction) and max(_digits(value.numerator), _digits(value.denominator)) > 40:
        return f"Fraction({shown(value.numerator)}, {shown(value.denominator)})"
    try:
        return repr(value)
    except ValueError:  # a container holding an integer over 4300 digits
        return f"a {type(value).__name__} holding an integer too long to write"


def _digits(value: int) -> int:
    """The number of decimal digits of ``abs(value)``, without ``str`` (which refuses over 4300 digits)."""
    digits = math.floor(abs(value).bit_length() * math.log10(2)) + 1  # exact, or one too many
    return max(1, digits - (abs(value) < 10 ** (digits - 1)))


def bad_value(argument: str, received: object, allowed: str) -> VariantError:
    """Build the one-line error for ``argument``: what was received (:func:`shown`) and what is allowed."""
    return VariantError(f"{argument}: got {shown(received)}; expected {allowed}")


def too_large(argument: str, value: int, maximum: int = MAX_SIZE, why: str = "") -> str:
    """The one-line message for an integer ``value`` of ``argument`` above ``maximum``: ``ARGUMENT: got
    VALUE; expected at most MAXIMUM (WHY)`` (``VALUE`` as :func:`shown` writes it); ``why`` defaults to the
    reason for :data:`MAX_SIZE`."""
    why = why or ("2**63 - 1, the largest size a torch tensor has" if maximum == MAX_SIZE else "")
    return f"{argument}: got {shown(int(value))}; expected at most {maximum}" + (f" ({why})" if why else "")


#: Bytes per element :func:`check_storage` counts: float64's and int64's, the widest dtypes a tensor here takes.
STORAGE_ITEMSIZE = 8


def check_storage(sizes: dict[str, int], shape: tuple[int, ...], tensor: str, error: type[ValueError] = VariantError
                  ) -> None:
    """Refuse ``sizes`` (argument → value, each already checked) whose ``tensor`` of ``shape`` torch cannot hold:
    more than 2**63 − 1 bytes at :data:`STORAGE_ITEMSIZE` bytes per element, an empty dimension counted as one.
    Each size was in range, but torch raised ``RuntimeError: Storage size calculation overflowed with
    sizes=[…]``, naming no argument, or (for a product above 2**63 − 1, as ``n_heads · d_key``) its
    ``TypeError``. Sizes torch can index but no memory holds still end in the allocator's error, which names
    the bytes asked for.

    Raises:
        ``error``: ``NAMES: got VALUES; expected sizes whose TENSOR (SHAPE elements) fits in 2**63 - 1 bytes``.
    """
    # an empty dimension (batch 0) counts as one: torch still sizes the other dimensions (a (0, 2**62) draw and
    # generate() of 2**62 tokens for B = 0 passed the check as 0 bytes and overflowed or sampled until killed)
    if math.prod(max(n, 1) for n in shape) * STORAGE_ITEMSIZE > MAX_SIZE:
        written = " × ".join(shown(n) for n in shape) + " elements" + ("; an empty dimension counts as one" if 0 in shape
                                                                     else "")
        raise error(f"{', '.join(sizes)}: got {', '.join(shown(v) for v in sizes.values())}; expected sizes whose "
                    f"{tensor} ({written}) fits in 2**63 - 1 bytes (torch's largest tensor, at "
                    f"{STORAGE_ITEMSIZE} bytes per element)")


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
