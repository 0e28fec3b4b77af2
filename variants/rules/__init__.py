"""Update rules of fast-weight attention, one object per rule, found through :data:`RULES`.

Each rule (:class:`UpdateRule`) holds its kernels per form, its state (with or without the
normaliser z), whether it uses β and whether φ is sum-normalised; the attention module delegates to
it. The table maps a rule's key, which is also its spec-name suffix (``dpfp-delta``), to the rule:
``sum``, ``delta``, ``delta-unnorm`` (a configuration of the delta rule) and ``fwm``. A new rule is one
file defining an :class:`UpdateRule` and one :func:`register_rule` call (see
:func:`variants.registry.register_rule`, which also names its variants).
"""

from __future__ import annotations

from ..errors import VariantError, bad_value, check_name
from .base import CHUNK_PATHS, Kernel, UpdateRule
from .delta import DELTA, DELTA_UNNORM, DeltaRule
from .fwm import FWM, FwmRule
from .sum import SUM, SumRule

#: rule key → rule object, in registration order (the order variants are listed in)
RULES: dict[str, UpdateRule] = {rule.key: rule for rule in (SUM, DELTA, DELTA_UNNORM, FWM)}


def get_rule(rule: str | UpdateRule) -> UpdateRule:
    """The rule object of a key in :data:`RULES` (a rule object is returned as is).

    Raises:
        VariantError: an unknown key (lists the known ones).
    """
    if isinstance(rule, UpdateRule):
        return rule
    if rule not in RULES:
        raise bad_value("rule", rule, f"one of {', '.join(RULES)}")
    return RULES[rule]


def add_rule(rule: UpdateRule) -> UpdateRule:
    """Put ``rule`` in :data:`RULES` under ``rule.key``.

    Raises:
        VariantError: not an :class:`UpdateRule`, a key taken by another rule, a form outside
            parallel/chunk/recurrent, or an ``auto_form`` the rule has no kernel for.
    """
    if not isinstance(rule, UpdateRule):
        raise bad_value("rule", type(rule).__name__, "an UpdateRule (see variants.rules.base)")
    check_name("rule.key", rule.key)  # the registry's check: a line break or tab was registered here
    if RULES.get(rule.key, rule) is not rule:
        raise VariantError(f"rule.key: got {rule.key!r}, which another rule already has; expected a new key")
    unknown = [form for form in rule.kernels if form not in ("parallel", "chunk", "recurrent")]
    if unknown or not rule.kernels:
        raise bad_value("rule.kernels", list(rule.kernels), "a non-empty mapping with keys among parallel, chunk, recurrent")
    if rule.auto_form not in rule.kernels:
        raise bad_value("rule.auto_form", rule.auto_form, f"one of the rule's forms ({', '.join(rule.kernels)})")
    RULES[rule.key] = rule
    return rule


__all__ = [
    "CHUNK_PATHS", "DELTA", "DELTA_UNNORM", "FWM", "RULES", "SUM", "DeltaRule", "FwmRule", "Kernel", "SumRule",
    "UpdateRule", "add_rule", "get_rule",
]
