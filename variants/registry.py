"""Variant registry: spec strings such as ``dpfp-delta:nu=2`` or ``favor:m=128`` → modules.

A spec is ``NAME`` or ``NAME:key=value,key=value``. Each registry entry pairs a feature map with an
update rule (:mod:`variants.rules`); names are composed from both: ``MAP`` (the sum rule),
``MAP-delta``, ``MAP-delta-unnorm`` (the delta rule without sum normalisation of φ: the ablation of
paper Section 4.2), ``MAP-fwm`` (the FWM rule of Schlag et al. 2021). A new feature map is one
:func:`register_feature_map` call, a new rule one :func:`register_rule` call, from fwbench or from a
user's own module (see :mod:`variants.plugins`).

>>> spec = parse_spec("dpfp-delta:nu=2")
>>> spec.name, spec.params
('dpfp-delta', {'nu': 2})
>>> build_attention("dpfp-delta:nu=2", d_key=64).d_dot
256
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .attention import FORMS, Attention, FastWeightAttention, SoftmaxAttention
from .errors import MAX_SIZE, VariantError, bad_value, check_name, too_large, true_or_false
from .feature_maps import DPFP, EluPlusOne, Favor, FeatureMap, Tanh, positive_int
from .rules import RULES, UpdateRule, add_rule


@dataclass(frozen=True)
class FeatureMapInfo:
    """A registered feature map: how to build it, its parameters and whether φ ≥ 0."""

    name: str
    factory: Callable[..., FeatureMap]  # factory(d_key, **params) -> FeatureMap
    params: dict[str, int | None]  # name → default value
    description: str
    source: str
    #: whether φ ≥ 0 everywhere; rules with a normaliser (sum, delta) are composed only with such maps
    non_negative: bool = True


@dataclass(frozen=True)
class VariantInfo:
    """One registry entry: how to build a variant and which parameters it accepts."""

    name: str
    description: str
    rule: str  # "softmax", or the update rule's family: "sum", "delta" or "fwm"
    feature_map: Callable[..., FeatureMap] | None
    params: dict[str, int | None] = field(default_factory=dict)  # name → default value
    source: str = ""
    #: the update rule object (``None`` for softmax)
    update_rule: UpdateRule | None = None

    @property
    def sum_normalize(self) -> bool | None:
        """Whether φ(k), φ(q) are sum-normalised (``None`` for softmax)."""
        return None if self.update_rule is None else self.update_rule.sum_normalize


#: feature-map name → feature map, in registration order
FEATURE_MAPS: dict[str, FeatureMapInfo] = {}
REGISTRY: dict[str, VariantInfo] = {
    "softmax": VariantInfo(
        "softmax", "causal softmax attention (KV cache as state)", "softmax", None,
        {"window": None}, "Vaswani et al. 2017",
    ),
}


def _accepts(rule: UpdateRule, feature_map: FeatureMapInfo) -> bool:
    return feature_map.non_negative or not rule.needs_non_negative_features


def _refuse_taken(names: list[str]) -> None:
    """Raise before registering anything if a composed spec name is already a variant."""
    taken = [name for name in names if name in REGISTRY]
    if taken:
        raise VariantError(f"name: the variant {taken[0]!r} it would add is already registered; expected a new name")


def _compose(feature_map: FeatureMapInfo, rule: UpdateRule) -> None:
    """Register ``MAP<rule suffix>`` (``dpfp``, ``dpfp-delta``, ...) when the rule accepts the map."""
    if not _accepts(rule, feature_map):
        return
    name = feature_map.name + rule.suffix
    REGISTRY[name] = VariantInfo(
        name, f"{feature_map.description}, {rule.description}", rule.name, feature_map.factory,
        dict(feature_map.params), f"{feature_map.source}; {rule.source}", rule,
    )


def _check_params(params: object) -> None:
    """Refuse spec parameters that no spec could write back: every variant's canonical spec (the one in
    its run records, ``NAME:key=value,...``) must parse to the same variant. A key ``'a=b'`` was registered
    and its default spec ``pm:a=b=1`` read as an unknown parameter ``a``; a default of 0 wrote ``pz:nu=0``,
    which parse_spec refuses; ``'2'`` wrote ``pz:nu=2``, which parses to another value (2)."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise bad_value("params", params, "a dict of parameter name -> default (a positive integer or None)")
    for key, default in params.items():
        check_name(f"params key {key!r}", key)
        if default is not None and (type(default) is not int or default < 1):
            raise bad_value(f"params[{key!r}]", default, "a positive integer or None (the default a spec omits)")
        # parse_spec reads no parameter above 2**63 - 1 (an int too long for str(), over 4300 digits, was
        # registered too, and every str(spec) of it raised ValueError: `fwbench variants` and each run record)
        if default is not None and default > MAX_SIZE:
            raise VariantError(too_large(f"params[{key!r}]", default))


def register_feature_map(name: str, factory: Callable[..., FeatureMap], params: dict[str, int | None] | None = None,
                         description: str = "", source: str = "", non_negative: bool = True) -> list[str]:
    """Add a feature map φ and name its variants: ``NAME`` (sum rule), ``NAME-delta``,
    ``NAME-delta-unnorm``, ``NAME-fwm`` and ``NAME-<key>`` for every rule in :data:`variants.rules.RULES`
    (rules with a normaliser only when ``non_negative``). Returns the new spec names.

    Args:
        name: the map's name in spec strings.
        factory: ``factory(d_key, **params)`` → a :class:`FeatureMap`, (B, H, T, d_key) → (B, H, T, d_dot).
            Its output size comes from ``factory.output_size(d_key, **params)`` where the factory is a
            FeatureMap class (see :meth:`FeatureMap.output_size`).
        params: spec parameters (positive integers) → default value (``{"nu": 1}`` for ``dpfp:nu=2``).
        description, source: one line each, for ``fwbench variants``.
        non_negative: whether φ ≥ 0 everywhere.

    Raises:
        VariantError: a malformed name or parameter (a name or key with ':', ',', '=', whitespace or
            control characters; a default that is not a positive integer or None), or a name already
            registered (re-registering the same factory under the same name is a no-op, so a module
            imported twice is harmless).
    """
    check_name("name", name)
    if not callable(factory):
        raise bad_value("factory", type(factory).__name__, "a callable factory(d_key, **params) -> FeatureMap")
    _check_params(params)
    known = FEATURE_MAPS.get(name)
    if known is not None:
        if known.factory is factory:
            return []
        raise VariantError(f"name: got {name!r}, which is already a registered feature map; expected a new name")
    info = FeatureMapInfo(name, factory, dict(params or {}), description or name, source or "user-registered",
                          bool(non_negative))
    _refuse_taken([name + rule.suffix for rule in RULES.values() if _accepts(rule, info)])
    FEATURE_MAPS[name] = info
    before = set(REGISTRY)
    for rule in RULES.values():
        _compose(info, rule)
    return [spec for spec in REGISTRY if spec not in before]


def register_rule(rule: UpdateRule) -> list[str]:
    """Add an update rule to :data:`variants.rules.RULES` and name ``MAP-<rule.key>`` for every
    registered feature map it accepts. Returns the new spec names.

    Raises:
        VariantError: as :func:`variants.rules.add_rule`.
    """
    if isinstance(rule, UpdateRule) and RULES.get(rule.key) is rule:
        return []
    if isinstance(rule, UpdateRule) and rule.key not in RULES:
        _refuse_taken([m.name + rule.suffix for m in FEATURE_MAPS.values() if _accepts(rule, m)])
    add_rule(rule)
    before = set(REGISTRY)
    for feature_map in FEATURE_MAPS.values():
        _compose(feature_map, rule)
    return [spec for spec in REGISTRY if spec not in before]


register_feature_map("linear", EluPlusOne, {}, "φ = elu(x) + 1", "Katharopoulos et al. 2020")
register_feature_map("favor", Favor, {"m": 64}, "FAVOR+ positive orthogonal random features, d_dot = 2m",
                     "Choromanski et al. 2021")
register_feature_map("dpfp", DPFP, {"nu": 1}, "DPFP, d_dot = 2·d_key·ν", "paper Section 5.3")
# tanh can be negative, so Σφ (the delta rule's normaliser) and zᵀφ(q) (the sum rule's) can be 0:
# only the FWM rule takes it.
register_feature_map("tanh", Tanh, {}, "φ = tanh(x)", "Schlag et al. 2021 (FWM)", non_negative=False)


@dataclass(frozen=True)
class VariantSpec:
    """A parsed spec: registry name plus resolved parameters (defaults filled in)."""

    name: str
    params: dict[str, int | None]

    def __str__(self) -> str:
        """Canonical spec string: parameters sorted, defaults written out (``dpfp:nu=1``)."""
        shown = {k: v for k, v in sorted(self.params.items()) if v is not None}
        if not shown:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in shown.items())

    @property
    def info(self) -> VariantInfo:
        return REGISTRY[self.name]


def _allowed_names() -> str:
    return ", ".join(REGISTRY)


#: a spec parameter's value: an ASCII decimal integer literal, with an optional sign
_DECIMAL = re.compile(r"[+-]?[0-9]+")


def _int_reads(text: str) -> bool:
    """Whether Python's int() reads ``text`` (which also takes '_' separators and any script's digits)."""
    try:
        int(text)
    except ValueError:
        return False
    return True


def parse_spec(spec: str | VariantSpec) -> VariantSpec:
    """Parse ``NAME[:key=value,...]`` into a :class:`VariantSpec` with defaults filled in.

    Raises:
        VariantError: unknown name (lists the known ones), unknown parameter (lists the allowed
            ones), a parameter given twice, or a value that is not a positive integer written in ASCII
            digits (``'3_0'`` and ``'٣'``, which int() reads, are refused).
    """
    if isinstance(spec, VariantSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise bad_value("variant", spec, f"a spec string NAME[:key=value,...] with NAME one of {_allowed_names()}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in REGISTRY:
        raise bad_value("variant", name, f"one of {_allowed_names()}")
    info = REGISTRY[name]
    params, given = dict(info.params), {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in info.params:
            allowed = ", ".join(info.params) or "none"
            raise VariantError(f"variant {name}: unknown parameter {key!r}; allowed parameters: {allowed}")
        if not eq:
            raise bad_value(f"{name}:{key}", item, f"{key}=<positive integer>")
        if key in given:  # the last one won silently: 'dpfp:nu=1,nu=2' built ν = 2
            raise VariantError(f"variant {name}: parameter {key!r} given twice ({given[key]} and {value.strip()}); "
                               "expected each parameter once")
        given[key] = value.strip()
        if not _DECIMAL.fullmatch(value.strip()):
            # int() also reads '3_0' (30) and other scripts' digits ('٣', '３': 3), which no spec should hold
            raise bad_value(f"{name}:{key}", value.strip(), "a positive integer" if not _int_reads(value.strip())
                            else "a positive integer in ASCII digits 0-9 (no '_' separators or other scripts' digits)")
        digits = value.strip().lstrip("+-").lstrip("0")
        if len(digits) > 40:  # int() of over 4300 digits raised a ValueError of its own; shown() names these by length
            negative = value.strip().startswith("-")
            raise VariantError(f"{name}:{key}: got {'a negative' if negative else 'an'} integer of {len(digits)} digits; "
                               "expected " + ("a positive integer (>= 1)" if negative else
                                              f"at most {MAX_SIZE} (2**63 - 1, the largest size a torch tensor has)"))
        number = int(value.strip())
        if number < 1:
            raise bad_value(f"{name}:{key}", number, "a positive integer (>= 1)")
        if number > MAX_SIZE:  # a softmax window of 2**63 passed the grid loader and failed every run
            raise VariantError(too_large(f"{name}:{key}", number))
        params[key] = number
    return VariantSpec(name, params)


def build_attention(spec: str | VariantSpec, d_key: int, check_finite: bool = False, form: str = "auto",
                    chunk_size: int | None = None) -> Attention:
    """Build the attention module of ``spec`` for keys of size ``d_key``.

    ``form`` (``auto``, ``parallel``, ``chunk``, ``recurrent``) and ``chunk_size`` (the longest chunk
    of chunked kernels; ``None``: the rule's default per path) are kept on the module and used by
    every call. ``check_finite=True`` makes every call raise
    :class:`~variants.errors.NonFiniteError` on a NaN or ±inf in its inputs or carried state (see
    :mod:`variants.checks`).

    Raises:
        VariantError: as :func:`parse_spec`, when a parameter does not fit ``d_key``, for a form
            outside :data:`FORMS` or one the rule has no kernel for, a chunk size that is not a
            positive integer, or a ``check_finite`` that is not a bool.
    """
    check_finite = true_or_false("check_finite", check_finite)  # 'no' switched the check on
    spec = parse_spec(spec)
    info = spec.info
    if info.update_rule is None:
        attention = SoftmaxAttention(d_key, window=spec.params.get("window"), form=form, chunk_size=chunk_size)
    else:
        feature_map = info.feature_map(d_key, **{k: v for k, v in spec.params.items()})
        attention = FastWeightAttention(feature_map, rule=info.update_rule, form=form, chunk_size=chunk_size)
    attention.check_finite = check_finite
    return attention


def d_dot_of(spec: str | VariantSpec, d_key: int) -> int | None:
    """φ's output size for ``spec`` at ``d_key`` (``None`` for softmax), as the feature map declares
    it (:meth:`FeatureMap.output_size`), without building tensors.

    Raises:
        VariantError: as :func:`check_spec`: a bad spec, a d_key that is not a positive integer, or
            parameters the feature map refuses at ``d_key`` (a size for a map that cannot be built:
            ``d_dot_of("dpfp:nu=2", 0)`` was 0, ``d_dot_of("dpfp:nu=9", 2)`` 36)."""
    positive_int("d_key", d_key)
    spec = check_spec(spec, d_key)
    factory = spec.info.feature_map
    if factory is None:
        return None
    if isinstance(factory, type) and issubclass(factory, FeatureMap):
        return factory.output_size(d_key, **spec.params)
    with torch.random.fork_rng(devices=[]):  # a plain factory: build one, leaving the global RNG as it was
        return factory(d_key, **spec.params).d_dot


def check_spec(spec: str | VariantSpec, d_key: int) -> VariantSpec:
    """``spec`` parsed, with its feature map's parameter checks run at ``d_key`` without building
    tensors (:meth:`FeatureMap.check_parameters`: DPFP's ν < 2·d_key, FAVOR+'s m ≤ 2**16), so a
    grid or a benchmark refuses it before anything runs; a spec parses whatever its parameters'
    size. A plain factory (not a :class:`FeatureMap` class) is not checked: it would have to be built.

    Raises:
        VariantError: a bad spec, or parameters its feature map refuses at ``d_key``.
    """
    spec = parse_spec(spec)
    factory = spec.info.feature_map
    if isinstance(factory, type) and issubclass(factory, FeatureMap):
        factory.check_parameters(d_key, **spec.params)
    return spec


def form_in_use(spec: str | VariantSpec, form: str) -> str:
    """The kernel form ``spec``'s ``forward`` runs when built with ``form``: the rule's (``auto``: its
    fastest, e.g. ``chunk`` for the sum and delta rules, ``recurrent`` for the FWM rule); for softmax
    ``recurrent``, else its one parallel kernel (its chunk form is its parallel form).

    Raises:
        VariantError: an unknown form, or one the rule has no kernel for (FWM: only recurrent).
    """
    if form not in FORMS:
        raise bad_value("form", form, f"one of {', '.join(FORMS)}")
    rule = parse_spec(spec).info.update_rule
    if rule is None:
        return "recurrent" if form == "recurrent" else "parallel"
    return rule.kernel_form(form)


def chunk_size_in_use(spec: str | VariantSpec, path: str, chunk_size: int | None = None) -> int | None:
    """The chunk size ``spec``'s attention runs ``path`` with when built with ``chunk_size``
    (``None``: the rule's default for the path), or ``None`` where no chunk size acts there.

    ``path``: a form (``auto`` resolves to the rule's), ``write`` or ``write_read`` (see
    :func:`variants.attention.write_read_path`). Softmax never chunks; neither do the sum rule's
    write and fused write-then-read, nor the FWM rule.

    Raises:
        VariantError: an unknown path, a form the rule has no kernel for (FWM: only recurrent), or a
            ``chunk_size`` that is not a positive integer (0 came back as the chunk size in use).
    """
    rule = parse_spec(spec).info.update_rule
    if chunk_size is not None:
        positive_int("chunk_size", chunk_size)
    paths = (*FORMS, "write", "write_read")
    if path not in paths:
        raise bad_value("path", path, f"one of {', '.join(paths)}")
    if rule is None:
        return None
    if path in FORMS:
        path = rule.kernel_form(path)
    if not rule.chunk_size_acts(path):
        return None
    return rule.default_chunk_size(path) if chunk_size is None else chunk_size


def list_variants() -> list[VariantInfo]:
    """Every registered variant, in registry order."""
    return list(REGISTRY.values())
