"""Variant registry: spec strings such as ``dpfp-delta:nu=2`` or ``favor:m=128`` → modules.

A spec is ``NAME`` or ``NAME:key=value,key=value``. Each registry entry names a feature map and an
update rule; a new variant is one entry here (plus, at most, a new feature map or rule). Names are
``MAP`` (the sum rule), ``MAP-delta``, ``MAP-delta-unnorm`` (the delta rule without sum normalisation
of φ: the ablation of paper Section 4.2) and ``MAP-fwm`` (the FWM rule of Schlag et al. 2021).

>>> spec = parse_spec("dpfp-delta:nu=2")
>>> spec.name, spec.params
('dpfp-delta', {'nu': 2})
>>> build_attention("dpfp-delta:nu=2", d_key=64).d_dot
256
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .attention import Attention, FastWeightAttention, SoftmaxAttention
from .errors import VariantError, bad_value
from .feature_maps import DPFP, EluPlusOne, Favor, FeatureMap, Tanh


@dataclass(frozen=True)
class VariantInfo:
    """One registry entry: how to build a variant and which parameters it accepts."""

    name: str
    description: str
    rule: str  # "softmax", "sum", "delta" or "fwm"
    feature_map: Callable[..., FeatureMap] | None
    params: dict[str, int | None] = field(default_factory=dict)  # name → default value
    source: str = ""
    #: whether φ(k), φ(q) are sum-normalised; None: the rule's default (only the delta rule)
    sum_normalize: bool | None = None


_FEATURE_MAPS = {
    "linear": (EluPlusOne, {}, "φ = elu(x) + 1", "Katharopoulos et al. 2020"),
    "favor": (Favor, {"m": 64}, "FAVOR+ positive orthogonal random features, d_dot = 2m", "Choromanski et al. 2021"),
    "dpfp": (DPFP, {"nu": 1}, "DPFP, d_dot = 2·d_key·ν", "paper Section 5.3"),
    "tanh": (Tanh, {}, "φ = tanh(x)", "Schlag et al. 2021 (FWM)"),
}
#: Feature maps that only make sense with the FWM rule: tanh can be negative, so Σφ (the delta
#: rule's normaliser) and zᵀφ(q) (the sum rule's) can be 0.
_FWM_ONLY = {"tanh"}
_FWM_SOURCE = "Schlag, Munkhdalai & Schmidhuber 2021 (ICLR); paper Section 6.1, Setting 2"

REGISTRY: dict[str, VariantInfo] = {
    "softmax": VariantInfo(
        "softmax", "causal softmax attention (KV cache as state)", "softmax", None,
        {"window": None}, "Vaswani et al. 2017",
    ),
}
for _name, (_cls, _params, _what, _source) in _FEATURE_MAPS.items():
    if _name not in _FWM_ONLY:
        REGISTRY[_name] = VariantInfo(
            _name, f"{_what}, sum rule", "sum", _cls, dict(_params), f"{_source}; paper Eq. 16-18"
        )
        REGISTRY[f"{_name}-delta"] = VariantInfo(
            f"{_name}-delta", f"{_what}, delta rule", "delta", _cls, dict(_params), f"{_source}; paper Eq. 23-26"
        )
        REGISTRY[f"{_name}-delta-unnorm"] = VariantInfo(
            f"{_name}-delta-unnorm", f"{_what}, delta rule without sum normalisation (ablation)", "delta", _cls,
            dict(_params), f"{_source}; paper Section 4.2", sum_normalize=False,
        )
    REGISTRY[f"{_name}-fwm"] = VariantInfo(
        f"{_name}-fwm", f"{_what}, FWM rule (rescaled W, layer-normed read-out)", "fwm", _cls, dict(_params),
        f"{_source}; {_FWM_SOURCE}",
    )


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


def parse_spec(spec: str | VariantSpec) -> VariantSpec:
    """Parse ``NAME[:key=value,...]`` into a :class:`VariantSpec` with defaults filled in.

    Raises:
        VariantError: unknown name (lists the known ones), unknown parameter (lists the allowed
            ones), or a value that is not a positive integer.
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
    params = dict(info.params)
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in info.params:
            allowed = ", ".join(info.params) or "none"
            raise VariantError(f"variant {name}: unknown parameter {key!r}; allowed parameters: {allowed}")
        if not eq:
            raise bad_value(f"{name}:{key}", item, f"{key}=<positive integer>")
        try:
            number = int(value.strip())
        except ValueError:
            raise bad_value(f"{name}:{key}", value.strip(), "a positive integer") from None
        if number < 1:
            raise bad_value(f"{name}:{key}", number, "a positive integer (>= 1)")
        params[key] = number
    return VariantSpec(name, params)


def build_attention(spec: str | VariantSpec, d_key: int, check_finite: bool = False) -> Attention:
    """Build the attention module of ``spec`` for keys of size ``d_key``.

    ``check_finite=True`` makes every call raise :class:`~variants.errors.NonFiniteError` on a NaN
    or ±inf in its inputs or carried state (see :mod:`variants.checks`).

    Raises:
        VariantError: as :func:`parse_spec`, or when a parameter does not fit ``d_key``.
    """
    spec = parse_spec(spec)
    info = spec.info
    if info.rule == "softmax":
        attention = SoftmaxAttention(d_key, window=spec.params.get("window"))
    else:
        feature_map = info.feature_map(d_key, **{k: v for k, v in spec.params.items()})
        attention = FastWeightAttention(feature_map, rule=info.rule, sum_normalize=info.sum_normalize)
    attention.check_finite = bool(check_finite)
    return attention


def d_dot_of(spec: str | VariantSpec, d_key: int) -> int | None:
    """φ's output size for ``spec`` at ``d_key`` (``None`` for softmax), without building tensors."""
    spec = parse_spec(spec)
    name = spec.name.split("-")[0]  # the feature map: the rule suffixes do not change d_dot
    if name == "softmax":
        return None
    if name in ("linear", "tanh"):
        return d_key
    if name == "favor":
        return 2 * spec.params["m"]
    return 2 * d_key * spec.params["nu"]


def list_variants() -> list[VariantInfo]:
    """Every registered variant, in registry order."""
    return list(REGISTRY.values())
