"""Every kernel computes in the widest dtype among its arguments (and at least fp32), whichever
argument that is (:func:`~variants.kernels.precision.compute_dtype`; issue 14 item 14, from the
mutants that survived: a dropped argument of ``compute_dtype``, ``dtype = None``, or one
``x.to(dtype)`` made ``x.to(None)`` changed nothing any test saw).

- One argument in float64, the others fp32: the outputs the kernel keeps in the compute dtype (the
  state, the fused read) are float64 and equal the all-float64 call to 1e-12 (fp32 arithmetic
  anywhere in between misses by ~1e-7); the outputs returned in v's dtype match to fp32 rounding.
- Every argument bf16: those outputs are fp32 and match the float64 call on the same values to
  1e-5 (bf16 arithmetic misses by ~1e-2).
- Softmax attention keeps no compute dtype of its own: a cache in another dtype is read as if cast
  to the new tokens' dtype (to q's, in the read), bit for bit; and its cache keeps the last
  window − 1 tokens (all without a window); an empty call returns it as it came.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

from fwbench.variants import FastWeightAttention, FeatureMap, VariantError, build_attention
from fwbench.variants.kernels import (
    delta_rule_chunk,
    delta_rule_parallel,
    delta_rule_read,
    delta_rule_recurrent,
    delta_rule_write_read,
    fwm_rule_read,
    fwm_rule_recurrent,
    fwm_rule_write,
    softmax_parallel,
    softmax_read,
    softmax_recurrent,
    sum_rule_chunk,
    sum_rule_parallel,
    sum_rule_read,
    sum_rule_recurrent,
    sum_rule_write,
    sum_rule_write_read,
)

B, H, T, T_Q, D_DOT, D_V = 2, 2, 10, 3, 4, 3
#: float64 arithmetic agrees with float64 arithmetic to ~1e-15; one fp32 step would leave ~1e-7.
FLOAT64_TOL = 1e-12
#: fp32 arithmetic on bf16-valued inputs against float64 on the same values: ~1e-7; bf16 arithmetic ~1e-2.
FP32_TOL = 1e-5


class Kernel(NamedTuple):
    """A kernel, the names of its tensor arguments in order (keys of :func:`inputs`), and which of
    its outputs it keeps in the compute dtype (the others come back in v's dtype)."""

    fn: Callable
    args: tuple[str, ...]
    compute_outputs: tuple[int, ...]
    kwargs: dict | None = None


SUM, DELTA, FWM = ("q", "k", "v", "W0", "z0"), ("q", "k", "v", "beta", "W0"), ("q", "k", "v", "beta", "W0")
KERNELS = {
    "sum_rule_recurrent": Kernel(sum_rule_recurrent, SUM, (1, 2)),
    "sum_rule_parallel": Kernel(sum_rule_parallel, SUM, (1, 2)),
    "sum_rule_chunk": Kernel(sum_rule_chunk, SUM, (1, 2), {"chunk_size": 4}),
    "sum_rule_write": Kernel(sum_rule_write, SUM[1:], (0, 1)),
    "sum_rule_write_read": Kernel(sum_rule_write_read, ("queries", *SUM[1:]), (0,)),
    "sum_rule_read": Kernel(sum_rule_read, ("queries", "W", "z"), (0,)),
    "delta_rule_recurrent": Kernel(delta_rule_recurrent, DELTA, (1,)),
    "delta_rule_parallel": Kernel(delta_rule_parallel, DELTA, (1,)),
    "delta_rule_chunk": Kernel(delta_rule_chunk, DELTA, (1,), {"chunk_size": 4}),
    "delta_rule_write_read": Kernel(delta_rule_write_read, ("queries", *DELTA[1:]), (0,), {"chunk_size": 4}),
    "delta_rule_read": Kernel(delta_rule_read, ("queries", "W"), (0,)),
    "fwm_rule_recurrent": Kernel(fwm_rule_recurrent, FWM, (1,)),
    "fwm_rule_write": Kernel(fwm_rule_write, FWM[1:], (0,)),
    "fwm_rule_read": Kernel(fwm_rule_read, ("queries", "W"), (0,)),
}
CASES = [(name, wide) for name, kernel in KERNELS.items() for wide in kernel.args]


def inputs(name: str, dtype: torch.dtype = torch.float32, wide: str | None = None) -> dict[str, torch.Tensor]:
    """Valid arguments of every rule in ``dtype``, the argument ``wide`` in float64 with values that
    fp32 cannot hold. φ-mapped queries and keys are positive; the delta rule's are sum-normalised."""
    g = torch.Generator().manual_seed(3)

    def features(*shape):
        x = F.elu(torch.randn(*shape, generator=g, dtype=torch.float64)) + 1.0
        return x / x.sum(-1, keepdim=True) if name.startswith("delta") else x

    given = {
        "q": features(B, H, T, D_DOT), "k": features(B, H, T, D_DOT), "queries": features(B, H, T_Q, D_DOT),
        "v": torch.randn(B, H, T, D_V, generator=g, dtype=torch.float64),
        "beta": torch.rand(B, H, T, generator=g, dtype=torch.float64),
        "W0": 0.3 * torch.randn(B, H, D_V, D_DOT, generator=g, dtype=torch.float64),
        "W": 0.3 * torch.randn(B, H, D_V, D_DOT, generator=g, dtype=torch.float64),
        "z0": features(B, H, D_DOT), "z": features(B, H, D_DOT),
    }
    return {key: x if key == wide else x.to(dtype) for key, x in given.items()}


def call(kernel: Kernel, given: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    out = kernel.fn(*(given[arg] for arg in kernel.args), **(kernel.kwargs or {}))
    return out if isinstance(out, tuple) else (out,)


def built_or_skipped(spec: str, form: str, chunk_size: int):
    """``build_attention(spec, 4, form=form, chunk_size=chunk_size)``, the test skipped where the rule has no
    kernel for ``form``."""
    try:
        return build_attention(spec, 4, form=form, chunk_size=chunk_size)
    except VariantError:
        pytest.skip("a form the rule has no kernel for")


@pytest.mark.parametrize(("name", "wide"), CASES, ids=[f"{name}-{wide}_float64" for name, wide in CASES])
def test_one_float64_argument_makes_the_kernel_compute_in_float64(name, wide):
    kernel = KERNELS[name]
    mixed = inputs(name, torch.float32, wide)
    outputs = call(kernel, mixed)
    expected = call(kernel, {key: x.double() for key, x in mixed.items()})
    v_dtype = mixed["v"].dtype
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        if i in kernel.compute_outputs or v_dtype == torch.float64:
            assert out.dtype == torch.float64, f"output {i}: {out.dtype}"
            torch.testing.assert_close(out, ref, rtol=FLOAT64_TOL, atol=FLOAT64_TOL, msg=f"output {i}")
        else:  # returned in v's dtype: rounded once, after a float64 computation
            assert out.dtype == v_dtype, f"output {i}: {out.dtype}"
            torch.testing.assert_close(out, ref.to(v_dtype), rtol=1e-6, atol=1e-6, msg=f"output {i}")


@pytest.mark.parametrize("name", KERNELS)
def test_bf16_arguments_are_computed_in_fp32(name):
    kernel = KERNELS[name]
    given = inputs(name, torch.bfloat16)
    outputs = call(kernel, given)
    expected = call(kernel, {key: x.double() for key, x in given.items()})
    for i in kernel.compute_outputs:
        assert outputs[i].dtype == torch.float32, f"output {i}: {outputs[i].dtype}"
        torch.testing.assert_close(outputs[i].double(), expected[i], rtol=FP32_TOL, atol=FP32_TOL, msg=f"output {i}")


def test_softmax_reads_a_cache_of_another_dtype_as_if_cast_first():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, H, 4, D_DOT, generator=g) for _ in range(3))
    k_cache, v_cache = (torch.randn(B, H, 5, D_DOT, generator=g, dtype=torch.float64) for _ in range(2))
    for fn in (softmax_parallel, softmax_recurrent):
        y, keys, values = fn(q, k, v, k_cache, v_cache)
        y_ref, keys_ref, values_ref = fn(q, k, v, k_cache.float(), v_cache.float())
        assert torch.equal(y, y_ref) and torch.equal(keys, keys_ref) and torch.equal(values, values_ref), fn.__name__
    assert torch.equal(softmax_read(q, k_cache, v_cache), softmax_read(q, k_cache.float(), v_cache.float()))
    q64 = q.double()
    y = softmax_read(q64, k_cache.float(), v_cache.float())
    assert y.dtype == torch.float64
    assert torch.equal(y, softmax_read(q64, k_cache.float().double(), v_cache.float().double()))


@pytest.mark.parametrize(("window", "P", "T", "kept"), [(1, 2, 3, 0), (10, 2, 4, 6), (3, 5, 0, 5), (None, 5, 0, 5)])
def test_softmax_keeps_the_last_window_minus_one_tokens_in_its_cache(window, P, T, kept):
    """The cache holds what the next query may still see: min(window − 1, P + T) tokens (all without
    a window); a call of no token returns the cache as it came (row L41: the state unchanged; trimmed,
    a write's cache of `window` tokens lost one and later reads changed, 7111177); d_key 4 < P + T, so
    that a bound taken from the wrong axis shows."""
    g = torch.Generator().manual_seed(6)
    k_cache, v_cache = (torch.randn(1, 1, P, 4, generator=g) for _ in range(2))
    q, k, v = (torch.randn(1, 1, T, 4, generator=g) for _ in range(3))
    for fn in (softmax_parallel, softmax_recurrent):
        _, keys, values = fn(q, k, v, k_cache, v_cache, window=window)
        expected = torch.cat([k_cache, k], dim=2)[:, :, P + T - kept:]
        assert torch.equal(keys, expected) and values.shape[2] == kept, fn.__name__


@pytest.mark.parametrize("wide", [None, "queries", "k", "v", "beta", "W0"])
def test_the_delta_write_read_of_an_empty_sequence_reads_the_carried_state(wide):
    """T = 0: nothing is written, so y = W0 q (zeros without W0), in the compute dtype."""
    given = inputs("delta_rule_write_read", torch.float32, wide)
    k, v, beta = (given[name][:, :, :0] for name in ("k", "v", "beta"))
    dtype = torch.float32 if wide is None else torch.float64
    y = delta_rule_write_read(given["queries"], k, v, beta, given["W0"])
    assert y.dtype == dtype and y.shape == (B, H, T_Q, D_V)
    expected = given["queries"].double() @ given["W0"].double().mT
    tol = FLOAT64_TOL if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol)
    empty = delta_rule_write_read(given["queries"], k, v, beta)
    dtype = torch.float32 if wide in (None, "W0") else torch.float64
    assert empty.dtype == dtype and torch.equal(empty, torch.zeros(B, H, T_Q, D_V, dtype=dtype))


BETA_SPECS = ["linear-delta", "favor-delta:m=4", "dpfp-delta-unnorm", "linear-fwm"]


@pytest.mark.parametrize("form", ["auto", "parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("spec", BETA_SPECS)
def test_a_wider_beta_computes_in_the_dtype_of_q_k_v_so_its_state_carries_on(spec, form):
    """β may come in another floating dtype than q, k, v; a float64 β beside fp32 inputs made the kernels
    compute in float64 and return a float64 state, which the next call with the same inputs refused
    ("state.W.dtype: got torch.float64; expected torch.float32"), as did every form's write-then-read but
    the fused one. It is now read in the inputs' compute dtype: bit for bit the fp32 β's answers."""
    attention = built_or_skipped(spec, form, chunk_size=2)
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2, 6, 4, generator=generator), torch.randn(2, 2, 6, 4, generator=generator)
    v, beta = torch.randn(2, 2, 6, 3, generator=generator), torch.rand(2, 2, 6, generator=generator, dtype=torch.float64)
    y, state = attention(q, k, v, beta=beta)
    y_narrow, state_narrow = attention(q, k, v, beta=beta.float())
    assert state.W.dtype == torch.float32 and torch.equal(y, y_narrow) and torch.equal(state.W, state_narrow.W)
    first, carried = attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], beta=beta[:, :, :3])
    second, _ = attention(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], beta=beta[:, :, 3:], state=carried)
    torch.testing.assert_close(torch.cat([first, second], dim=2), y)
    assert torch.equal(attention.write(k, v, beta).W, attention.write(k, v, beta.float()).W)
    assert torch.equal(attention.write_read(k, v, q, beta), attention.write_read(k, v, q, beta.float()))


@pytest.mark.parametrize("form", ["auto", "parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("spec", ["linear", "dpfp", "favor:m=8", *BETA_SPECS])
def test_a_write_read_takes_half_queries_beside_fp32_keys_as_read_does(spec, form):
    """A fast-weight read computes fp16 and bf16 queries in fp32, so ``read(q, write(k, v))`` takes them
    beside the fp32 state that fp32 keys wrote, and the retrieval model under CPU autocast gives its
    write-then-read such queries (its keys add an fp32 table to a projection autocast runs in bf16).
    A check that q shares the keys' dtype (848217e) refused them there, 'q.dtype: got torch.bfloat16;
    expected the dtype of k (torch.float32)', where the answers had been those of read and write; q of
    another compute dtype (float64 beside fp32 keys) is still refused."""
    from fwbench.tasks.retrieval import RetrievalModel

    attention = built_or_skipped(spec, form, chunk_size=2)
    generator = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 2, 3, 4, generator=generator), torch.randn(2, 2, 6, 4, generator=generator)
    v, beta = torch.randn(2, 2, 6, 3, generator=generator), torch.rand(2, 2, 6, generator=generator)
    beta = beta if attention.uses_beta else None
    for dtype in torch.float16, torch.bfloat16:
        expected = attention.read(q.to(dtype), attention.write(k, v, beta))
        torch.testing.assert_close(attention.write_read(k, v, q.to(dtype), beta), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(VariantError, match=r"q.dtype: got torch.float64; expected one computed in the dtype of k"):
        attention.write_read(k, v, q.double(), beta)
    if form in ("parallel", "recurrent"):  # autocast leaves the auto form's one-hot path in fp32
        torch.manual_seed(0)
        model, ids = RetrievalModel(spec, 8, d_key=8, form=form), torch.randint(0, 8, (2, 5))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model(ids, ids.flip(1), ids[:, :2]).shape == (2, 2, 8)


AUTOCAST_SPECS = ["linear", "favor:m=8", "linear-delta", "dpfp-delta", "favor-delta:m=8", "linear-delta-unnorm",
                  "linear-fwm"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["auto", "parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("spec", AUTOCAST_SPECS)
def test_fast_weights_under_cpu_autocast_keep_an_fp32_state_with_or_without_autograd(spec, form, dtype):
    """Under ``torch.autocast("cpu")`` the chunked kernels' products come back in bf16/fp16. Without autograd
    (``torch.no_grad()``: generation, evaluation; a quantized layer, whose weights record nothing) the delta
    rule's in-place state update raised 'Bad in-place call: input tensor dtype float and output tensor
    dtype c10::BFloat16 should match', its fused write-then-read '"triangular_solve_cpu" not implemented
    for 'BFloat16'' (with autograd too); and the sum and delta rules' chunked forms returned a bf16 W,
    which the next call refused ('state.W.dtype: got torch.bfloat16; expected torch.float32'), so a state
    could not be carried. Now every call answers, the state is fp32 as FastWeightState promises, and the
    answers without autograd are those with it, bit for bit."""
    attention = built_or_skipped(spec, form, chunk_size=3)
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 7, 4, generator=generator).to(dtype) for _ in range(3))
    beta = torch.rand(2, 2, 7, generator=generator).to(dtype) if attention.uses_beta else None

    def calls(grad: bool) -> list[torch.Tensor]:
        inputs = [x.detach().requires_grad_(grad) for x in (q, k, v)]
        qq, kk, vv = inputs
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=dtype):
            y, state = attention(qq[:, :, :4], kk[:, :, :4], vv[:, :, :4], None if beta is None else beta[:, :, :4])
            y2, state = attention(qq[:, :, 4:], kk[:, :, 4:], vv[:, :, 4:], None if beta is None else beta[:, :, 4:],
                                  state=state)
            written = attention.write(kk, vv, beta)
            answers = [y, y2, state.W, written.W, attention.read(qq, written),
                       attention.write_read(kk, vv, qq[:, :, -1:], beta)]
        assert state.W.dtype == written.W.dtype == torch.float32
        return [x.detach() for x in answers]

    for with_grad, without in zip(calls(True), calls(False), strict=True):
        torch.testing.assert_close(without, with_grad, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("spec", ["linear", "linear-delta", "dpfp-delta", "favor-delta:m=8"])
def test_a_language_model_generates_under_cpu_autocast_with_a_carried_state(spec, quantized):
    """Generation (``torch.no_grad``, the recurrent form after the prompt) under CPU autocast, carrying the
    state into a second call, for a model and its ``quantize_dynamic`` copy: the delta rule's prompt raised
    'Bad in-place call …' and the sum rule's 'state.W.dtype: got torch.bfloat16; expected torch.float32'."""
    from fwbench.tasks.lm_model import DecoderConfig, DecoderLM

    torch.manual_seed(0)
    model = DecoderLM(spec, DecoderConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, d_ff=16, context=8,
                                          form="chunk")).eval()
    if quantized:
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, states = model.generate(torch.randint(0, 11, (2, 5)), 6, generator=torch.Generator().manual_seed(0))
        more, _ = model.generate(out[:, -2:], 3, states=states, generator=torch.Generator().manual_seed(1))
    assert out.shape[0] == more.shape[0] == 2
    assert all(s.W.dtype == torch.float32 for s in states)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["auto", "parallel", "chunk"])
@pytest.mark.parametrize("spec", ["linear-delta", "dpfp-delta", "favor-delta:m=8", "linear-delta-unnorm"])
def test_a_delta_rule_trains_under_cpu_autocast_with_the_backward_outside_it(spec, form, dtype):
    """The training step torch documents for autocast: the forward inside ``torch.autocast("cpu")``, the
    backward after it. The chunked delta rule's Gram matrix came back in bf16/fp16 beside fp32 keys (or
    fp32 beside bf16 FAVOR+ features), and its hand-written backward raised 'expected scalar type BFloat16
    but found Float'. Now the gradients are those of the fp32 run to half-precision rounding."""
    torch.manual_seed(0)
    attention = build_attention(spec, 4, form=form, chunk_size=3)
    generator = torch.Generator().manual_seed(1)
    # small keys keep the unnormalised ablation's write stable (β ‖φ(k)‖² < 2)
    q, k, v = (0.3 * torch.randn(2, 2, 7, 4, generator=generator) for _ in range(3))
    beta = 0.5 * torch.rand(2, 2, 7, generator=generator)

    def grads(autocast: bool) -> list[torch.Tensor]:
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v, beta)]
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            y, _ = attention(*inputs)
        y.float().sum().backward()
        return [x.grad for x in inputs]

    for half, full in zip(grads(True), grads(False), strict=True):
        assert half.dtype == torch.float32
        torch.testing.assert_close(half, full, rtol=0.1, atol=0.05)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["auto", "parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("spec", ["dpfp", "linear", "favor:m=8", "dpfp-delta", "linear-fwm"])
def test_fast_weights_under_cpu_autocast_are_computed_in_fp32(spec, form, dtype):
    """Fast weights are computed in fp32 under CPU autocast too (the compute dtype of bf16/fp16 inputs).
    Autocast ran φ's and the kernels' matmuls in bf16/fp16, and the sum-normalised read's gradient, a
    difference of near-equal terms over a small mass, lost every digit: DPFP's query gradient was 100 %
    off the fp32 run's (bf16, every form), its key gradient 64 % (chunk form). Now fp32 inputs under
    autocast give the fp32 run's outputs, state and gradients."""
    torch.manual_seed(0)
    attention = built_or_skipped(spec, form, chunk_size=2)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(1, 2, 6, 4, generator=generator) for _ in range(3))
    beta = 0.5 * torch.rand(1, 2, 6, generator=generator) if attention.uses_beta else None
    weights = torch.cos(torch.arange(48.0)).reshape(1, 2, 6, 4)

    def run(autocast: bool) -> list[torch.Tensor]:
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            y, state = attention(*inputs, beta)
            read = attention.read(inputs[0], attention.write(inputs[1], inputs[2], beta))
        ((y.float() + read.float()) * weights).sum().backward()
        return [y.detach().float(), state.W, read.detach().float(), *(x.grad for x in inputs)]

    for half, full in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(half, full)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["auto", "parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("spec", ["dpfp:nu=1", "dpfp:nu=3", "linear", "favor:m=8", "dpfp-delta", "linear-fwm"])
def test_a_backward_inside_cpu_autocast_gives_the_gradients_of_one_outside_it(spec, form, dtype):
    """The autograd engine runs a backward under the autocast state of the thread that calls it, so with
    ``loss.backward()`` inside the ``torch.autocast("cpu")`` block the backward matmuls of φ, the normaliser
    and every op outside a hand-written kernel ran in bf16/fp16, though the forward had turned autocast off:
    DPFP's query gradient came out 67 % off the backward-outside run's (chunk form; 33 % parallel, 9 %
    recurrent), linear's 4 %, FAVOR+'s 3 %, finite and without a warning. Now every call (forward with and
    without a carried state, write, read, write_read) gives the same gradients, inside or outside, to fp32
    rounding."""
    torch.manual_seed(0)
    attention = built_or_skipped(spec, form, chunk_size=4)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(1, 2, 16, 4, generator=generator) for _ in range(3))
    beta = torch.rand(1, 2, 16, generator=generator)

    def grads(inside: bool) -> list[torch.Tensor]:
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v, beta)]
        qq, kk, vv, bb = inputs
        bb = bb if attention.uses_beta else None
        with torch.autocast("cpu", dtype=dtype):
            _, state = attention(qq[:, :, :5], kk[:, :, :5], vv[:, :, :5], None if bb is None else bb[:, :, :5])
            y, _ = attention(qq, kk, vv, bb, state=state)
            read = attention.read(qq, attention.write(kk, vv, bb, state=state))
            answer = attention.write_read(kk, vv, qq[:, :, -3:], bb)
            loss = y.float().square().sum() + read.float().square().sum() + answer.float().square().sum()
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        return [x.grad for x in inputs if x.grad is not None]

    for inside, outside in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(inside, outside, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec", ["dpfp", "linear-delta", "favor:m=8"])
def test_model_parameters_get_the_same_gradients_from_a_backward_inside_cpu_autocast(spec):
    """The layer and model wrappers (AttentionLayer, the retrieval model, the LM) under bf16 autocast: the
    parameters' gradients from a backward inside the block are those from one outside it (DPFP's were up to
    tens of % apart through the fast-weight part of the graph)."""
    from fwbench.tasks.lm_model import DecoderConfig, DecoderLM
    from fwbench.tasks.retrieval import RetrievalModel
    from fwbench.variants import AttentionLayer

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 8, generator=generator)
    ids = torch.randint(0, 8, (2, 6), generator=generator)
    tokens = torch.randint(0, 11, (2, 8), generator=generator)
    config = DecoderConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=2, d_ff=16, context=8, form="chunk")
    cases = [(lambda: AttentionLayer(spec, 8, 2, form="chunk", chunk_size=4), lambda m: m(x)[0]),
             (lambda: RetrievalModel(spec, 8, d_key=8, form="chunk"), lambda m: m(ids, ids.flip(1), ids[:, :2])),
             (lambda: DecoderLM(spec, config), lambda m: m(tokens)[0] if isinstance(m(tokens), tuple) else m(tokens))]

    def grads(make, call, inside: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = make()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = call(model).float().square().sum()
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        return [p.grad for p in model.parameters() if p.grad is not None]

    for make, call in cases:
        for inside, outside in zip(grads(make, call, True), grads(make, call, False), strict=True):
            torch.testing.assert_close(inside, outside, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_softmax_takes_fp16_inputs_under_bf16_autocast(form):
    """fp16 q, k, v under ``torch.autocast("cpu", dtype=torch.bfloat16)``: CPU autocast's cat knows fp32,
    float64 and its own dtype only, so the recurrent form, and every form and write with a carried cache,
    raised torch's 'Unexpected floating ScalarType in at::autocast::prioritize'. Now they answer, as the
    fp32 run does to bf16 rounding."""
    attention = build_attention("softmax", 4, form=form)
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=generator).half() for _ in range(3))

    def calls(x: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        _, state = attention(x(q[:, :, :2]), x(k[:, :, :2]), x(v[:, :, :2]))
        y, _ = attention(x(q[:, :, 2:]), x(k[:, :, 2:]), x(v[:, :, 2:]), state=state)
        return [y.float(), attention.read(x(q), attention.write(x(k[:, :, 2:]), x(v[:, :, 2:]), state=state)).float()]

    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = calls(lambda x: x)
    for got, expected in zip(half, calls(lambda x: x.float()), strict=True):
        torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_the_softmax_retrieval_model_answers_under_cpu_autocast(form):
    """The retrieval model's keys add an fp32 table to a projection that autocast runs in bf16, so they
    come out fp32 beside bf16 queries: softmax attention, which takes one dtype, refused its own model's
    write-then-read ('q.dtype: got torch.bfloat16; expected the dtype of k (torch.float32)'). Now it
    answers, near the fp32 run."""
    from fwbench.tasks.retrieval import RetrievalModel

    torch.manual_seed(0)
    model, ids = RetrievalModel("softmax", 8, d_key=8, form=form), torch.randint(0, 8, (2, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = model(ids, ids.flip(1), ids[:, :2])
    torch.testing.assert_close(half, model(ids, ids.flip(1), ids[:, :2]), rtol=0.05, atol=0.02)


@pytest.mark.parametrize("spec", ["linear", "linear-fwm", "dpfp", "favor:m=8"])
def test_a_gradient_penalty_inside_cpu_autocast_gives_the_gradients_of_one_without_it(spec):
    """``g = grad(loss, q, create_graph=True); (loss + 0.1 ‖g‖²).backward()`` inside the bf16 block: the
    create_graph backward recomputed φ and the kernel with autocast off, but the second-order graph it built
    ran its own backward under the caller's autocast, so second derivatives were bf16 (linear-fwm's key
    gradient 110 % off the run without autocast, DPFP's 11 %). Now every order runs with autocast off, and
    the gradients are those without autocast to fp32 rounding."""
    torch.manual_seed(0)
    attention = build_attention(spec, 4)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(1, 2, 16, 4, generator=generator) for _ in range(3))
    beta = torch.rand(1, 2, 16, generator=generator) if attention.uses_beta else None

    def grads(enabled: bool) -> list[torch.Tensor]:
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            y, _ = attention(*inputs, beta)
            loss = y.float().square().sum()
            g, = torch.autograd.grad(loss, inputs[0], create_graph=True)
            (loss + 0.1 * g.square().sum()).backward()
        return [x.grad for x in inputs]

    for inside, without in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(inside, without, rtol=1e-3, atol=1e-5)


def test_a_subclass_parameter_read_in_phi_gets_its_gradient_under_cpu_autocast():
    """A FastWeightAttention subclass whose :meth:`phi` reads a parameter of its own (a temperature), not one
    of the feature map's: under bf16 autocast the node that runs φ and the kernel was given the feature
    map's parameters only, so the temperature's gradient was ``None`` (0.147 without autocast). Now every
    parameter of the module gets the gradient it gets without autocast."""
    from torch import nn

    from fwbench.variants import EluPlusOne, FastWeightAttention

    class Tempered(FastWeightAttention):
        def __init__(self):
            super().__init__(EluPlusOne(4), "sum", form="chunk")
            self.temperature = nn.Parameter(torch.tensor(0.8))

        def phi(self, x, query=False):
            return super().phi(x * self.temperature, query)

    generator = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(1, 2, 8, 4, generator=generator) for _ in range(3))

    def grad(enabled: bool) -> torch.Tensor | None:
        attention = Tempered()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            y, _ = attention(q, k, v)
            y.float().square().sum().backward()
        return attention.temperature.grad

    inside = grad(True)
    assert inside is not None
    torch.testing.assert_close(inside, grad(False), rtol=1e-4, atol=1e-6)


def test_a_stochastic_phi_is_differentiated_on_its_forwards_sample_under_cpu_autocast():
    """A φ with dropout under bf16 autocast: a second backward through a retained graph rebuilt φ and the
    kernel, and a create_graph=True backward ran them again, each drawing a new dropout mask, so their
    gradients belonged to another sample than the outputs (about 100 % off the first backward's). Now
    the node keeps φ's graph for both, so they differentiate the forward's sample: both equal the first backward's."""
    from fwbench.variants import FastWeightAttention, FeatureMap

    class Dropped(FeatureMap):
        name = "dropped"

        @property
        def d_dot(self) -> int:
            return self.d_key

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(F.elu(x) + 1, 0.5, training=True)

    torch.manual_seed(0)
    attention = FastWeightAttention(Dropped(4), "sum", form="chunk")
    q, k, v = (torch.randn(1, 2, 16, 4).requires_grad_() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = attention(q, k, v)
        loss = y.float().square().sum()
        first, = torch.autograd.grad(loss, q, retain_graph=True)
        second, = torch.autograd.grad(loss, q, retain_graph=True)
        created, = torch.autograd.grad(loss, q, create_graph=True)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(created.detach(), first, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("thread", ["this thread", "another thread"])
def test_a_phi_weight_cached_by_parametrize_for_two_calls_gets_its_gradient_under_cpu_autocast(thread):
    """A learnable φ whose weight is a ``torch.nn.utils.parametrize`` parametrization, computed once inside
    ``parametrize.cached()`` and read by two attention calls: under bf16 autocast the first call's backward
    freed the shared weight's graph and the second raised 'Trying to backward through the graph a second
    time'. Now the gradients are those without autocast. Break-it pass AE: 93e0b4d told a graph made outside φ by
    autograd's sequence numbers, which count per thread, so a weight cached on this thread and read by calls on
    another was freed again (the same error); the node now keeps φ's graph through every first-order backward."""
    import threading

    from torch import nn
    from torch.nn.utils import parametrize

    from fwbench.variants import FastWeightAttention, FeatureMap

    class Symmetric(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x + x.T) / 2

    class Learned(FeatureMap):
        name = "learned"

        def __init__(self, d_key: int):
            super().__init__(d_key)
            self.linear = nn.Linear(d_key, d_key)
            parametrize.register_parametrization(self.linear, "weight", Symmetric())

        @property
        def d_dot(self) -> int:
            return self.d_key

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.elu(self.linear(x)) + 1

    generator = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(1, 2, 8, 4, generator=generator) for _ in range(3))

    def grads(enabled: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        attention = FastWeightAttention(Learned(4), "sum", form="chunk")
        for _ in range(2000):  # this thread's autograd sequence numbers move on, as after any earlier work
            torch.ones(1, requires_grad=True) * 1.0
        failed = []

        def step() -> None:
            try:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                    y, _ = attention(q, k, v)
                    (y.float().square().sum() + attention.write_read(k, v, q).float().square().sum()).backward()
            except RuntimeError as error:
                failed.append(error)

        with parametrize.cached():
            _ = attention.feature_map.linear.weight  # cached here, on this thread
            if thread == "this thread":
                step()
            else:
                worker = threading.Thread(target=step)
                worker.start()
                worker.join()
        assert not failed, failed
        return [p.grad for p in attention.parameters()]

    for inside, without in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(inside, without, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("spec", "form", "changed"),
                         [("linear", "chunk", "q"), ("linear-delta", "recurrent", "v"), ("favor:m=8", "recurrent", "W")])
def test_an_input_changed_in_place_that_no_op_saved_is_taken_by_a_backward_inside_cpu_autocast(spec, form, changed):
    """An input changed in place (under no_grad) between the forward and the backward: plain autograd takes
    it where no op saved that input, and the node that runs φ and the kernel under autocast read every saved
    input in its backward, so torch raised 'one of the variables needed for gradient computation has been
    modified by an inplace operation' (18 of 65 spec/form/input cases). Now the first backward reads only the
    graph it kept, whose ops refuse what they saved as plain autograd does, and gives the same gradients."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(1, 2, 8, 4, generator=generator) for _ in range(3))
    beta = torch.rand(1, 2, 8, generator=generator)
    attention = build_attention(spec, 4, form=form, chunk_size=4)
    beta = beta if attention.uses_beta else None

    def grads(enabled: bool) -> list[torch.Tensor]:
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        _, state = attention(q, k, v, beta)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            y, _ = attention(*inputs, beta, state=state)
            with torch.no_grad():
                {"q": inputs[0], "v": inputs[2], "W": state.W}[changed].mul_(1.0)
            y.float().square().sum().backward()
        return [x.grad for x in inputs]

    for inside, without in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(inside, without, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec, form", [("linear", "chunk"), ("linear", "recurrent"), ("favor:m=8", "parallel")])
def test_torch_func_grad_answers_inside_cpu_autocast_for_the_variants_of_plain_ops(spec, form):
    """Break-it pass X: 9cc37cb's autograd node (run_in_fp32) has no setup_context, so torch.func.grad inside a
    bf16 autocast block raised torch's many-line 'In order to use an autograd.Function with functorch transforms'
    for linear and FAVOR+, which answered at 578b132. A transform takes the plain path again: its gradient is the
    one a backward inside the block computed before 9cc37cb, bf16-near the fp32 run's."""
    attention = build_attention(spec, 4, form=form)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (0.5 * torch.randn(1, 2, 6, 4, generator=generator) for _ in range(3))

    def loss(q):
        return attention(q, k, v)[0].float().square().sum()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        transformed = torch.func.grad(loss)(q)
    wanted = torch.func.grad(loss)(q)  # fp32
    assert transformed.dtype == torch.float32
    torch.testing.assert_close(transformed, wanted, rtol=0.05, atol=0.02)


class _BatchNormPhi(FeatureMap):
    """elu + 1 after BatchNorm over d_key: running statistics moved by every forward in training mode."""

    name = "batchnorm-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.norm = torch.nn.BatchNorm1d(d_key)

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(self.norm(x.reshape(-1, x.shape[-1])).reshape(x.shape)) + 1


class _SpectralNormPhi(FeatureMap):
    """elu + 1 after a spectral-normalised linear map: its power-iteration vectors move in every forward."""

    name = "spectral-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.linear = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(d_key, d_key))

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(self.linear(x)) + 1


class _LazyBatchNormPhi(_BatchNormPhi):
    """elu + 1 after a LazyBatchNorm1d: its parameters and buffers get their shapes in φ's first forward."""

    name = "lazy-batchnorm-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.norm = torch.nn.LazyBatchNorm1d()


class _RegisteringPhi(FeatureMap):
    """elu + 1 of x over a running scale that the first forward registers as a buffer and every forward moves;
    unlike BatchNorm's in training mode, the scale is read by the output."""

    name = "running-scale-elu"

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        mean = x.detach().abs().flatten(0, -2).mean(0)
        if not hasattr(self, "scale"):
            self.register_buffer("scale", mean.clone())
        y = F.elu(x / (self.scale + 0.5)) + 1
        self.scale.mul_(0.5).add_(0.5 * mean)
        return y


class _WarmStartPhi(FeatureMap):
    """elu + 1 of x times a per-feature warm-start scale, a buffer that the first call reads and deletes (the
    query's φ reads it, the key's does not)."""

    name = "warm-start-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.register_buffer("warm", torch.linspace(1.0, 2.0, d_key))

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        if "warm" not in self._buffers:
            return F.elu(x) + 1
        y = F.elu(x * self.warm) + 1
        del self._buffers["warm"]
        return y


class _MadeSubmodulePhi(FeatureMap):
    """elu + 1 of x over a running scale held by a submodule that the first forward makes, and that the output
    reads."""

    name = "made-submodule-elu"

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        mean = x.detach().abs().flatten(0, -2).mean(0)
        if not hasattr(self, "tracker"):
            self.tracker = torch.nn.Module()
            self.tracker.register_buffer("scale", mean.clone())
        y = F.elu(x / (self.tracker.scale + 0.5)) + 1
        self.tracker.scale.mul_(0.5).add_(0.5 * mean)
        return y


class _SharedStatisticsPhi(FeatureMap):
    """elu + 1 after two BatchNorms over d_key that share one pair of running-statistics tensors: the first (in
    training mode) moves them, the second (in eval mode) reads them."""

    name = "shared-statistics-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.moving, self.reading = torch.nn.BatchNorm1d(d_key, affine=False), torch.nn.BatchNorm1d(d_key)
        self.reading.running_mean, self.reading.running_var = self.moving.running_mean, self.moving.running_var

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        self.moving(flat.detach())
        self.reading.eval()
        return F.elu(self.reading(flat).reshape(x.shape)) + 1


class _CountingPhi(FeatureMap):
    """elu + 1 of x times a scale that grows with a Python counter of φ's calls."""

    name = "counting-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.calls = 0

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        self.calls += 1
        return F.elu(x * (1 + 0.25 * self.calls)) + 1


class _DecayingPhi(FeatureMap):
    """elu + 1 of x times a learnable scale that φ decays in place (under no_grad) before reading it."""

    name = "decaying-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        with torch.no_grad():
            self.scale.mul_(0.8)
        return F.elu(x * self.scale.clone()) + 1  # a copy: the key's call decays the scale the query's read


class _ViewBuffersPhi(FeatureMap):
    """elu + 1 of x shifted by a running mean, a buffer that is a view of a statistics buffer whose other row
    counts the calls; both moved in place and read by the output."""

    name = "view-buffers-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.register_buffer("stats", torch.zeros(2, d_key))
        self.register_buffer("mean", self.stats[0])

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        self.mean.mul_(0.5).add_(0.5 * x.detach().flatten(0, -2).mean(0))
        self.stats[1].add_(1)
        stats = self.stats.clone()  # as read now: the key's call moves them after the query's
        return F.elu(x * stats[1] - stats[0]) + 1


class _OwnGeneratorPhi(FeatureMap):
    """elu + 1 of x under dropout (keep 0.7) drawn from a torch.Generator of φ's own."""

    name = "own-generator-dropout-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.generator = torch.Generator().manual_seed(3)

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        keep = torch.rand(x.shape, generator=self.generator) < 0.7
        return (F.elu(x) + 1) * keep / 0.7


def _phi_state(attention: torch.nn.Module) -> dict[str, object]:
    """Everything a feature map's forward may move: buffers, parameters, Python numbers, generator states."""
    state: dict[str, object] = {name: t.detach().clone() for name, t in attention.state_dict(keep_vars=True).items()}
    for name, value in vars(attention.feature_map).items():
        if isinstance(value, int | float):
            state[name] = value
        elif isinstance(value, torch.Generator):
            state[name] = value.get_state()
    return state


@pytest.mark.parametrize("backward", ["retained graph", "gradient penalty"])
@pytest.mark.parametrize("phi", [_BatchNormPhi, _SpectralNormPhi, _LazyBatchNormPhi, _RegisteringPhi, _WarmStartPhi,
                                 _MadeSubmodulePhi, _SharedStatisticsPhi, _CountingPhi, _DecayingPhi, _ViewBuffersPhi,
                                 _OwnGeneratorPhi],
                         ids=["batchnorm", "spectral_norm", "lazy_batchnorm", "registered_in_forward",
                              "deleted_in_forward", "submodule_made_in_forward", "shared_statistics",
                              "python_counter", "parameter_decayed_in_place", "buffer_views", "own_generator"])
def test_a_phi_that_moves_its_buffers_moves_them_once_a_forward_under_cpu_autocast(phi, backward):
    """Break-it pass X: run_in_fp32 ran phi again for a second backward through a retained graph and for a
    create_graph backward, and a phi whose forward moves module state moved it again each time: BatchNorm's
    num_batches_tracked 4 / 6 after one step against 2 without autocast (running statistics 0.115 / 0.209 off),
    spectral_norm's vectors 2.8e-2 / 4.6e-2 off and its gradients 0.46 % / 4 % off (another weight recomputed).
    Each recomputation then read copies of the buffers as the forward found them.

    Break-it pass Z: a buffer registered by φ's first forward was not in the list taken before it, and moved in
    every recomputation (scale 0.024 / 0.030 off, the query's gradient 3.5 % / 11 % off). A LazyBatchNorm1d never
    worked: its uninitialised buffers were read (torch's 'Attempted to use an uninitialized parameter'), and
    before that its parameters' gradients had shape [0] (NativeBatchNormBackward0's 'invalid gradient'). A buffer
    that φ deleted was missing in every recomputation (the query's gradient 19 % / 44 % off).
    Break-it pass AA: a buffer of a submodule made by φ's first forward was replayed from its moved value (3.5 % /
    7.6 % off), and buffers sharing a tensor got a copy each (5.8 % / 13 % off).
    Break-it pass AB: a Python counter, a parameter decayed in place, buffers that are views of one tensor and a
    generator of φ's own still moved or drew again in each recomputation (2-40 % off). Since then run_in_fp32 keeps
    φ's graph for every backward and never runs φ again: every kind of state moves once, as without autocast."""

    def step(autocast: bool):
        torch.manual_seed(0)
        attention = FastWeightAttention(phi(4), rule="sum", form="chunk").train()
        generator = torch.Generator().manual_seed(1)
        q, k, v = ((0.5 * torch.randn(2, 2, 8, 4, generator=generator)).requires_grad_() for _ in range(3))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = attention(q, k, v)[0].float().square().sum()
            params = list(attention.parameters())
            if backward == "retained graph":
                loss.backward(retain_graph=True)
                loss.backward()
            else:
                grads = torch.autograd.grad(loss, [q, *params], create_graph=True)
                (loss + sum(g.square().sum() for g in grads)).backward()
        return _phi_state(attention), [q.grad, *(p.grad for p in params)]

    (plain_state, plain_grads), (state, grads) = step(False), step(True)
    assert plain_state.keys() == state.keys()
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, plain_state[name], rtol=0, atol=0, msg=name)
        else:
            assert value == plain_state[name], name
    for grad, plain in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(grad, plain, rtol=1e-5, atol=1e-6)


class _SpareLazyPhi(FeatureMap):
    """elu + 1 of x times a learnable scale, beside a LazyBatchNorm1d that the forward never calls."""

    name = "spare-lazy-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.spare = torch.nn.LazyBatchNorm1d()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(x * self.scale) + 1


class _LinearPhi(FeatureMap):
    """elu + 1 after a learnable linear map over d_key."""

    name = "linear-map-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.linear = torch.nn.Linear(d_key, d_key)

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(self.linear(x)) + 1


@pytest.mark.parametrize("backward", ["retained graph", "gradient penalty"])
def test_functional_call_parameters_get_their_gradients_under_cpu_autocast(backward):
    """Break-it pass AA: torch.func.functional_call (MAML's adapted weights) puts the module's own parameters back
    before the backward, and run_in_fp32's recomputation read those: the passed weights' gradients were half of
    plain autograd's after a second backward through a retained graph, and a create_graph backward raised torch's
    'appears to not have been used in the graph'. The node now keeps φ's graph, built on the parameters in place
    at the forward, for every backward."""

    def grads(autocast: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        attention = FastWeightAttention(_LinearPhi(4), rule="sum", form="chunk")
        generator = torch.Generator().manual_seed(1)
        q, k, v = (0.5 * torch.randn(2, 2, 8, 4, generator=generator) for _ in range(3))
        adapted = {name: (1.1 * p.detach()).requires_grad_() for name, p in attention.named_parameters()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.func.functional_call(attention, adapted, (q, k, v))[0].float().square().sum()
            if backward == "retained graph":
                loss.backward(retain_graph=True)
                loss.backward()
            else:
                inner = torch.autograd.grad(loss, list(adapted.values()), create_graph=True)
                sum(g.square().sum() for g in inner).backward()
        assert all(p.grad is None for p in attention.parameters())
        return [p.grad for p in adapted.values()]

    for got, wanted in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(got, wanted, rtol=1e-5, atol=1e-6)


def test_a_training_flag_changed_between_two_backwards_is_the_forwards_in_the_recomputation():
    """Break-it pass AA: ``.eval()`` called between a first and a second backward through a retained graph made the
    recomputation of a BatchNorm φ use its running statistics instead of the batch's (gradients 33 % off plain
    autograd's, which never runs φ again); the node now keeps φ's graph from the forward, and the caller's mode is
    kept."""

    def grads(autocast: bool) -> torch.Tensor:
        torch.manual_seed(0)
        attention = FastWeightAttention(_BatchNormPhi(4), rule="sum", form="chunk").train()
        q = (0.5 * torch.randn(2, 2, 8, 4, generator=torch.Generator().manual_seed(1))).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = attention(q, q, q)[0].float().square().sum()
            loss.backward(retain_graph=True)
            attention.eval()
            loss.backward()
        assert not attention.feature_map.norm.training
        return q.grad

    torch.testing.assert_close(grads(True), grads(False), rtol=1e-5, atol=1e-6)


class _AdoptingPhi(FeatureMap):
    """elu + 1 of x over the running variance of a BatchNorm made outside, which φ attaches on its first call."""

    name = "adopting-elu"

    def __init__(self, d_key: int, shared: torch.nn.Module):
        super().__init__(d_key)
        object.__setattr__(self, "shared", shared)  # not a submodule until the first forward

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        if "norm" not in self._modules:
            self.norm = self.shared
        self.norm(x.detach().reshape(-1, x.shape[-1]))
        return F.elu(x / (self.norm.running_var + 0.5)) + 1


@pytest.mark.parametrize("backward", ["retained graph", "gradient penalty"])
def test_a_module_that_phi_attaches_is_left_as_the_forward_left_it(backward):
    """Break-it pass AB: a module that existed before and that φ attaches in its first forward was taken out of the
    tree for each recomputation, which attached the same object again and moved its live statistics
    (num_batches_tracked 4 / 6 against 2, running variance 0.115 / 0.209 off); replayed from their values after the
    forward, its values before the forward were not known (it was not in the tree), so the recomputation's
    gradients were not plain autograd's (2-40 % off). φ now runs once a forward: buffers and gradients are plain
    autograd's."""

    def step(autocast: bool) -> tuple[torch.nn.Module, torch.Tensor]:
        torch.manual_seed(0)
        shared = torch.nn.BatchNorm1d(4, affine=False)
        attention = FastWeightAttention(_AdoptingPhi(4, shared), rule="sum", form="chunk")
        q = (0.5 * torch.randn(2, 2, 8, 4, generator=torch.Generator().manual_seed(1))).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = attention(q, q, q)[0].float().square().sum()
            if backward == "retained graph":
                loss.backward(retain_graph=True)
                loss.backward()
            else:
                (first,) = torch.autograd.grad(loss, [q], create_graph=True)
                (loss + first.square().sum()).backward()
        return shared, q.grad

    (plain, plain_grad), (autocast, grad) = step(False), step(True)
    for name, buffer in autocast.named_buffers():
        torch.testing.assert_close(buffer, plain.get_buffer(name), rtol=0, atol=0, msg=name)
    torch.testing.assert_close(grad, plain_grad, rtol=1e-5, atol=1e-6)


class _OffsetPhi(FeatureMap):
    """elu + 1 of x minus an offset held as a buffer."""

    name = "offset-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.register_buffer("offset", torch.linspace(-0.5, 0.5, d_key))

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(x - self.offset) + 1


@pytest.mark.parametrize("backward", ["retained graph", "gradient penalty"])
def test_a_buffer_that_functional_call_passes_with_a_gradient_gets_it_under_cpu_autocast(backward):
    """Break-it pass AB: a buffer that requires a gradient (``functional_call`` passing one) was no input of the
    autocast node, so it got no gradient (``None``) where plain autograd gives one. The module's buffers that
    require a gradient are now inputs of the node too."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_OffsetPhi(4), rule="sum", form="chunk")
        q = 0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))
        offset = torch.linspace(-0.2, 0.3, 4).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.func.functional_call(attention, {"feature_map.offset": offset}, (q, q, q))[0].square().sum()
            if backward == "retained graph":
                loss.backward(retain_graph=True)
                loss.backward()
            else:
                (first,) = torch.autograd.grad(loss, [offset], create_graph=True)
                (loss + first.square().sum()).backward()
        return offset.grad

    plain = grad(False)
    assert plain is not None and plain.abs().sum() > 0
    torch.testing.assert_close(grad(True), plain, rtol=1e-5, atol=1e-6)


class _MadeLinearPhi(FeatureMap):
    """elu + 1 after a linear map that the first forward makes (so its parameters are no node input)."""

    name = "made-linear-elu"

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        if "linear" not in self._modules:
            self.linear = torch.nn.Linear(x.shape[-1], x.shape[-1])
        return F.elu(self.linear(x)) + 1


def test_parameters_of_a_module_that_phi_makes_are_named_in_a_warning_under_cpu_autocast():
    """Break-it pass AC: the parameters of a module that φ makes (or attaches) in its forward are not among the
    autocast node's inputs, so that call gave them no gradient where plain autograd gives one, without a word
    (accumulated gradients then 37-140 % off). The call warns, naming them; a later call, the module made, is
    covered, and its gradients are plain autograd's."""
    attention = FastWeightAttention(_MadeLinearPhi(4), rule="sum", form="chunk")
    q = 0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(UserWarning) as caught:
        attention(q.requires_grad_(), q, q)[0].float().sum().backward()
    assert [str(w.message) for w in caught] == [
        "fwbench: under autocast, the parameters feature_map.linear.weight, feature_map.linear.bias, of a module that "
        "the feature map's forward made or attached, get no gradient from this call (plain autograd gives them one): "
        "make the module in the feature map's __init__"]
    assert attention.feature_map.linear.weight.grad is None

    def grads(autocast: bool) -> list[torch.Tensor]:
        attention.zero_grad(set_to_none=True)
        with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            warnings.simplefilter("error")  # the module made: no warning
            attention(q, q, q)[0].float().square().sum().backward()
        return [p.grad for p in attention.parameters()]

    for got, wanted in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(got, wanted, rtol=1e-5, atol=1e-6)


def test_a_lazy_module_that_phi_leaves_uninitialised_is_no_input_of_the_autocast_node():
    """A lazy module that φ holds but does not call keeps parameters without values: passed to the node, they
    made torch.autograd.grad raise 'Attempted to use an uninitialized parameter' in the backward (and before that
    the forward, reading its buffers). The gradients are plain autograd's, and the module stays uninitialised."""

    def grads(autocast: bool) -> list[torch.Tensor]:
        attention = FastWeightAttention(_SpareLazyPhi(4), rule="sum", form="chunk")
        generator = torch.Generator().manual_seed(1)
        q = (0.5 * torch.randn(1, 2, 8, 4, generator=generator)).requires_grad_()
        scale = attention.feature_map.scale
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = attention(q, q, q)[0].float().square().sum()
            first = torch.autograd.grad(loss, [q, scale], create_graph=True)
            (loss + sum(g.square().sum() for g in first)).backward()
        assert torch.nn.parameter.is_lazy(attention.feature_map.spare.weight)
        return [q.grad, scale.grad]

    for got, wanted in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(got, wanted, rtol=1e-5, atol=1e-6)


def test_autocast_on_reads_an_mps_block_as_on():
    """Break-it pass Z: 75be048's fast path asked torch._C._is_any_autocast_enabled first, which in torch 2.13 leaves
    out MPS: inside torch.autocast("mps") autocast_on said off, and fast weights would run in fp16 on Apple GPUs.
    The fast path is taken for CPU and CUDA only (a stand-in tensor: no Apple GPU here)."""
    from types import SimpleNamespace

    from fwbench.variants.kernels.precision import autocast_on

    stand_in = SimpleNamespace(device=SimpleNamespace(type="mps"))
    was = torch.is_autocast_enabled("mps")
    torch.set_autocast_enabled("mps", True)
    try:
        assert autocast_on(stand_in) is True
    finally:
        torch.set_autocast_enabled("mps", was)
    assert autocast_on(stand_in) is was
    assert autocast_on(torch.ones(1)) is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_on(torch.ones(1)) is True


def _autocast_nodes(output: torch.Tensor) -> list:
    """The autocast nodes (run_in_fp32's) in the graph behind ``output``."""
    found, seen, stack = [], set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if "AutocastOff" in type(node).__name__:
            found.append(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def test_the_autocast_node_keeps_phis_graph_while_the_backward_keeps_its_own_and_lets_it_go_with_it():
    """The node keeps φ's graph for a second backward (retain_graph=True) instead of running φ again, and lets it go
    in a backward that frees the graph, as autograd frees its saved tensors: a third backward then raises torch's
    own 'backward through the graph a second time', as without autocast."""
    attention = FastWeightAttention(_CountingPhi(4), rule="sum", form="chunk")
    q = (0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = attention(q, q, q)[0].square().sum()
    (node,) = _autocast_nodes(loss)
    loss.backward(retain_graph=True)
    assert node.graph is not None and attention.feature_map.calls == 2  # the query's and the key's φ, once each
    first = q.grad.clone()
    loss.backward()
    assert node.graph is None and attention.feature_map.calls == 2
    torch.testing.assert_close(q.grad, 2 * first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


class _AliasedScalePhi(FeatureMap):
    """elu + 1 of x times a learnable scale that the map also holds as a buffer (one tensor, two slots)."""

    name = "aliased-scale-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.register_buffer("scale_ref", self.scale)

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(x * self.scale) + 1


def test_a_tensor_held_as_a_parameter_and_a_buffer_gets_its_gradient_once_under_cpu_autocast():
    """Break-it pass AD (new in 91f7092): the module's buffers that require a gradient were added to the node's
    inputs beside its parameters without dropping repeats, so a parameter also registered as a buffer got its
    gradient twice (2.0 times plain autograd's); each tensor is one input now."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_AliasedScalePhi(4), rule="sum", form="chunk")
        q = 0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            attention(q, q, q)[0].square().sum().backward()
        return attention.feature_map.scale.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("spec", ["linear", "dpfp:nu=1", "linear-delta"])
def test_an_output_that_needs_no_gradient_requires_none_under_cpu_autocast(spec, form):
    """Break-it pass AD: every output of the autocast node required a gradient, so with only the queries learnable
    the state W did too (it does not without autocast), and a loop carrying the state without detaching it raised
    'Trying to backward through the graph a second time' at its second step. The node marks the outputs that fn
    made from nothing that requires a gradient as not differentiable."""
    attention = build_attention(spec, 4, form=form)
    state, requires = None, []
    for step in range(2):
        generator = torch.Generator().manual_seed(step)
        q = torch.randn(1, 2, 8, 4, generator=generator).requires_grad_()
        k, v = torch.randn(1, 2, 8, 4, generator=generator), torch.randn(1, 2, 8, 4, generator=generator)
        beta = torch.rand(1, 2, 8, generator=generator) if attention.uses_beta else None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, state = attention(q, k, v, beta, state=state)
            y.float().sum().backward()
        requires.append(state.W.requires_grad)
    assert requires == [False, False]


@pytest.mark.parametrize("spec", ["linear", "dpfp:nu=1", "linear-delta"])
def test_keys_and_values_made_under_inference_mode_are_taken_beside_learnable_queries_under_cpu_autocast(spec):
    """Break-it pass AD: keys and values made under ``torch.inference_mode()`` with learnable queries were refused
    under autocast ('Inference tensors cannot be saved for backward': the node saved every input) where plain
    autograd takes them (recurrent form); the node saves only the inputs that require a gradient."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = build_attention(spec, 4, form="recurrent")
        generator = torch.Generator().manual_seed(1)
        q = torch.randn(1, 2, 8, 4, generator=generator).requires_grad_()
        with torch.inference_mode():
            k, v = torch.randn(1, 2, 8, 4, generator=generator), torch.randn(1, 2, 8, 4, generator=generator)
            beta = torch.rand(1, 2, 8, generator=generator) if attention.uses_beta else None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            attention(q, k, v, beta)[0].float().square().sum().backward()
        return q.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


class _ViewBufferPhi(FeatureMap):
    """elu + 1 of x times a learnable scale read through a buffer that is a view of it."""

    name = "view-buffer-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.register_buffer("scale_view", self.scale.view(-1))

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(x * self.scale_view) + 1


class _TwoScalesPhi(FeatureMap):
    """elu + 1 of x times two learnable scales."""

    name = "two-scales-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.a = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.b = torch.nn.Parameter(torch.linspace(1.0, 0.2, d_key))

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(x * self.a * self.b) + 1


def test_a_buffer_that_views_a_parameter_passes_its_gradient_once_under_cpu_autocast():
    """Break-it pass AE (new in 91f7092): a buffer that requires a gradient because it is a view of a parameter was
    a node input too, so the view's path was counted by the node and again by the caller's backward (the
    parameter's gradient 2.0 times plain autograd's). Only buffers that are leaves are node inputs."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_ViewBufferPhi(4), rule="sum", form="chunk")
        q = 0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            attention(q, q, q)[0].square().sum().backward()
        return attention.feature_map.scale.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("made", ["flip", "times two", "exp"])
def test_functional_call_tensors_made_from_one_another_get_plain_gradients_under_cpu_autocast(made):
    """Break-it pass AE (older than 91f7092): functional_call passing a = base and b made from base: the node's
    backward differentiated through b's history to a, and the caller's backward went through it again, so base's
    gradient was up to 1.62 times plain autograd's (flip); 93e0b4d freed that history in the node and the caller's
    backward raised 'Trying to backward through the graph a second time' (times two, exp). φ now reads a made
    parameter as a leaf of its own, whose history only the caller's backward goes through."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_TwoScalesPhi(4), rule="sum", form="chunk")
        q = 0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))
        base = torch.linspace(0.5, 1.5, 4).requires_grad_()
        b = {"flip": base.flip(0), "times two": base * 2, "exp": base.exp()}[made]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = torch.func.functional_call(attention, {"feature_map.a": base, "feature_map.b": b}, (q, q, q))[0]
            y.float().square().sum().backward()
        assert attention.feature_map.b is not b  # the module's own parameter is back
        return base.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("retain", [None, True])
def test_maml_adapting_some_parameters_gets_plain_gradients_under_cpu_autocast(retain):
    """Break-it pass AE (older than 91f7092): MAML adapting φ's weight only (w - 0.1 g, g from a create_graph
    backward) and keeping its bias: the bias gradient was 1.0 % (5.3 % with retain_graph=True) off plain autograd's,
    and 93e0b4d raised 'Trying to backward through the graph a second time'. Now both equal plain autograd's."""

    def grads(autocast: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        attention = FastWeightAttention(_LinearPhi(4), rule="sum", form="chunk")
        generator = torch.Generator().manual_seed(1)
        q, k, v = (0.5 * torch.randn(1, 2, 8, 4, generator=generator) for _ in range(3))
        weight = attention.feature_map.linear.weight
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            (g,) = torch.autograd.grad(attention(q, k, v)[0].float().square().sum(), [weight], create_graph=True,
                                       retain_graph=retain)
            adapted = {"feature_map.linear.weight": weight - 0.1 * g}
            torch.func.functional_call(attention, adapted, (k, q, v))[0].float().square().sum().backward()
        return [p.grad for p in attention.parameters()]

    for got, wanted in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(got, wanted, rtol=1e-5, atol=1e-6)


class _TiedBufferPhi(FeatureMap):
    """elu + 1 of x times a learnable scale and a buffer that holds the same tensor."""

    name = "tied-buffer-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.a = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.register_buffer("s", self.a)

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        return F.elu(x * self.a * self.s) + 1


def test_a_buffer_that_functional_call_ties_to_a_made_parameter_passes_its_gradient_under_cpu_autocast():
    """Break-it pass AF: functional_call (tie_weights=True) fills a buffer that holds a parameter with the made
    tensor passed for the parameter; 9927ced cut the parameter slot only, so the buffer's path was lost (base's
    gradient 0.5 of plain autograd's). The buffer slot is cut with the parameter's leaf too. (A buffer passed as a
    made tensor of its own gets no gradient: documented in run_in_fp32.)"""

    def grad(autocast: bool) -> torch.Tensor | None:
        attention = FastWeightAttention(_TiedBufferPhi(4), rule="sum", form="chunk")
        q = 0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))
        base = torch.linspace(0.5, 1.5, 4).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = torch.func.functional_call(attention, {"feature_map.a": base * 1}, (q, q, q))[0]
            y.float().square().sum().backward()
        assert attention.feature_map.s is attention.feature_map.a  # the module's own tensors are back
        return base.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


class _SlowViewBufferPhi(_ViewBufferPhi):
    """_ViewBufferPhi that sleeps after reading its buffer, so that another thread's call overlaps it."""

    name = "slow-view-buffer-elu"

    def forward(self, x):
        scale = self.scale_view
        time.sleep(0.05)
        return F.elu(x * scale) + 1


def test_two_threads_calling_one_module_with_a_buffer_that_views_a_parameter_both_get_gradients_under_autocast():
    """Break-it pass AG (new in fdbb213): every buffer that required a gradient was cut, so during one thread's φ
    the module's buffer slot held that thread's detached leaf, and a second thread calling the module meanwhile
    took it as its own input: its parameter's gradient came back None (10 of 20 threads at T=4096). A module's own
    slots are never swapped now; both threads get plain autograd's gradients."""
    import threading

    attention = FastWeightAttention(_SlowViewBufferPhi(4), rule="sum", form="chunk")
    scale = attention.feature_map.scale
    inputs = [0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]

    def grad(q: torch.Tensor, autocast: bool) -> torch.Tensor | None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = attention(q, q, q)[0].float().square().sum()
        return torch.autograd.grad(loss, scale, allow_unused=True)[0]

    plain = [grad(q, False) for q in inputs]
    got: dict[int, torch.Tensor | None] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, grad(inputs[i], True))) for i in range(2)]
    for thread in threads:
        thread.start()
        time.sleep(0.01)  # the second call starts while the first one's φ sleeps
    for thread in threads:
        thread.join()
    for i in range(2):
        assert got[i] is not None, f"thread {i} got no gradient"
        torch.testing.assert_close(got[i], plain[i], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("made", ["from a tensor outside", "from the queries", "FAVOR+'s omega"])
def test_a_buffer_made_by_a_graph_passes_its_gradient_under_cpu_autocast(made):
    """Break-it passes AF and AG (older than this session): a buffer that functional_call fills with a made tensor
    was no input of the autocast node, so its path was lost: base's gradient None, the queries' 80 % off plain
    autograd's with a buffer made from them, FAVOR+'s random features passed made 0.5 of plain. A made buffer whose
    history does not reach the node's parameters is an input now (none is swapped out of its slot, so two threads
    calling one module see no swap; a buffer viewing a parameter is reached through the parameter instead)."""

    def grads(autocast: bool) -> list[torch.Tensor | None]:
        torch.manual_seed(0)  # FAVOR+ draws its features
        generator = torch.Generator().manual_seed(1)
        q = (0.5 * torch.randn(1, 2, 8, 4, generator=generator)).requires_grad_()
        base = torch.linspace(0.5, 1.5, 4).requires_grad_()
        if made == "FAVOR+'s omega":
            attention = build_attention("favor:m=8", 4, form="chunk")
            given = {"feature_map.omega": attention.feature_map.omega * base[:, None]}
        else:
            attention = FastWeightAttention(_OffsetPhi(4), rule="sum", form="chunk")
            given = {"feature_map.offset": base * 2 if made == "from a tensor outside" else q.mean((0, 1, 2)).exp()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            torch.func.functional_call(attention, given, (q, q, q))[0].float().square().sum().backward()
        return [q.grad, base.grad]

    for got, wanted in zip(grads(True), grads(False), strict=True):
        if wanted is None:
            assert got is None
        else:
            torch.testing.assert_close(got, wanted, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["parallel", "chunkwise", "recurrent"])
def test_softmax_with_the_largest_window_is_softmax_without_a_warning(form):
    """Break-it pass AQ: `softmax:window=9223372036854775807` printed torch's 'Truncating the start/stop/step of
    slice' UserWarning (a slice from -window). A window no call reaches is plain softmax, cache included."""
    from fwbench.variants import AttentionLayer

    torch.manual_seed(0)
    try:
        plain = AttentionLayer("softmax", 8, 2, form=form)
    except VariantError:
        pytest.skip(f"softmax has no {form} form")
    wide = AttentionLayer(f"softmax:window={2**63 - 1}", 8, 2, form=form)
    wide.load_state_dict(plain.state_dict())
    x, more = torch.randn(1, 5, 8), torch.randn(1, 3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, state = wide(x)
        later, _ = wide(more, state=state)
    expected, expected_state = plain(x)
    assert torch.equal(out, expected)
    assert torch.equal(later, plain(more, state=expected_state)[0])
