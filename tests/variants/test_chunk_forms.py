"""Specification of the fast chunk forms, the fused write-then-read and their low-precision behaviour.

- For every fast-weight family with chunk forms (sum and delta rule on elu+1, FAVOR+, DPFP, and
  the unnormalised-delta ablation; the FWM rule has only its recurrent form), the chunk form
  (chunk sizes 16, 32, 64) and the parallel form agree with the token-by-token recurrent form from
  a non-zero carried state: outputs, final state and the gradients of q, k, v, β and the carried
  state (relative RMSE ≤ 1e-5, fp32), for T ∈ {1, 2, 15, 63, 64, 65, 100}; at T = 1000 the chunk
  form is checked against the parallel form (and, for DPFP, against the recurrent form).
- ``write_read`` equals ``read(write(...))``, gradients included; the retrieval model's fastest
  (default) form equals its chunk and recurrent forms.
- The fused DPFP op and the symmetric Gram backward equal their plain-torch definitions.
- fp16 / bf16 inputs give finite outputs in the input dtype, within the stated tolerance of fp32,
  with an fp32 state; memory of the chunk forms grows linearly in T.
"""

from __future__ import annotations

import pytest
import torch
from helpers import LOW_PRECISION_REL_RMSE, assert_close, build

from fwbench.bench.measure import peak_memory_bytes
from fwbench.variants import FastWeightState, using_form
from fwbench.variants.kernels.chunking import chunk_length, split_chunks
from fwbench.variants.kernels.dpfp import dpfp
from fwbench.variants.kernels.gram import gram

TOL = 1e-5
B, H, D_KEY, D_V = 2, 2, 8, 6
FAST_WEIGHT_SPECS = ["linear", "favor:m=16", "dpfp:nu=2", "linear-delta", "favor-delta:m=16", "dpfp-delta:nu=2"]
#: plus the unnormalised delta rule (the Section 4.2 ablation), which has chunk forms too; it is
#: unstable by design (β‖φ(k)‖² > 2 grows W), so it is checked on sequences up to T = 100 only
SHORT_SPECS = [*FAST_WEIGHT_SPECS, "dpfp-delta-unnorm:nu=1"]


def _inputs(attention, T: int, dtype=torch.float32, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    beta = torch.sigmoid(randn(B, H, T).float()).to(dtype) if attention.uses_beta else None
    return {"q": randn(B, H, T, D_KEY), "k": randn(B, H, T, D_KEY), "v": randn(B, H, T, D_V), "beta": beta}


def _carried(attention) -> FastWeightState:
    """A non-zero state after 9 random tokens, made a leaf so its gradient can be compared."""
    _, state = attention(**_inputs(attention, 9, seed=99), form="recurrent")
    W = state.W.detach().clone().requires_grad_(True)
    z = None if state.z is None else state.z.detach().clone().requires_grad_(True)
    return FastWeightState(W, z, state.position)


def _run(attention, inputs: dict, state: FastWeightState, form: str, chunk_size: int | None):
    """Outputs, final state, and d/d(q, k, v, β, W0, z0) of a fixed random functional of both."""
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items() if x is not None}
    state = FastWeightState(state.W.detach().clone().requires_grad_(True),
                            None if state.z is None else state.z.detach().clone().requires_grad_(True),
                            state.position)
    y, final = attention(**{name: leaves.get(name) for name in inputs}, state=state, form=form,
                         chunk_size=chunk_size)
    generator = torch.Generator().manual_seed(7)
    loss = (y * torch.randn(y.shape, generator=generator)).sum()
    loss = loss + (final.W * torch.randn(final.W.shape, generator=generator)).sum()
    if final.z is not None:
        loss = loss + (final.z * torch.randn(final.z.shape, generator=generator)).sum()
    loss.backward()
    grads = {name: leaf.grad for name, leaf in leaves.items()}
    grads["W0"] = state.W.grad
    if state.z is not None:
        grads["z0"] = state.z.grad
    return y.detach(), final, grads


def _assert_same(result, expected) -> None:
    (y, state, grads), (y_ref, state_ref, grads_ref) = result, expected
    assert_close(y, y_ref, TOL)
    assert_close(state.W.detach(), state_ref.W.detach(), TOL)
    if state_ref.z is not None:
        assert_close(state.z.detach(), state_ref.z.detach(), TOL)
    assert state.position == state_ref.position
    assert set(grads) == set(grads_ref)
    for name in grads_ref:
        assert grads[name] is not None, name
        assert_close(grads[name], grads_ref[name], TOL)


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
@pytest.mark.parametrize("T", [1, 2, 15, 63, 64, 65, 100])
@pytest.mark.parametrize("spec", SHORT_SPECS)
def test_chunk_equals_recurrent_with_carried_state_outputs_state_and_gradients(spec, T, chunk_size):
    attention = build(spec)
    state, inputs = _carried(attention), _inputs(attention, T)
    expected = _run(attention, inputs, state, "recurrent", None)
    _assert_same(_run(attention, inputs, state, "chunk", chunk_size), expected)


@pytest.mark.parametrize("T", [1, 2, 15, 63, 64, 65, 100])
@pytest.mark.parametrize("spec", SHORT_SPECS)
def test_parallel_equals_recurrent_with_carried_state_outputs_state_and_gradients(spec, T):
    attention = build(spec)
    state, inputs = _carried(attention), _inputs(attention, T)
    _assert_same(_run(attention, inputs, state, "parallel", None), _run(attention, inputs, state, "recurrent", None))


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
@pytest.mark.parametrize("spec", FAST_WEIGHT_SPECS)
def test_chunk_equals_parallel_at_T_1000(spec, chunk_size):
    attention = build(spec)
    state, inputs = _carried(attention), _inputs(attention, 1000)
    _assert_same(_run(attention, inputs, state, "chunk", chunk_size), _run(attention, inputs, state, "parallel", None))


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["dpfp:nu=1", "dpfp-delta:nu=1"])
def test_chunk_equals_recurrent_at_T_1000(spec):
    attention = build(spec)
    state, inputs = _carried(attention), _inputs(attention, 1000)
    _assert_same(_run(attention, inputs, state, "chunk", 64), _run(attention, inputs, state, "recurrent", None))


# --------------------------------------------------------------------------------------------
# Write-then-read without forming W.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 63, 100])
@pytest.mark.parametrize("spec", [s for s in FAST_WEIGHT_SPECS if "delta" in s])
def test_delta_chunk_without_autograd_equals_recording_and_leaves_the_carried_state_alone(spec, T):
    """Without autograd the delta-rule chunk form updates its state in place: same outputs and
    final state as with autograd recording, and the caller's carried W untouched."""
    attention = build(spec)
    inputs = _inputs(attention, T)
    state = _carried(attention)
    W_before = state.W.detach().clone()
    with torch.no_grad():
        y, final = attention(**inputs, state=state, form="chunk", chunk_size=16)
    assert torch.equal(state.W.detach(), W_before)
    y_ref, final_ref = attention(**inputs, state=state, form="chunk", chunk_size=16)
    assert_close(y, y_ref.detach(), TOL)
    assert_close(final.W, final_ref.W.detach(), TOL)


@pytest.mark.parametrize("carried", [False, True], ids=["from_zero_state", "with_carried_state"])
@pytest.mark.parametrize("T", [1, 30, 120, 301])
@pytest.mark.parametrize(("spec", "n_queries"), [
    *((spec, 5) for spec in [*FAST_WEIGHT_SPECS, "softmax"]),
    *((spec, n) for spec in FAST_WEIGHT_SPECS if "delta" in spec for n in (1, 3)),
])
def test_write_read_equals_read_after_write_with_gradients(spec, T, carried, n_queries):
    """(From a zero state, a normalised read of one key returns v whatever q is: ∂y/∂q is
    rounding noise in both computations, so T = 1 is compared after a carried prefix only.)
    The delta rule's hand-written backward has a rank-one branch for one query: 1, 3 and 5 queries."""
    attention = build(spec)
    if T == 1 and not carried and attention.d_dot and not attention.uses_beta:
        pytest.skip("ill-conditioned: ∂y/∂q is O(eps) for a normalised read of a single key")
    inputs = _inputs(attention, T)
    q = torch.randn(B, H, n_queries, D_KEY)
    state = _carried(attention) if carried and spec != "softmax" else None
    if carried and spec == "softmax":
        _, state = attention(**_inputs(attention, 9, seed=99))

    def answer(fused: bool):
        leaves = {name: x.clone().requires_grad_(True) for name, x in inputs.items() if x is not None}
        q_leaf = q.clone().requires_grad_(True)
        k, v, beta = leaves["k"], leaves["v"], leaves.get("beta")
        if fused:
            y = attention.write_read(k, v, q_leaf, beta=beta, state=state)
        else:
            y = attention.read(q_leaf, attention.write(k, v, beta=beta, state=state))
        (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        return y.detach(), {"q": q_leaf.grad, **{name: leaf.grad for name, leaf in leaves.items() if name != "q"}}

    (y, grads), (y_ref, grads_ref) = answer(True), answer(False)
    assert_close(y, y_ref, TOL)
    for name in grads_ref:
        assert_close(grads[name], grads_ref[name], TOL)


@pytest.mark.parametrize("n_queries", [1, 3])
@pytest.mark.parametrize("T", [30, 65])
def test_unnormalised_delta_write_read_equals_read_after_write_with_gradients(T, n_queries):
    """write_read of the delta rule on keys that are not sum-normalised (the Section 4.2 ablation)."""
    attention = build("dpfp-delta-unnorm:nu=1")
    inputs = _inputs(attention, T)
    inputs["k"] = inputs["k"] * 0.2  # β‖φ(k)‖² < 2: the unnormalised write stays stable
    q = torch.randn(B, H, n_queries, D_KEY)
    state = _carried(attention)

    def answer(fused: bool):
        leaves = {name: x.clone().requires_grad_(True) for name, x in inputs.items() if name != "q"}
        q_leaf = q.clone().requires_grad_(True)
        W0 = state.W.detach().clone().requires_grad_(True)
        carried = FastWeightState(W0, None, state.position)
        if fused:
            y = attention.write_read(leaves["k"], leaves["v"], q_leaf, beta=leaves["beta"], state=carried)
        else:
            y = attention.read(q_leaf, attention.write(leaves["k"], leaves["v"], beta=leaves["beta"], state=carried))
        (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        return y.detach(), [q_leaf.grad, W0.grad, *(leaf.grad for leaf in leaves.values())]

    (y, grads), (y_ref, grads_ref) = answer(True), answer(False)
    assert torch.isfinite(y_ref).all()
    assert_close(y, y_ref, TOL)
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        assert_close(grad, grad_ref, TOL)


def test_write_read_refuses_second_order_gradients_with_a_clear_error():
    """The delta rule's fused backward keeps no graph: create_graph=True must not give silent zeros."""
    from fwbench.variants import VariantError

    attention = build("dpfp-delta:nu=1")
    inputs = {name: x.requires_grad_(True) for name, x in _inputs(attention, 40).items()}
    q = torch.randn(B, H, 1, D_KEY, requires_grad=True)
    y = attention.write_read(inputs["k"], inputs["v"], q, beta=inputs["beta"])
    with pytest.raises(VariantError, match="second-order gradients"):
        torch.autograd.grad(y.sum(), [q, inputs["k"]], create_graph=True)


def test_retrieval_default_form_equals_chunk_and_recurrent_forms_and_gradients():
    from fwbench.tasks.retrieval import RetrievalConfig, RetrievalTask

    task, config = RetrievalTask(), RetrievalConfig(setting=2, S=12, d_key=8, chunk_size=8)
    torch.manual_seed(0)
    model = task.build_model(config, "dpfp-delta:nu=1")
    batch = task.train_batch(config, torch.Generator().manual_seed(0))
    queries = torch.arange(12).expand(config.batch_size, -1)
    results = {}
    for form in ("auto", "chunk", "recurrent"):
        model.zero_grad()
        with using_form(model, form):
            y = model(batch["keys"], batch["values"], queries)
        y.pow(2).sum().backward()
        results[form] = (y.detach(), [p.grad.clone() for p in model.parameters()])
    for form in ("chunk", "recurrent"):
        assert_close(results["auto"][0], results[form][0], TOL)
        for grad, grad_ref in zip(results["auto"][1], results[form][1], strict=True):
            assert_close(grad, grad_ref, TOL)


# --------------------------------------------------------------------------------------------
# Building blocks.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("nu", [1, 2, 5])
def test_fused_dpfp_equals_its_definition_values_and_gradients(nu, normalize):
    x = torch.randn(3, 4, 7, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    r = torch.cat([torch.relu(x_ref), torch.relu(-x_ref)], dim=-1)
    reference = torch.cat([r * r.roll(i, dims=-1) for i in range(1, nu + 1)], dim=-1)
    if normalize:
        reference = reference / reference.sum(-1, keepdim=True).clamp(min=1e-30)  # the floor, not an added eps
    y = dpfp(x, nu, normalize=normalize)
    cotangent = torch.randn(y.shape)
    (y * cotangent).sum().backward()
    (reference * cotangent).sum().backward()
    assert_close(y, reference, 1e-6)
    assert_close(x.grad, x_ref.grad, TOL)


def test_fused_dpfp_gradient_is_zero_at_zero_like_relu():
    x = torch.zeros(2, 5, requires_grad=True)
    dpfp(x, 2, normalize=True).sum().backward()
    assert torch.equal(x.grad, torch.zeros(2, 5))


def test_symmetric_gram_backward_equals_autograd():
    k = torch.randn(3, 9, 5, requires_grad=True)
    k_ref = k.detach().clone().requires_grad_(True)
    cotangent = torch.randn(3, 9, 9)
    (gram(k) * cotangent).sum().backward()
    ((k_ref @ k_ref.mT) * cotangent).sum().backward()
    assert_close(k.grad, k_ref.grad, TOL)


@pytest.mark.parametrize(("T", "chunk_size", "expected"), [(120, 32, 30), (4096, 64, 64), (65, 64, 33), (5, 64, 5),
                                                           (1, 16, 1), (100, 64, 50)])
def test_chunks_are_balanced_and_never_longer_than_chunk_size(T, chunk_size, expected):
    C = chunk_length(T, chunk_size)
    assert C == expected and C <= chunk_size
    (chunks,) = split_chunks([torch.ones(1, 1, T, 2)], chunk_size)
    assert chunks.shape[3] == C and chunks.shape[2] * C >= T and (chunks.shape[2] - 1) * C < T
    assert chunks.sum() == 2 * T  # the padding is zeros


# --------------------------------------------------------------------------------------------
# Low precision and memory.
# --------------------------------------------------------------------------------------------


def _low_precision_error(spec: str, dtype: torch.dtype, T: int, d_key: int = 64, d_v: int = 64):
    attention = build(spec, d_key=d_key)
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, T, d, generator=generator) for d in (d_key, d_key, d_v))
    beta = torch.sigmoid(torch.randn(1, 2, T, generator=generator)) if attention.uses_beta else None
    with torch.no_grad():
        reference, _ = attention(q, k, v, beta=beta, form="chunk")
        y, state = attention(q.to(dtype), k.to(dtype), v.to(dtype), beta=None if beta is None else beta.to(dtype),
                             form="chunk")
    assert y.dtype == dtype
    if isinstance(state, FastWeightState):
        assert state.W.dtype == torch.float32, "the fast weight must accumulate in fp32"
    assert torch.isfinite(y).all()
    return ((y.double() - reference.double()).norm() / reference.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("spec", ["softmax", "dpfp:nu=1", "dpfp-delta:nu=1", "favor-delta:m=64"])
def test_low_precision_forward_is_finite_and_close_to_fp32(spec, dtype):
    tolerance = LOW_PRECISION_REL_RMSE[dtype]
    assert _low_precision_error(spec, dtype, T=512) <= tolerance


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("spec", ["softmax", "linear", "favor", "dpfp", "linear-delta", "favor-delta", "dpfp-delta"])
def test_low_precision_forward_at_T_8192_every_variant(spec, dtype):
    tolerance = LOW_PRECISION_REL_RMSE[dtype]
    assert _low_precision_error(spec, dtype, T=8192) <= tolerance


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward_backward"])
@pytest.mark.parametrize("spec", ["dpfp:nu=1", "dpfp-delta:nu=1"])
def test_chunk_form_memory_grows_linearly_in_T(spec, backward):
    """Peak tensor memory at 4× the tokens is at most ~4× (no T² term, no per-token state)."""
    attention = build(spec, d_key=16)

    def peak(T):
        inputs = _inputs_sized(attention, T, requires_grad=backward)

        def call():
            if backward:
                attention(**inputs, form="chunk", chunk_size=32)[0].sum().backward()
            else:
                with torch.no_grad():
                    attention(**inputs, form="chunk", chunk_size=32)

        return peak_memory_bytes(call, torch.device("cpu"))

    assert peak(2048) <= 4.5 * peak(512)


def _inputs_sized(attention, T: int, requires_grad: bool) -> dict:
    generator = torch.Generator().manual_seed(T)
    tensors = {name: torch.randn(1, 2, T, 16, generator=generator).requires_grad_(requires_grad)
               for name in ("q", "k", "v")}
    beta = torch.sigmoid(torch.randn(1, 2, T, generator=generator)).requires_grad_(requires_grad)
    return {**tensors, "beta": beta if attention.uses_beta else None}
