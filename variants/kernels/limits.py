"""The numeric limits of the normalisers and of FAVOR+'s exponent window, per compute dtype.

Each limit keeps a value away from the edges of the dtype it is computed in, so it has to follow
that dtype: float64 given fp32's limits would floor attention masses and move FAVOR+ features that
float64 represents exactly (issue 14). The kernels compute in fp32 or float64
(:func:`~.precision.compute_dtype`; fp16 and bf16 run in fp32), so there are two sets.

Edges, as natural logarithms: fp32's largest value is e^88.72 and its smallest normal number
e^-87.34 (1.2e-38); float64's are e^709.78 and e^-708.40 (2.2e-308). A sum over 10^6 tokens adds
e^13.8 to a term's size.

- ``floor``: the smallest attention mass zᵀφ(q) (sum rule) or feature sum Σφ (sum normalisation)
  an output is divided by. Far above the dtype's smallest normal number, so that 1 / floor and the
  gradients through it (ḡ·y / floor) stay finite, with 8 orders of magnitude to spare in both:
  fp32 1e-30 = e^-69.1 (1 / floor = 1e30 < 3.4e38); float64 1e-300 = e^-690.8 (1e300 < 1.8e308).
  First-order only: a second derivative (``create_graph=True``) divides by the mass squared, which
  overflows for masses below about 1 / √(largest value) (fp32 ≈ 5e-20, float64 ≈ 7e-155), so second
  derivatives at masses between that and the floor are NaN (inf − inf), e.g. float64 FAVOR+ keys
  below its window, or float64 DPFP keys of size 1e-90 (a known gap, see the strict xfail in
  ``tests/variants/test_double_backward.py``).
- ``favor_max_exponent``: a FAVOR+ token's largest exponent above which it is scaled down. Features
  ≤ e^M keep a product φ(q)·φ(k) ≤ e^2M and its sum over 10^6 tokens and 2m ≤ 2^17 features
  (``FAVOR_MAX_FEATURES`` m ≤ 2^16 in :mod:`variants.feature_maps`) below the largest value: fp32
  M = 30, e^(60 + 13.8 + 11.8) = e^85.6 < e^88.7; float64 M = 300, e^(600 + 13.8 + 11.8) = e^625.6
  < e^709.8.
- ``favor_min_exponent`` and ``favor_feature_range``: a token whose largest exponent lies below the
  minimum is scaled up to it, and its features are kept within e^-range of its largest, so that
  each such key meets every query's largest feature (1 for the sum rule's queries) with a product
  ≥ e^(min − range), above the floor: fp32 −40 − 20 = −60 > −69.1 (floor); float64
  −600 − 50 = −650 > −690.8 (floor), and above float64's smallest normal number (e^-708.4), so no
  such feature is denormal. Inside the window FAVOR+'s features are the estimator's own values.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ..errors import bad_value


@dataclass(frozen=True)
class NumericLimits:
    """The limits for one compute dtype (module docstring): ``floor`` (mass or feature sum, a
    plain number), FAVOR+'s window [``favor_min_exponent``, ``favor_max_exponent``] and
    ``favor_feature_range`` (natural-log units)."""

    floor: float
    favor_max_exponent: float
    favor_min_exponent: float
    favor_feature_range: float


#: fp32 (and fp16/bf16, which compute in fp32): the values the suite has always used.
FP32_LIMITS = NumericLimits(floor=1e-30, favor_max_exponent=30.0, favor_min_exponent=-40.0,
                            favor_feature_range=20.0)
#: float64: the same margins taken against float64's range.
FLOAT64_LIMITS = NumericLimits(floor=1e-300, favor_max_exponent=300.0, favor_min_exponent=-600.0,
                               favor_feature_range=50.0)


def numeric_limits(dtype: torch.dtype) -> NumericLimits:
    """The limits for a computation in ``dtype``: float64's for float64, fp32's for every other
    dtype (the kernels compute fp16, bf16 and fp32 inputs in fp32; pass the compute dtype)."""
    return FLOAT64_LIMITS if dtype == torch.float64 else FP32_LIMITS


def floor_for(dtype: torch.dtype, floor: float | None = None) -> float:
    """``floor`` if one is given, else the floor of ``dtype`` (:func:`numeric_limits`): the
    default of every kernel's ``floor`` argument (and :func:`~variants.feature_maps.sum_normalize`'s),
    resolved once the compute dtype is known.

    Raises:
        VariantError: a given ``floor`` that is not a finite number > 0 (0, a negative one or NaN turned
            every all-zero feature row or empty attention row into NaN silently, NaN every row; inf
            read every row as 0; a string raised a bare TypeError from clamp)."""
    if floor is None:
        return numeric_limits(dtype).floor
    if isinstance(floor, bool) or not isinstance(floor, numbers.Real) or not (math.isfinite(floor) and floor > 0):
        raise bad_value("floor", floor, "a finite number > 0, or None for the compute dtype's floor")
    return float(floor)
