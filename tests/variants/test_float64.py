"""float64 end to end (issue 14.1): every variant and form computes float64 inputs in float64.

- ``torch.autograd.gradcheck`` passes for every variant and form, with respect to q, k, v, β and
  the carried state (B = H = 1, T = 5, d_key = 3), and for the fused write-then-read and read;
- outputs and states agree with a plain float64 loop over the tokens to ~1e-12 (fp32 arithmetic
  anywhere inside would miss by ~1e-7);
- a float64 state is accepted, a state of another precision refused in one line.
"""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import FORMS, SPECS

from fwbench import variants
from fwbench.variants import FastWeightState, KVCacheState, VariantError

#: SPECS plus the FWM rule (recurrent form only) and the delta-rule ablation without normalisation.
ALL_SPECS = [*SPECS, "tanh-fwm", "favor-fwm:m=4", "linear-delta-unnorm"]
D_KEY, D_V, T = 3, 2, 5
#: float64 forms agree with the loop to ~1e-15 relative; fp32 arithmetic would leave ~1e-7.
FLOAT64_TOL = 1e-12


@functools.cache
def module(spec: str) -> variants.Attention:
    torch.manual_seed(0)  # FAVOR+ draws Ω here
    return variants.build_attention(spec, d_key=D_KEY).eval()


def forms_of(spec: str) -> tuple[str, ...]:
    return ("recurrent",) if rule_of(spec) == "fwm" else FORMS


def rule_of(spec: str) -> str:
    return variants.parse_spec(spec).info.rule


def float64_inputs(attention: variants.Attention, T: int = T, seed: int = 0) -> dict[str, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(1, 1, T, D_KEY, generator=g, dtype=torch.float64),
        "k": torch.randn(1, 1, T, D_KEY, generator=g, dtype=torch.float64),
        "v": torch.randn(1, 1, T, D_V, generator=g, dtype=torch.float64),
        "beta": torch.rand(1, 1, T, generator=g, dtype=torch.float64) if attention.uses_beta else None,
    }


def float64_state(attention: variants.Attention):
    """A non-zero float64 state: the state after a random 3-token prefix."""
    _, state = attention(**float64_inputs(attention, T=3, seed=9), form="recurrent")
    return state


def state_tensors(state) -> list[torch.Tensor]:
    if isinstance(state, KVCacheState):
        return [state.k, state.v]
    return [state.W] + ([] if state.z is None else [state.z])


def rebuild_state(template, tensors):
    if isinstance(template, KVCacheState):
        return KVCacheState(tensors[0], tensors[1], template.position)
    return FastWeightState(tensors[0], tensors[1] if template.z is not None else None, template.position)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_float64_inputs_give_float64_outputs_and_state(spec):
    attention = module(spec)
    inputs = float64_inputs(attention)
    state0 = float64_state(attention)
    assert all(x.dtype == torch.float64 for x in state_tensors(state0))
    for form in forms_of(spec):
        y, state = attention(**inputs, state=state0, form=form, chunk_size=2)
        assert y.dtype == torch.float64
        assert all(x.dtype == torch.float64 for x in state_tensors(state))


@pytest.mark.slow
@pytest.mark.parametrize("spec", ALL_SPECS)
def test_gradcheck_every_variant_and_form_in_float64(spec):
    """Before: Jacobian errors of 1e-3 to 0.25 (computed in fp32). Checks q, k, v, β and the state."""
    attention = module(spec)
    inputs = float64_inputs(attention)
    state0 = float64_state(attention)
    names = [name for name, x in inputs.items() if x is not None]
    leaves = [inputs[name].clone().requires_grad_(True) for name in names]
    state_leaves = [x.clone().requires_grad_(True) for x in state_tensors(state0)]
    for form in forms_of(spec):
        def run(*tensors, form=form):
            given = dict(zip(names, tensors[: len(names)], strict=True))
            state = rebuild_state(state0, tensors[len(names):])
            y, new_state = attention(**given, state=state, form=form, chunk_size=2)
            return (y, *state_tensors(new_state))

        assert torch.autograd.gradcheck(run, (*leaves, *state_leaves), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if s != "softmax"])
def test_gradcheck_write_read_and_read_in_float64(spec):
    attention = module(spec)
    inputs = float64_inputs(attention)
    queries = torch.randn(1, 1, 2, D_KEY, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    names = ["k", "v"] + (["beta"] if attention.uses_beta else [])
    leaves = [inputs[name].clone().requires_grad_(True) for name in names] + [queries.clone().requires_grad_(True)]

    def write_read(*tensors):
        given = dict(zip(names, tensors[:-1], strict=True))
        return attention.write_read(given["k"], given["v"], tensors[-1], beta=given.get("beta"))

    def write_then_read(*tensors):
        given = dict(zip(names, tensors[:-1], strict=True))
        return attention.read(tensors[-1], attention.write(**given))

    assert torch.autograd.gradcheck(write_read, tuple(leaves), eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradcheck(write_then_read, tuple(leaves), eps=1e-6, atol=1e-8, rtol=1e-6)


def naive_loop(spec: str, q, k, v, beta, state):
    """The recurrence of each rule, one token at a time, in float64, on the module's own φ."""
    attention, rule = module(spec), rule_of(spec)
    outputs = []
    if rule == "softmax":
        keys, values = state.k, state.v
        for t in range(q.shape[2]):
            keys, values = torch.cat([keys, k[:, :, t:t + 1]], 2), torch.cat([values, v[:, :, t:t + 1]], 2)
            weights = torch.softmax(q[:, :, t:t + 1] @ keys.mT / D_KEY ** 0.5, dim=-1)
            outputs.append(weights @ values)
        return torch.cat(outputs, 2), [keys, values]
    pq, pk = attention.phi(q, query=True), attention.phi(k)
    W, z = state.W.clone(), None if state.z is None else state.z.clone()
    for t in range(q.shape[2]):
        k_t, q_t, v_t = pk[0, 0, t], pq[0, 0, t], v[0, 0, t]
        if rule == "sum":
            W[0, 0] += torch.outer(v_t, k_t)
            z[0, 0] += k_t
            outputs.append(W[0, 0] @ q_t / (z[0, 0] @ q_t).clamp(min=1e-30))  # an empty mass reads 0
            continue
        W[0, 0] += beta[0, 0, t] * torch.outer(v_t - W[0, 0] @ k_t, k_t)
        if rule == "fwm":
            W[0, 0] /= max(1.0, W[0, 0].norm().item())
            y = W[0, 0] @ q_t
            outputs.append((y - y.mean()) / torch.sqrt(y.var(unbiased=False) + 1e-5))
        else:
            outputs.append(W[0, 0] @ q_t)
    return torch.stack(outputs)[None, None], [W] + ([] if z is None else [z])


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_float64_outputs_match_a_float64_loop_to_1e_12(spec):
    attention = module(spec)
    inputs = float64_inputs(attention, T=9, seed=2)
    state0 = float64_state(attention)
    expected_y, expected_state = naive_loop(spec, **inputs, state=state0)
    for form in forms_of(spec):
        y, state = attention(**inputs, state=state0, form=form, chunk_size=4)
        torch.testing.assert_close(y, expected_y, rtol=FLOAT64_TOL, atol=FLOAT64_TOL)
        for actual, expected in zip(state_tensors(state), expected_state, strict=True):
            torch.testing.assert_close(actual, expected, rtol=FLOAT64_TOL, atol=FLOAT64_TOL)


@pytest.mark.parametrize("spec", ["linear", "dpfp-delta:nu=2", "favor:m=16"])
def test_a_state_of_another_precision_is_refused_in_one_line(spec):
    attention = module(spec)
    inputs64 = float64_inputs(attention)
    fp32_state = FastWeightState(*(x.float() if x is not None else None for x in (float64_state(attention).W,
                                                                                  float64_state(attention).z)), 3)
    with pytest.raises(VariantError, match=r"state\.W\.dtype: got torch\.float32; expected torch\.float64"):
        attention(**inputs64, state=fp32_state)
    inputs32 = {name: None if x is None else x.float() for name, x in inputs64.items()}
    with pytest.raises(VariantError, match=r"state\.W\.dtype: got torch\.float64; expected torch\.float32"):
        attention(**inputs32, state=float64_state(attention))
