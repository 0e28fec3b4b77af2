"""Feature maps φ: R^{d_key} → R^{d_dot} of linearised attention (paper Section 4).

Every map takes ``x`` of shape (B, H, T, d_key) and returns (B, H, T, d_dot) with non-negative
entries, so that φ(q)·φ(k) is a valid (unnormalised) attention weight.

- :class:`EluPlusOne` — Katharopoulos et al. 2020: φ(x) = elu(x) + 1, d_dot = d_key.
- :class:`Favor` — Choromanski et al. 2021 (FAVOR+), positive orthogonal random features,
  d_dot = 2m (the hyperbolic form exp(ωᵀx), exp(−ωᵀx) that the paper's official code uses).
- :class:`DPFP` — the paper's Deterministic Parameter-Free Projection (Eq. 27–28),
  d_dot = 2·d_key·ν.
- :class:`Tanh` — φ(x) = tanh(x), used by the FWM update rule of Schlag et al. 2021.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import bad_value
from .kernels.dpfp import dpfp

#: Added to Σφ before dividing, so that φ(0)/Σφ(0) is 0 rather than NaN (DPFP maps 0 to 0).
SUM_NORM_EPS = 1e-6


def sum_normalize(phi: Tensor, eps: float = SUM_NORM_EPS) -> Tensor:
    """φ(x) / (Σ_j φ(x)_j + eps) along the last axis (paper Section 4.2, Eq. 23).

    The delta rule needs this: with Σφ = 1 a key written twice with β = 1 is overwritten
    exactly, and the fast weight W stays bounded.
    """
    denominator = phi.sum(dim=-1, keepdim=True) + eps
    if phi.dtype in (torch.float16, torch.bfloat16):
        return phi / denominator  # 1 / eps overflows fp16: φ(0) · (1 / eps) would be 0 · inf
    # Multiplying by the reciprocal rather than dividing: autograd's division backward builds
    # three full-size temporaries more, which dominate the delta rule's cost on CPU.
    return phi * denominator.reciprocal()


def positive_int(argument: str, value: object) -> int:
    """Return ``value`` as an int if it is an integer ≥ 1 (Python or NumPy), else raise
    :class:`VariantError` naming ``argument``. Floats (even 2.0) and bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise bad_value(argument, value, "a positive integer (>= 1)")
    return int(value)


class FeatureMap(nn.Module):
    """Base class: ``forward(x)`` maps (B, H, T, d_key) to (B, H, T, d_dot)."""

    #: short name used in spec strings and reports
    name = "feature_map"

    def __init__(self, d_key: int):
        super().__init__()
        self.d_key = positive_int("d_key", d_key)

    @property
    def d_dot(self) -> int:
        """Output size of φ (the number of columns of the fast weight W)."""
        raise NotImplementedError

    @classmethod
    def output_size(cls, d_key: int, **params: int) -> int:
        """d_dot of the map built as ``cls(d_key, **params)``, declared without building it.

        Maps whose size follows from their arguments override this; the default builds one map
        (with the global RNG left as it was) and asks its :attr:`d_dot`.
        """
        with torch.random.fork_rng(devices=[]):
            return cls(d_key, **params).d_dot

    def redraw_features(self) -> None:
        """Draw new random features; a no-op for deterministic maps (see :class:`Favor`)."""

    def normalized(self, x: Tensor) -> Tensor:
        """φ(x) / (Σφ(x) + eps), the sum-normalised features the delta rule reads and writes with."""
        return sum_normalize(self(x))

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, d_dot={self.d_dot}"


class EluPlusOne(FeatureMap):
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020); d_dot = d_key."""

    name = "elu+1"

    @classmethod
    def output_size(cls, d_key: int) -> int:
        return d_key

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1.0


class Tanh(FeatureMap):
    """φ(x) = tanh(x) (the FWM of Schlag et al. 2021); d_dot = d_key. Not non-negative."""

    name = "tanh"

    @classmethod
    def output_size(cls, d_key: int) -> int:
        return d_key

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x)


class DPFP(FeatureMap):
    """Deterministic Parameter-Free Projection with ν rolls (paper Eq. 27–28).

    r(x) = [relu(x), relu(−x)] ∈ R^{2·d_key};
    φ_{i·2d + j}(x) = r(x)_j · r(x)_{(j − i) mod 2d} for i = 1..ν, so d_dot = 2·d_key·ν.
    φ(0) = 0, and every product pairs two distinct coordinates, so keys with disjoint
    support are orthogonal in feature space.
    """

    name = "dpfp"

    def __init__(self, d_key: int, nu: int = 1):
        super().__init__(d_key)
        self.nu = positive_int("nu", nu)
        if self.nu >= 2 * self.d_key:
            raise bad_value("nu", nu, f"an integer in [1, {2 * self.d_key - 1}] (< 2·d_key)")

    @classmethod
    def output_size(cls, d_key: int, nu: int = 1) -> int:
        return 2 * d_key * nu

    @property
    def d_dot(self) -> int:
        return self.output_size(self.d_key, self.nu)

    def forward(self, x: Tensor) -> Tensor:
        """(…, d_key) → (…, 2·d_key·ν) fp32 (one fused autograd op, :mod:`variants.kernels.dpfp`)."""
        return dpfp(x, self.nu)

    def normalized(self, x: Tensor) -> Tensor:
        return dpfp(x, self.nu, normalize=True, eps=SUM_NORM_EPS)

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, nu={self.nu}, d_dot={self.d_dot}"


def orthogonal_gaussian(d_key: int, m: int, generator: torch.Generator | None = None) -> Tensor:
    """Random projection Ω of shape (d_key, m) with orthogonal columns in blocks of d_key.

    Each block is the Q factor of a Gaussian matrix; column norms are redrawn from the norms of
    Gaussian vectors so that each column is marginally N(0, I) (Choromanski et al. 2021, Sec. 2.4).
    """
    blocks = []
    for start in range(0, m, d_key):
        width = min(d_key, m - start)
        gaussian = torch.randn(d_key, d_key, generator=generator)
        q, _ = torch.linalg.qr(gaussian)
        norms = torch.randn(d_key, width, generator=generator).norm(dim=0)
        blocks.append(q[:, :width] * norms)
    return torch.cat(blocks, dim=1)


#: Largest exponent a FAVOR+ feature may reach: features ≤ e^30 keep φ(q)·φ(k) ≤ 2m·e^60 and its sum
#: over 10^6 tokens below fp32's largest value (e^88.7) for m up to 512.
FAVOR_MAX_EXPONENT = 30.0


class Favor(FeatureMap):
    """FAVOR+ positive orthogonal random features (Choromanski et al. 2021), d_dot = 2m.

    φ(x) = [exp(Ωᵀx − ‖x‖²/2), exp(−Ωᵀx − ‖x‖²/2)] / √(2m), an unbiased estimate of exp(qᵀk).
    Ω (d_key × m) is redrawn by :meth:`redraw_features`, which the harness calls once per
    training step; it stays frozen in eval mode. Computed in fp32 whatever the input dtype.

    Stabilisation is per token only: a shift computed over the whole sequence (as some Performer
    code does for keys) would let a key's features depend on later tokens and leak the future.
    Besides the ‖x‖²/2 of the estimator itself, a token whose largest exponent would exceed
    ``FAVOR_MAX_EXPONENT`` is scaled down as a whole (see :meth:`forward`), so φ never overflows.
    """

    name = "favor"

    def __init__(self, d_key: int, m: int = 64):
        super().__init__(d_key)
        self.m = positive_int("m", m)
        self.register_buffer("omega", orthogonal_gaussian(self.d_key, self.m))

    @classmethod
    def output_size(cls, d_key: int, m: int = 64) -> int:
        return 2 * m

    @property
    def d_dot(self) -> int:
        return self.output_size(self.d_key, self.m)

    def redraw_features(self) -> None:
        """Replace Ω with a fresh draw from the global torch RNG (seeded by the harness)."""
        self.omega = orthogonal_gaussian(self.d_key, self.m).to(self.omega.device)

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        projection = x32 @ self.omega
        offset = 0.5 * x32.pow(2).sum(dim=-1, keepdim=True) + 0.5 * math.log(2 * self.m)
        exponent = torch.cat([projection - offset, -projection - offset], dim=-1)
        # Overflow guard, per token (so causal): ωᵀx − ‖x‖²/2 reaches ‖ω‖²/2 ≈ d_key/2 for x along a
        # column of Ω, and exp of that overflows fp32 (e^88) from d_key ≈ 170 on, or the product
        # φ(q)·φ(k) does from d_key ≈ 128 on. A token whose largest exponent exceeds FAVOR_MAX_EXPONENT
        # is scaled down as a whole; every other token is computed exactly as before. The scale
        # cancels in the delta rule's sum normalisation and for queries in the sum rule's normaliser.
        excess = (exponent.amax(dim=-1, keepdim=True) - FAVOR_MAX_EXPONENT).clamp(min=0).detach()
        return torch.exp(exponent - excess)

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, m={self.m}, d_dot={self.d_dot}"
