"""Errors raised for bad input to the attention variants.

Every error names the argument, the value received and what is allowed, so that a user sees
the mistake in one line instead of a stack trace deep inside torch.
"""

from __future__ import annotations


class VariantError(ValueError):
    """Bad variant spec, parameter, tensor shape or carried state.

    A ``ValueError`` so that callers who already catch ``ValueError`` keep working; the
    command line maps it to exit status 2.
    """


def bad_value(argument: str, received: object, allowed: str) -> VariantError:
    """Build the one-line error for ``argument``: what was received and what is allowed."""
    return VariantError(f"{argument}: got {received!r}; expected {allowed}")


class NonFiniteError(VariantError):
    """A NaN or ±inf in the inputs or carried state of an attention call made with
    ``check_finite=True`` (on in the harness). The training loop records it as a divergence."""
