"""Multi-head attention layer: projections around any variant, one interface for every task.

    y, state = layer(x, state=None)        # x, y: (B, T, d_model)

Queries, keys and values are linear projections of x into n_heads heads of size d_key and d_v;
for rules that use β (the delta rule), β = σ(W_β x) per head (paper Eq. 24). The output is the
heads concatenated and projected back to d_model.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from .attention import Attention
from .checks import check_dense, check_finite
from .errors import VariantError, bad_value, check_storage, true_or_false
from .feature_maps import positive_int
from .kernels.precision import autocast_on
from .registry import VariantSpec, build_attention, parse_spec


def _dynamic_quantized_weight(projection: nn.Module | None) -> Tensor | None:
    """The weight of a projection quantized with ``torch.ao.quantization.quantize_dynamic`` (its ``weight()``
    method unpacks the qint8 or fp16 weight); ``None`` for any other projection or none."""
    weight = getattr(projection, "weight", None)
    if callable(weight) and not isinstance(weight, Tensor):
        packed = weight()
        return packed if isinstance(packed, Tensor) else None
    return None


class AttentionLayer(nn.Module):
    """Projections + attention variant.

    Args:
        variant: spec string (``"dpfp-delta:nu=2"``) or :class:`VariantSpec`.
        d_model: model width; must be divisible by ``n_heads`` when ``d_key`` is not given.
        n_heads: number of heads H.
        d_key: per-head key size (default d_model / n_heads).
        d_value: per-head value size (default d_key).
        check_finite: raise :class:`~variants.errors.NonFiniteError` on NaN/inf in ``x`` or in
            the attention's inputs and state (default off; the harness switches it on).
        form, chunk_size: the attention form and chunk size every call runs with (see
            :func:`variants.build_attention`); kept on ``layer.attention``.

    Raises:
        VariantError: bad spec, non-positive sizes, d_model not divisible by n_heads, or ``bias`` or
            ``check_finite`` not a bool.
    """

    def __init__(self, variant: str | VariantSpec, d_model: int, n_heads: int,
                 d_key: int | None = None, d_value: int | None = None, bias: bool = False,
                 check_finite: bool = False, form: str = "auto", chunk_size: int | None = None):
        super().__init__()
        self.spec = parse_spec(variant)
        # flags: a truthy non-bool ('no') switched biases or the check on silently
        bias = true_or_false("bias", bias)
        check_finite = true_or_false("check_finite", check_finite)
        self.d_model = positive_int("d_model", d_model)
        self.n_heads = positive_int("n_heads", n_heads)
        if d_key is None:
            if d_model % n_heads:
                raise VariantError(
                    f"d_model: got {d_model}, which n_heads={n_heads} does not divide; "
                    "expected a multiple of n_heads (or pass d_key)"
                )
            d_key = d_model // n_heads
        self.d_key = positive_int("d_key", d_key)
        self.d_value = positive_int("d_value", d_value if d_value is not None else self.d_key)
        for size, name in ((self.d_key, "d_key"), (self.d_value, "d_value")):
            check_storage({"d_model": self.d_model, "n_heads": self.n_heads, name: size},
                          (self.n_heads * size, self.d_model), f"(n_heads · {name}, d_model) projection weight")
        self.attention: Attention = build_attention(self.spec, self.d_key, check_finite=check_finite, form=form,
                                                     chunk_size=chunk_size)
        H = self.n_heads
        self.q_proj = nn.Linear(d_model, H * self.d_key, bias=bias)
        self.k_proj = nn.Linear(d_model, H * self.d_key, bias=bias)
        self.v_proj = nn.Linear(d_model, H * self.d_value, bias=bias)
        self.beta_proj = nn.Linear(d_model, H, bias=True) if self.attention.uses_beta else None
        self.out_proj = nn.Linear(H * self.d_value, d_model, bias=bias)

    @property
    def d_dot(self) -> int | None:
        return self.attention.d_dot

    def _heads(self, x: Tensor, size: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, size).transpose(1, 2)

    def _check_like_weights(self, x: Tensor) -> None:
        """x on the layer's device and of its dtype (under autocast, which casts fp16, bf16 and fp32 for the
        projections: float64 only beside float64 weights), where the query projection keeps a floating weight.
        A float64 x into a float32 layer raised torch's 'expected m1 and m2 to have the same dtype' from the first
        projection, and a meta x into a CPU layer returned a meta output for softmax and a device error from
        inside the kernels for the others. A layer quantized with ``torch.ao.quantization.quantize_dynamic``
        takes fp32 x on its device, whichever of its projections were quantized."""
        for projection in (self.q_proj, self.k_proj, self.v_proj, self.beta_proj, self.out_proj):
            # any quantized projection, not the query's only: with k_proj alone quantized a bf16 x under autocast
            # passed the query's check and raised torch's 'expected scalar type Float but found BFloat16'
            packed = _dynamic_quantized_weight(projection)
            if packed is not None:
                # it computes from fp32 input only, whatever its weight's dtype and under autocast too: a
                # float64, fp16 or bf16 x raised torch's 'expected scalar type Float but found Double'
                if x.device != packed.device:
                    raise bad_value("x.device", str(x.device), f"the layer's device ({packed.device}); move x with .to()")
                if x.dtype != torch.float32:
                    raise bad_value("x.dtype", x.dtype, "torch.float32, the input of a layer quantized with "
                                    "quantize_dynamic; cast x with .float()")
                return
        weight = getattr(self.q_proj, "weight", None)
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            # a projection that keeps no floating weight tensor decides what it takes (a user's wrapper
            # without .weight); reading weight.device raised AttributeError
            return
        if x.device != weight.device:
            raise bad_value("x.device", str(x.device), f"the layer's device ({weight.device}); move x or the layer with .to()")
        if x.dtype != weight.dtype and not (
                autocast_on(x)  # casts fp16, bf16 and fp32 alike for the projections, never float64
                and (x.dtype == torch.float64) == (weight.dtype == torch.float64)):
            raise VariantError(f"x.dtype: got {x.dtype}; expected the layer's dtype ({weight.dtype}); cast x, or the "
                               "layer with .to(dtype)")

    def forward(self, x: Tensor, state=None):
        """(B, T, d_model) → ((B, T, d_model), state after the last token), in the layer's form.

        Raises:
            VariantError: x not a floating (B, T, d_model) tensor on the layer's device and of its dtype
                (under autocast: float64 for float64 weights only); a state from another variant, batch or dtype.
            NonFiniteError: a NaN or ±inf in x, with ``check_finite`` on."""
        if isinstance(x, Tensor):
            check_dense("x", x)  # first: a nested tensor's shape raises
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise bad_value("x", shape, f"a tensor of shape (B, T, d_model={self.d_model})")
        if not x.is_floating_point():
            raise bad_value("x.dtype", x.dtype, "a floating-point dtype")
        self._check_like_weights(x)
        if self.attention.check_finite:
            check_finite(x=x)
        q = self._heads(self.q_proj(x), self.d_key)
        k = self._heads(self.k_proj(x), self.d_key)
        v = self._heads(self.v_proj(x), self.d_value)
        beta = None
        if self.beta_proj is not None:
            beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)
        if len({t.dtype for t in (q, k, v, beta) if t is not None}) > 1:
            # some projections quantized (quantize_dynamic, fp32 out) beside float ones autocast runs in bf16:
            # the attention takes one dtype, and computes fast weights in fp32 either way
            common = functools.reduce(torch.promote_types, [t.dtype for t in (q, k, v, beta) if t is not None])
            q, k, v = q.to(common), k.to(common), v.to(common)
            beta = None if beta is None else beta.to(common)
        y, state = self.attention(q, k, v, beta=beta, state=state)
        B, _, T, _ = y.shape
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_value).to(x.dtype)
        return self.out_proj(y), state

    def state_nbytes(self, batch: int, tokens: int) -> int:
        """Bytes of the carried state for ``batch`` sequences after ``tokens`` tokens."""
        return self.attention.state_nbytes(batch, self.n_heads, self.d_value, tokens)

    def extra_repr(self) -> str:
        return f"variant={self.spec}, d_model={self.d_model}, n_heads={self.n_heads}, d_key={self.d_key}"
