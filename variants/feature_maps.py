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

from .checks import check_dense
from .errors import MAX_SIZE, VariantError, bad_value, too_large
from .kernels.dpfp import dpfp
from .kernels.limits import FP32_LIMITS, floor_for, numeric_limits
from .kernels.precision import compute_dtype

#: Smallest Σφ divided by in the sum normalisation, so that φ(0)/Σφ(0) is 0 rather than NaN (DPFP
#: maps 0 to 0). A floor rather than an added eps (the paper's code adds 1e-6): an eps dominates the
#: sum of small features (DPFP of ‖x‖ = 1e-3, FAVOR+ of N(0, 1) inputs at d_key 32) and leaves φ̂
#: summing to far less than 1; the floor leaves Σφ̂ = 1 wherever Σφ exceeds it. This is fp32's value
#: (fp16 and bf16 too); ``floor=None`` takes the compute dtype's, 1e-300 in float64 (:mod:`.kernels.limits`).
SUM_NORM_FLOOR = FP32_LIMITS.floor


def sum_normalize(phi: Tensor, floor: float | None = None) -> Tensor:
    """φ̂ = φ(x) / max(Σ_j φ(x)_j, floor) along the last axis (paper Section 4.2, Eq. 23).

    (…, d_dot) → (…, d_dot), computed and returned in the wider of φ's dtype and fp32 (float64
    stays float64; fp16 and bf16 come back in fp32, the dtype the kernels compute in).

    The delta rule reads and writes with φ̂ (Σ_j φ̂_j = 1), which keeps its fast weight W bounded.
    A key written twice with β = 1 is *not* in general overwritten exactly: writing v₁ then v₂
    under the same key k and reading with k returns a(1 − a)·v₁ + a·v₂ with a = ‖φ̂(k)‖₂², which
    is v₂ only when a = 1, i.e. when φ̂(k) is one-hot (a sum-normalised vector has ‖φ̂‖₂ ≤ 1,
    with equality only there). Keys whose φ̂ spreads over many features keep a share of v₁.

    Raises:
        VariantError: ``phi`` not a floating-point tensor of at least one dimension; a ``floor`` that is not a finite
            number > 0 (:func:`~variants.kernels.limits.floor_for`).
    """
    if not isinstance(phi, Tensor) or phi.dim() < 1:  # a list raised AttributeError ('to')
        raise bad_value("phi", tuple(phi.shape) if isinstance(phi, Tensor) else type(phi).__name__,
                        "a tensor of features (…, d_dot)")
    if not phi.is_floating_point():  # complex φ lost its imaginary part (a torch warning), integer φ was cast
        raise bad_value("phi.dtype", phi.dtype, "a floating-point dtype")
    phi = phi.to(compute_dtype(phi))
    floor = floor_for(phi.dtype, floor)  # 1e-30 in fp32, 1e-300 in float64
    # Multiplying by the reciprocal rather than dividing: autograd's division backward builds
    # three full-size temporaries more, which dominate the delta rule's cost on CPU.
    return phi * phi.sum(dim=-1, keepdim=True).clamp(min=floor).reciprocal()


def _check_input_hook(module: FeatureMap, args: tuple) -> None:
    """Forward pre-hook of every feature map (a function, not a lambda: a module holding it pickles)."""
    if args:
        module.check_input(args[0])


def positive_int(argument: str, value: object, maximum: int = MAX_SIZE, why: str = "") -> int:
    """Return ``value`` as an int if it is an integer in [1, ``maximum``] (Python or NumPy), else raise
    :class:`VariantError` naming ``argument``. Floats (even 2.0) and bools are refused; so is a size above
    torch's largest (:data:`~.errors.MAX_SIZE`), which raised torch's TypeError or an OverflowError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise bad_value(argument, value, "a positive integer (>= 1)")
    if value > maximum:
        raise VariantError(too_large(argument, value, maximum, why))
    return int(value)


class FeatureMap(nn.Module):
    """Base class: ``forward(x)`` maps (B, H, T, d_key) to (B, H, T, d_dot)."""

    #: short name used in spec strings and reports
    name = "feature_map"

    def __init__(self, d_key: int):
        super().__init__()
        self.d_key = positive_int("d_key", d_key)
        self.register_forward_pre_hook(_check_input_hook)  # maps users write too: their forward gets checked x

    def check_input(self, x: object) -> None:
        """Raise :class:`VariantError` unless ``x`` is a floating tensor (…, d_key). Called before every
        ``forward`` (a pre-hook) and by the built-in maps' :meth:`normalized`, :meth:`for_queries` and
        ``exponents``, which do not go through it: DPFP(4) of x (…, 3) returned (…, 6) features, and a
        list, an integer tensor or a 0-d one raised errors from inside torch."""
        if isinstance(x, Tensor):
            check_dense("x", x)  # first: a nested tensor's shape raises
        if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[-1] != self.d_key:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise bad_value("x", shape, f"a tensor of shape (…, d_key={self.d_key})")
        if not x.is_floating_point():
            raise bad_value("x.dtype", x.dtype, "a floating-point dtype")

    @classmethod
    def check_parameters(cls, d_key: int, **params: int) -> None:
        """Raise :class:`VariantError` for a d_key or parameters this map refuses, without building it
        (:func:`variants.registry.check_spec`: the grid loader and ``fwbench bench`` refuse such a spec
        before anything runs). Maps with parameters extend it; their ``__init__`` runs the same checks."""
        positive_int("d_key", d_key)

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
        """φ(x) / max(Σφ(x), floor), the sum-normalised features the delta rule reads and writes with."""
        return sum_normalize(self(x))

    def for_queries(self, x: Tensor) -> Tensor:
        """Features of queries whose read is normalised by the mass zᵀφ(q) (the sum rule): equal to
        φ(x) up to a positive factor per token, which cancels in that read. φ(x) itself here;
        :class:`Favor` uses the freedom to keep the features of any input scale representable."""
        return self(x)

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, d_dot={self.d_dot}"


class ElementwiseFeatureMap(FeatureMap):
    """A φ applied element by element: d_dot = d_key. Subclasses define ``forward``."""

    @classmethod
    def output_size(cls, d_key: int) -> int:
        return d_key

    @property
    def d_dot(self) -> int:
        return self.d_key


#: A token whose every coordinate lies below this is shifted up by its largest one before φ = elu + 1 in
#: the normalised uses (see :meth:`EluPlusOne.for_queries`); tokens above it are computed unshifted, bit
#: for bit as φ(x) (queries are then scaled by a power of two, which the read cancels bit for bit). elu(x) + 1
#: forms e^x as expm1(x) + 1, whose absolute error (up to 6e-8 in fp32) is a relative error up to 5e-6 at
#: x = −5, above 1e-5 below x ≈ −5.8, and swallows e^x whole from x ≈ −16.6: φ is 0 or 2^-24 (6e-8) down
#: to −17.33 (= −25·ln 2), and 0 below. −5 keeps every unshifted φ within 5e-6 of e^x.
ELU_SHIFT_BELOW = -5.0


class EluPlusOne(ElementwiseFeatureMap):
    """φ(x) = elu(x) + 1 (Katharopoulos et al. 2020); d_dot = d_key.

    φ(x) = e^x for x < 0, computed as expm1(x) + 1, so in fp32 a token whose coordinates are all below
    ≈ −16.6 (all below −17.33 for certain; e.g. N(0, 1000²) entries at d_key 8: one token in 256) has φ
    = 0 or 6e-8, and below ≈ −5.8 φ has lost more than 1e-5 of its relative precision: as a query its
    read would be 0 / floor = 0 rather than a normalised row, and as a key it writes nothing. Queries
    of the sum rule and the delta rule's φ̂ are computed on the token shifted by its largest coordinate
    when every coordinate is below −5 (:data:`ELU_SHIFT_BELOW`), then scaled by a power of two so that
    the largest feature lies in [0.5, 1) (:func:`unit_scaled`): positive factors per token, which their
    normalisation cancels, so a query of any scale reads a normalised row (unscaled, fp32 queries of
    1e30 overflowed W φ(q) and read NaN). Keys are φ(x) itself (a factor per key would change the
    weights between keys): a row whose every key underflows reads 0, and keys whose φ summed over the
    sequence overflows the dtype (N(0, 1)·1e37 fp32 keys over 32 tokens: a row reads 0) are out of range.
    """

    name = "elu+1"

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1.0

    def _shifted(self, x: Tensor) -> Tensor:
        """elu(x − s) + 1 = φ(x) · e^(−s) per token, s = the largest coordinate of a token whose every
        coordinate is below :data:`ELU_SHIFT_BELOW`, else 0 (then exactly φ(x)); s is detached."""
        self.check_input(x)
        top = x.detach().amax(dim=-1, keepdim=True)
        shift = torch.where(top < ELU_SHIFT_BELOW, top, torch.zeros_like(top))
        return F.elu(x - shift) + 1.0

    def for_queries(self, x: Tensor) -> Tensor:
        """φ of the shifted token (:meth:`_shifted`) scaled per token by a power of two (:func:`unit_scaled`): a
        positive factor per query, which the sum rule's read W φ(q) / zᵀφ(q) cancels exactly: outputs and
        gradients are those of the unscaled φ(q) bit for bit in fp32, bf16 and float64, away from the
        normaliser's floor (in fp16, gradient entries of subnormal size, below 6.1e-5, may move by one
        subnormal step, 6e-8, where the scale rounds twice). Unscaled, a query of 1e30 (fp32) made W φ(q) overflow and every
        form read NaN, where DPFP's and FAVOR+'s queries read normalised rows."""
        return unit_scaled(self._shifted(x))

    def normalized(self, x: Tensor) -> Tensor:
        return sum_normalize(unit_scaled(self._shifted(x)))


class Tanh(ElementwiseFeatureMap):
    """φ(x) = tanh(x) (the FWM of Schlag et al. 2021); d_dot = d_key. Not non-negative."""

    name = "tanh"

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x)


class DPFP(FeatureMap):
    """Deterministic Parameter-Free Projection with ν rolls (paper Eq. 27–28).

    r(x) = [relu(x), relu(−x)] ∈ R^{2·d_key};
    φ_{i·2d + j}(x) = r(x)_j · r(x)_{(j − i) mod 2d} for i = 1..ν, so d_dot = 2·d_key·ν.
    φ(0) = 0, and every product pairs two distinct coordinates, so keys with disjoint
    support are orthogonal in feature space.

    Scale: queries (:meth:`for_queries`) and φ̂ (:meth:`normalized`) are computed on a per-token
    power-of-two rescaling, so any scale of those reads the same. Keys of the sum rule are φ(k)
    itself (φ(ck) = c²φ(k); a factor per key would change the weights between keys), so a query's
    mass zᵀφ(q) scales with the keys' squared size and falls below the normaliser's floor for keys
    small enough. The floor is the compute dtype's (:mod:`~variants.kernels.limits`: 1e-30 in fp32,
    fp16 and bf16; 1e-300 in float64). A row falls short of 1 once its mass, c² times the query's
    overlap with the keys before it, nears the floor, so the scale where that starts depends on the
    data. Measured with N(0, 1)·c queries and keys (d_key 32, T 32, ν = 1 and 2, the chunk form,
    32 seeds), every row sums to 1 (to the dtype's precision):

    - fp32: for c from 1e-13 to 1e18; at c = 1e-14 a few seeds have a row below 1 (down to 0.01),
      at 1e-15 every seed does (smallest row sums 7e-5 to 0.5), at 1e-16 they are below 0.01,
      at 1e-20 between 1e-14 and 3e-9 (a mass of ≈ 1e-40 against the floor); from c ≈ 3e18
      φ(k) overflows: a row whose mass overflows reads 0, with no NaN (at 5e18 a third of the
      seeds have one at ν = 1, most at ν = 2), and from c ≈ 1e19 the read is NaN;
    - float64: for c from 1e-147 to 1e153; at c = 1e-148 one seed has a row at 0.9 (ν = 1), at
      1e-150 every seed has one (smallest row sums 1e-4 to 0.5), at 1e-152 they are below 1e-4;
      from c ≈ 3e153 rows read 0 likewise (at 5e153 most seeds have one, and a few, 4 of 32 at
      ν = 1 and 2, already a NaN row), and from c ≈ 1e154 the read is NaN.
    """

    name = "dpfp"

    def __init__(self, d_key: int, nu: int = 1):
        self.check_parameters(d_key, nu)
        super().__init__(d_key)
        self.nu = int(nu)

    @classmethod
    def check_parameters(cls, d_key: int, nu: int = 1) -> None:
        """d_key and ν positive integers, ν < 2·d_key (roll i pairs coordinate j with j − i mod 2·d_key)."""
        super().check_parameters(d_key)
        if positive_int("nu", nu) >= 2 * d_key:
            raise bad_value("nu", nu, f"an integer in [1, {2 * d_key - 1}] (< 2·d_key)")

    @classmethod
    def output_size(cls, d_key: int, nu: int = 1) -> int:
        return 2 * d_key * nu

    @property
    def d_dot(self) -> int:
        return self.output_size(self.d_key, self.nu)

    def forward(self, x: Tensor) -> Tensor:
        """(…, d_key) → (…, 2·d_key·ν) in fp32, float64 for float64 x (one fused autograd op,
        :mod:`variants.kernels.dpfp`)."""
        return dpfp(x, self.nu)

    def normalized(self, x: Tensor) -> Tensor:
        """φ(x) / Σφ(x), computed on x scaled per token by a power of two (:func:`unit_scaled`): φ is
        homogeneous of degree 2, so the ratio is unchanged (bit for bit where nothing under- or
        overflows), while φ of the unscaled x would fall below the floor for ‖x‖ ≲ 1e-15 in fp32 (rows
        then no longer sum to 1) and overflow to inf/inf = NaN for ‖x‖ ≳ 1e19."""
        self.check_input(x)
        return dpfp(unit_scaled(x), self.nu, normalize=True)  # the compute dtype's floor

    def for_queries(self, x: Tensor) -> Tensor:
        """φ of x scaled per token by a power of two (:func:`unit_scaled`): φ(x) times a positive
        factor per query, which the sum rule's read W φ(q) / zᵀφ(q) cancels exactly. Keeps that read
        normalised for queries of any scale (unscaled, DPFP of N(0, 1)·1e-8 inputs gives a mass zᵀφ(q)
        below the normaliser's floor, and the output collapses to 0)."""
        self.check_input(x)
        return dpfp(unit_scaled(x), self.nu)

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, nu={self.nu}, d_dot={self.d_dot}"


def unit_scaled(x: Tensor) -> Tensor:
    """x (…, d) times 2^(−e) per token, with e the binary exponent of max_j |x_j| (so that the largest
    entry lies in [0.5, 1)); tokens that are all zero stay zero. A power of two multiplies exactly, so
    a map homogeneous in x (DPFP: φ(cx) = c²φ(x)) changes only by a factor per token that a
    normalisation cancels. The factor is detached: a choice of scale, not a function of x to
    differentiate (the normalised result does not depend on it). e is clipped to the dtype's normal
    range so that 2^(−e) is representable."""
    top = x.detach().abs().amax(dim=-1, keepdim=True)
    exponent = torch.frexp(top).exponent
    bound = -math.log2(torch.finfo(x.dtype).tiny) - 1
    scale = torch.exp2(-exponent.clamp(-bound, bound).to(x.dtype))
    return x * scale


def orthogonal_gaussian(d_key: int, m: int, generator: torch.Generator | None = None,
                        dtype: torch.dtype = torch.float32) -> Tensor:
    """Random projection Ω of shape (d_key, m) with orthogonal columns in blocks of d_key, in ``dtype``.

    Each block is the Q factor of a Gaussian matrix; column norms are redrawn from the norms of
    Gaussian vectors so that each column is marginally N(0, I) (Choromanski et al. 2021, Sec. 2.4).
    The Gaussians are drawn in fp32 whatever ``dtype`` (one random stream for every dtype); the QR
    factorisation and the norms are computed in ``dtype`` (float64 Ω was orthogonal only to fp32's 2e-7).

    Raises:
        VariantError: ``dtype`` is not torch.float32 or torch.float64.
    """
    if dtype not in (torch.float32, torch.float64):  # fp16/bf16 have no QR on the CPU; an int or complex Ω is none
        raise bad_value("dtype", dtype, "torch.float32 or torch.float64 (the dtype Ω is factored in)")
    blocks = []
    for start in range(0, m, d_key):
        width = min(d_key, m - start)
        gaussian = torch.randn(d_key, d_key, generator=generator).to(dtype)
        q, _ = torch.linalg.qr(gaussian)
        norms = torch.randn(d_key, width, generator=generator).to(dtype).norm(dim=0)
        blocks.append(q[:, :width] * norms)
    return torch.cat(blocks, dim=1)


#: fp32's window of a FAVOR+ token's largest exponent inside which its features are exactly the
#: estimator's. Above it, features ≤ e^30 keep φ(q)·φ(k) and its sum over 10^6 tokens far below fp32's
#: largest value (e^88.7); below it, a key would reach no query's mass (see :class:`Favor`). Float64
#: computes with its own window, [−600, 300] (:func:`~.kernels.limits.numeric_limits`).
FAVOR_MAX_EXPONENT = FP32_LIMITS.favor_max_exponent
FAVOR_MIN_EXPONENT = FP32_LIMITS.favor_min_exponent
#: In fp32 the features of a token outside that window are kept within e^-20 (≈ 2e-9) of its largest
#: one, so that every such key has a feature that meets every query's largest with a product ≥ e^-60
#: (float64: within e^-50, product ≥ e^-650).
FAVOR_FEATURE_RANGE = FP32_LIMITS.favor_feature_range
#: The most random features m a FAVOR+ map accepts: its window keeps a sum over 10^6 tokens and
#: 2m ≤ 2^17 features of products ≤ e^60 below fp32's largest value (e^(60 + 13.8 + 11.8) = e^85.6 <
#: e^88.7; float64 likewise, :mod:`~.kernels.limits`), and Ω (d_key, m) is drawn in ⌈m / d_key⌉ QR
#: blocks, so a larger m (``favor:m=9223372036854775807``) hung in the draw before running out of memory.
FAVOR_MAX_FEATURES = 2**16


class Favor(FeatureMap):
    """FAVOR+ positive orthogonal random features (Choromanski et al. 2021), d_dot = 2m.

    φ(x) = [exp(Ωᵀx − ‖x‖²/2), exp(−Ωᵀx − ‖x‖²/2)] / √(2m), an unbiased estimate of exp(qᵀk).
    Ω (d_key × m) is redrawn by :meth:`redraw_features`, which the harness calls once per
    training step; it stays frozen in eval mode. Computed in the wider of the input's dtype and
    fp32 (float64 in float64); Ω is cast to that dtype, so the module works after ``.to(dtype)``.

    What it expects of its inputs: the estimate is of exp(qᵀk) for the q, k given, with no
    temperature; its variance grows like exp(‖q + k‖²), so it is accurate for inputs of moderate
    norm. The Performer code multiplies q and k by d_key^(-1/4) before φ to estimate softmax's
    exp(qᵀk / √d_key); this module applies no such factor (scale the inputs beforehand for it).

    Each feature is ≈ exp(ωᵀx − ‖x‖²/2), so at ordinary scales the features are small (N(0, 1)
    inputs at d_key 32 give an attention mass ≈ 1e-9) and at large scales they underflow. Three
    per-token measures keep a normalised attention normalised at every input scale, and all of
    them are per token, so no feature depends on another token (a stabiliser over the sequence,
    as some Performer code computes for keys, would leak the future):

    - :meth:`for_queries` (the sum rule's queries, whose read zᵀφ(q) normalises): the features
      divided by their largest, exp(e − max e), exact because a per-query factor cancels;
    - :meth:`normalized` (the delta rule's φ̂ = φ / Σφ): softmax over the 2m exponents, the exact
      value of φ / Σφ at any scale;
    - :meth:`forward` (keys, and every unnormalised use): exactly the estimator while the token's
      largest exponent lies in [FAVOR_MIN_EXPONENT, FAVOR_MAX_EXPONENT]; outside, the token is
      scaled as a whole into the window (above: so that nothing overflows; below: so that its
      features do not underflow to 0), and its features are kept within e^-FAVOR_FEATURE_RANGE of
      its largest. Such a key's weight is approximate (the exact one is not representable in
      the compute dtype), but a query's mass is then ≥ e^(min − range) per key, far above the
      normaliser's floor, so rows still sum to 1.

    The window, the range and the floor follow the compute dtype
    (:func:`~variants.kernels.limits.numeric_limits`):

    - fp32 (fp16 and bf16 compute in fp32): window [−40, 30], range 20 (mass ≥ e^-60 per key, floor
      1e-30). N(0, 1) inputs stay inside the window up to d_key ≈ 64; at d_key 128 about a third of
      the tokens leave it at m = 64 (three fifths at m = 16, a seventh at m = 256), and at d_key 256
      all of them, where the Performer's d_key^(-1/4) keeps them inside.
    - float64: window [−600, 300], range 50 (mass ≥ e^-650 per key, floor 1e-300), so float64
      features are the estimator's own where fp32 would move them: N(0, 1) inputs stay inside up to
      d_key 1024 (none of 2000 tokens leaves at m = 16, 64, 256), at d_key 1536 96–99.7 % fall below
      it, at d_key 2048 all. Keys N(0, 1)·64^-1/4·6 at d_key 64 (exponents ≈ −90 … −145) read exactly
      the float64 estimator's rows (to 1e-10), where fp32's window moved them (rows off by 0.99).

    Ω (the ``omega`` buffer) is drawn and factored in fp32 when the module is built, so after ``.double()``
    its columns are orthogonal to fp32's precision (about 2e-7) until :meth:`redraw_features` (the training
    loop's redraw, or a call) draws it again in float64; a cast never redraws it, so that a model keeps its
    features whatever its dtype.
    """

    name = "favor"

    def __init__(self, d_key: int, m: int = 64):
        self.check_parameters(d_key, m)
        super().__init__(d_key)
        self.m = int(m)
        self.register_buffer("omega", orthogonal_gaussian(self.d_key, self.m))

    @classmethod
    def check_parameters(cls, d_key: int, m: int = 64) -> None:
        """d_key and m positive integers, m ≤ :data:`FAVOR_MAX_FEATURES`."""
        super().check_parameters(d_key)
        if positive_int("m", m) > FAVOR_MAX_FEATURES:  # Ω is drawn in ⌈m / d_key⌉ QR blocks: m = 2**63 - 1 never returned
            raise bad_value("m", m, f"an integer in [1, {FAVOR_MAX_FEATURES}] (FAVOR+'s overflow window holds "
                            "for at most that many random features)")

    @classmethod
    def output_size(cls, d_key: int, m: int = 64) -> int:
        return 2 * m

    @property
    def d_dot(self) -> int:
        return self.output_size(self.d_key, self.m)

    def redraw_features(self) -> None:
        """Replace Ω with a fresh draw from the global torch RNG (seeded by the harness), kept on
        Ω's device and in its dtype."""
        wide = torch.float64 if self.omega.dtype == torch.float64 else torch.float32  # QR needs fp32 at least
        self.omega = orthogonal_gaussian(self.d_key, self.m, dtype=wide).to(device=self.omega.device,
                                                                            dtype=self.omega.dtype)

    def exponents(self, x: Tensor) -> Tensor:
        """The estimator's exponents [Ωᵀx − ‖x‖²/2, −Ωᵀx − ‖x‖²/2] − ½ log 2m, (…, d_key) → (…, 2m),
        in the compute dtype (fp32, or float64 for float64 x)."""
        self.check_input(x)
        dtype = compute_dtype(x)
        x = x.to(dtype)
        projection = x @ self.omega.to(dtype)
        offset = 0.5 * x.pow(2).sum(dim=-1, keepdim=True) + 0.5 * math.log(2 * self.m)
        # ‖x‖² overflows for a finite x with entries ≳ 1e19 (fp32): inf − inf = NaN in every feature. Such
        # a token lies far outside the window, where every use of the exponents removes a constant per
        # token (normalized, for_queries, and forward's shift), so the offset can be left out exactly.
        overflowed = torch.isinf(offset) & torch.isfinite(x).all(dim=-1, keepdim=True)
        offset = offset.masked_fill(overflowed, 0.0)
        return torch.cat([projection - offset, -projection - offset], dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        exponent = self.exponents(x)
        # Per token only (amax over the feature axis), so causal. ωᵀx − ‖x‖²/2 reaches ‖ω‖²/2 ≈ d_key/2
        # for x along a column of Ω (e^128 at d_key 256: overflow), and −‖x‖²/2 sends every feature of a
        # large x to exp(−10^6) = 0. The shift is one per token, 0 inside the window. It is differentiated
        # (not detached): for keys it does not cancel (a factor per key changes the weights between keys),
        # so a detached shift gave gradients of another function than the one computed (float64
        # gradcheck of the sum rule failed in every form for keys below the window).
        limits = numeric_limits(exponent.dtype)  # fp32's window, or float64's wider one
        top = exponent.amax(dim=-1, keepdim=True)
        shift = top - top.clamp(limits.favor_min_exponent, limits.favor_max_exponent)
        # only a token outside the window (already approximate) gets the floor: inside it, φ is exact
        floor = torch.where(shift != 0, top - limits.favor_feature_range, float("-inf"))
        return torch.exp(torch.maximum(exponent, floor) - shift)

    def for_queries(self, x: Tensor) -> Tensor:
        """exp(e − max e) per token: φ(x) up to a per-token factor (largest feature 1)."""
        exponent = self.exponents(x)
        return torch.exp(exponent - exponent.amax(dim=-1, keepdim=True).detach())

    def normalized(self, x: Tensor) -> Tensor:
        """φ(x) / Σφ(x) = softmax of the exponents over the 2m features: sums to 1 at any scale."""
        return torch.softmax(self.exponents(x), dim=-1)

    def extra_repr(self) -> str:
        return f"d_key={self.d_key}, m={self.m}, d_dot={self.d_dot}"
