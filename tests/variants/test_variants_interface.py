"""Specification of the attention modules' common interface, checked for every variant.

``y, state = attention(q, k, v, beta, state, form, chunk_size)``: the parallel, chunk and
recurrent forms agree (outputs, carried state and input gradients); splitting a sequence and
carrying the state equals one pass; no output depends on later tokens (also through
:class:`variants.AttentionLayer`); the delta rule overwrites a key written twice; FAVOR+ features
are frozen until redrawn; bad specs and bad calls raise :class:`variants.VariantError`.
"""

from __future__ import annotations

import re

import pytest
import torch
from helpers import (
    D_KEY,
    D_V,
    DELTA_SPECS,
    FORMS,
    SPECS,
    B,
    H,
    assert_close,
    assert_states_close,
    build,
    carried_state,
    random_inputs,
    time_slice,
)

from fwbench import variants
from fwbench.variants import AttentionLayer, FastWeightState, VariantError, kernels

TOL = 1e-5
LENGTHS = [1, 2, 15, 64, 65, 100]
CHUNK_SIZES = [16, 32, 64]
START = ["from_zero_state", "with_carried_state"]


def initial_state(attention, start: str):
    return None if start == "from_zero_state" else carried_state(attention)


# --------------------------------------------------------------------------------------------
# 1. The three forms agree.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", START)
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("spec", SPECS)
def test_parallel_equals_recurrent(spec, T, start):
    attention = build(spec)
    state0 = initial_state(attention, start)
    inputs = random_inputs(attention, T)
    y_rec, s_rec = attention(**inputs, state=state0, form="recurrent")
    y_par, s_par = attention(**inputs, state=state0, form="parallel")
    assert y_par.shape == (B, H, T, D_V)
    assert_close(y_par, y_rec, TOL)
    assert_states_close(s_par, s_rec, TOL)


@pytest.mark.parametrize("start", START)
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("spec", SPECS)
def test_chunk_equals_recurrent(spec, T, chunk_size, start):
    attention = build(spec)
    state0 = initial_state(attention, start)
    inputs = random_inputs(attention, T)
    y_rec, s_rec = attention(**inputs, state=state0, form="recurrent")
    y_chunk, s_chunk = attention(**inputs, state=state0, form="chunk", chunk_size=chunk_size)
    assert y_chunk.shape == (B, H, T, D_V)
    assert_close(y_chunk, y_rec, TOL)
    assert_states_close(s_chunk, s_rec, TOL)


@pytest.mark.parametrize("spec", SPECS)
def test_auto_form_equals_recurrent(spec):
    attention = build(spec)
    inputs = random_inputs(attention, 70)
    y_rec, s_rec = attention(**inputs, form="recurrent")
    y_auto, s_auto = attention(**inputs)
    assert_close(y_auto, y_rec, TOL)
    assert_states_close(s_auto, s_rec, TOL)


def _loss_and_leaves(attention, inputs, state0, form, chunk_size, cotangents):
    leaves = {name: x.clone().requires_grad_(True) for name, x in inputs.items() if x is not None}
    args = {name: leaves.get(name) for name in inputs}
    y, state = attention(**args, state=state0, form=form, chunk_size=chunk_size)
    loss = (y * cotangents["y"]).sum()
    if isinstance(state, FastWeightState):
        loss = loss + (state.W * cotangents["W"]).sum()
        if state.z is not None:
            loss = loss + (state.z * cotangents["z"]).sum()
    loss.backward()
    return {name: leaf.grad for name, leaf in leaves.items()}


GRADIENT_CASES = [
    (1, 16, "with_carried_state"),
    (2, 16, "with_carried_state"),
    *[(T, C, start) for T, C in [(15, 16), (65, 16), (65, 64)] for start in START],
]


@pytest.mark.parametrize(("T", "chunk_size", "start"), GRADIENT_CASES)
@pytest.mark.parametrize("spec", SPECS)
def test_chunk_input_gradients_equal_recurrent(spec, T, chunk_size, start):
    """d/d(q, k, v, β) of a loss on the outputs and the final state agree between the forms.

    One or two tokens from a zero state are left out on purpose: a normalised read of a single
    key returns v whatever q is, so ∂y/∂q is O(eps) and both forms return rounding noise of two
    nearly equal terms (a sparse DPFP φ makes that happen at T = 2 as well). After a carried
    prefix the normaliser sees several keys and the comparison is well conditioned.
    """
    attention = build(spec)
    state0 = initial_state(attention, start)
    inputs = random_inputs(attention, T)
    d_dot = attention.d_dot or 1
    cotangents = {
        "y": torch.randn(B, H, T, D_V),
        "W": torch.randn(B, H, D_V, d_dot),
        "z": torch.randn(B, H, d_dot),
    }
    g_rec = _loss_and_leaves(attention, inputs, state0, "recurrent", None, cotangents)
    g_chunk = _loss_and_leaves(attention, inputs, state0, "chunk", chunk_size, cotangents)
    assert set(g_chunk) == ({"q", "k", "v", "beta"} if attention.uses_beta else {"q", "k", "v"})
    for name in g_rec:
        assert g_chunk[name] is not None and g_rec[name] is not None, name
        assert_close(g_chunk[name], g_rec[name], TOL)


# --------------------------------------------------------------------------------------------
# 2. Splitting a sequence and carrying the state equals one pass.
# --------------------------------------------------------------------------------------------

SPLIT_T = 37


@pytest.mark.parametrize("split", [0, 1, 16, 20, SPLIT_T - 1, SPLIT_T])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS)
def test_split_sequence_with_carried_state_equals_one_pass(spec, form, split):
    attention = build(spec)
    inputs = random_inputs(attention, SPLIT_T)
    y_full, s_full = attention(**inputs, form=form, chunk_size=16)
    y_a, s_a = attention(**time_slice(inputs, 0, split), form=form, chunk_size=16)
    y_b, s_b = attention(**time_slice(inputs, split, SPLIT_T), state=s_a, form=form, chunk_size=16)
    assert s_a.position == split and s_b.position == SPLIT_T
    assert_close(torch.cat([y_a, y_b], dim=2), y_full, TOL)
    assert_states_close(s_b, s_full, TOL)


# --------------------------------------------------------------------------------------------
# 3. Causality: outputs up to t do not depend on anything after t.
# --------------------------------------------------------------------------------------------

CAUSAL_T = 17


def _perturb_after(inputs, t):
    out = {}
    for name, x in inputs.items():
        if x is None:
            out[name] = None
            continue
        x = x.clone()
        noise = torch.rand_like(x[:, :, t + 1:]) if name == "beta" else 3 * torch.randn_like(x[:, :, t + 1:])
        x[:, :, t + 1:] = noise
        out[name] = x
    return out


@pytest.mark.parametrize("t", [0, 5, 8, 15])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS)
def test_outputs_do_not_depend_on_later_tokens(spec, form, t):
    attention = build(spec)
    state0 = carried_state(attention)
    inputs = random_inputs(attention, CAUSAL_T)
    perturbed = _perturb_after(inputs, t)
    assert not torch.equal(perturbed["k"], inputs["k"])
    y, _ = attention(**inputs, state=state0, form=form, chunk_size=8)
    y_perturbed, _ = attention(**perturbed, state=state0, form=form, chunk_size=8)
    assert (y_perturbed[:, :, : t + 1] - y[:, :, : t + 1]).abs().max() <= 1e-6
    assert not torch.allclose(y_perturbed[:, :, t + 1:], y[:, :, t + 1:])


@pytest.mark.parametrize("t", [0, 8, 15])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS)
def test_attention_layer_outputs_do_not_depend_on_later_tokens(spec, form, t):
    layer = AttentionLayer(spec, d_model=32, n_heads=2, form=form, chunk_size=8).eval()
    x = torch.randn(2, CAUSAL_T, 32)
    x_perturbed = x.clone()
    x_perturbed[:, t + 1:] = 3 * torch.randn_like(x[:, t + 1:])
    with torch.no_grad():
        y, _ = layer(x)
        y_perturbed, _ = layer(x_perturbed)
    assert y.shape == (2, CAUSAL_T, 32)
    assert (y_perturbed[:, : t + 1] - y[:, : t + 1]).abs().max() <= 1e-6
    assert not torch.allclose(y_perturbed[:, t + 1:], y[:, t + 1:])


# --------------------------------------------------------------------------------------------
# 4. φ(0) is harmless end to end.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS)
def test_all_zero_queries_and_keys_give_finite_outputs(spec, form):
    attention = build(spec)
    inputs = random_inputs(attention, 10)
    inputs["q"] = torch.zeros_like(inputs["q"])
    inputs["k"] = torch.zeros_like(inputs["k"])
    y, state = attention(**inputs, form=form, chunk_size=4)
    assert torch.isfinite(y).all()
    if isinstance(state, FastWeightState):
        assert torch.isfinite(state.W).all()


# --------------------------------------------------------------------------------------------
# 5. The delta rule with β = 1 overwrites a key written twice (module level).
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_delta_module_key_written_twice_with_beta_one_reads_second_value(form):
    """DPFP ν=1 maps x = (1, 1, 0, …, 0) to a one-hot φ (only r_1·r_0 is non-zero), so the
    sum-normalised key n has nᵀn = 1 (up to the 1e-6 normaliser eps) and β = 1 overwrites."""
    attention = build("dpfp-delta:nu=1")
    key = torch.zeros(D_KEY)
    key[:2] = 1.0
    phi = attention.feature_map(key)
    assert int((phi != 0).sum()) == 1
    k = key.expand(B, H, 2, D_KEY).clone()
    v1, v2 = torch.randn(B, H, D_V), torch.randn(B, H, D_V)
    v = torch.stack([v1, v2], dim=2)
    beta = torch.ones(B, H, 2)
    state0 = carried_state(attention)  # whatever was stored under the key before is replaced too
    y, state = attention(k, k, v, beta, state=state0, form=form, chunk_size=1 if form == "chunk" else None)
    assert_close(y[:, :, 0], v1, TOL)
    assert_close(y[:, :, 1], v2, TOL)
    assert_close(attention.read(k[:, :, :1], state)[:, :, 0], v2, TOL)


@pytest.mark.parametrize("spec", [s for s in SPECS if s != "softmax"])
def test_fast_weight_module_is_its_rule_applied_to_phi_of_queries_and_keys(spec):
    """Sum rule: φ(q), φ(k) as they are; delta rule: sum-normalised φ (paper Eq. 23)."""
    attention = build(spec)
    inputs = random_inputs(attention, 11)
    y, state = attention(**inputs, form="recurrent")
    phi_q, phi_k = attention.feature_map(inputs["q"]), attention.feature_map(inputs["k"])
    if attention.uses_beta:
        phi_q, phi_k = variants.sum_normalize(phi_q), variants.sum_normalize(phi_k)
        y_ref, W_ref = kernels.delta_rule_recurrent(phi_q, phi_k, inputs["v"], inputs["beta"])
        assert state.z is None
    else:
        y_ref, W_ref, z_ref = kernels.sum_rule_recurrent(phi_q, phi_k, inputs["v"])
        assert_close(state.z, z_ref, TOL)
    assert_close(y, y_ref, TOL)
    assert_close(state.W, W_ref, TOL)
    assert state.W.shape == (B, H, D_V, attention.d_dot)


@pytest.mark.parametrize("spec", DELTA_SPECS)
def test_delta_write_then_read_equals_forward_state(spec):
    attention = build(spec)
    inputs = random_inputs(attention, 23)
    _, state = attention(**inputs, form="recurrent")
    written = attention.write(inputs["k"], inputs["v"], inputs["beta"], chunk_size=8)
    assert_states_close(written, state, TOL)
    query = torch.randn(B, H, 3, D_KEY)
    expected, _ = attention(query, torch.zeros_like(query), torch.zeros(B, H, 3, D_V),
                            torch.zeros(B, H, 3), state=state, form="recurrent")
    assert_close(attention.read(query, written), expected, TOL)


# --------------------------------------------------------------------------------------------
# 8. FAVOR+ random features are frozen until redrawn.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["favor:m=16", "favor-delta:m=16"])
def test_favor_features_frozen_in_eval_and_changed_by_redraw(spec):
    attention = build(spec)
    inputs = random_inputs(attention, 12)
    x = torch.randn(B, H, 5, D_KEY)
    phi_a, phi_b = attention.feature_map(x), attention.feature_map(x)
    y_a, _ = attention(**inputs)
    y_b, _ = attention(**inputs)
    assert torch.equal(phi_a, phi_b)
    assert torch.equal(y_a, y_b)

    omega = attention.feature_map.omega.clone()
    attention.redraw_features()
    assert attention.feature_map.omega.shape == omega.shape
    assert not torch.allclose(attention.feature_map.omega, omega)
    assert not torch.allclose(attention.feature_map(x), phi_a)
    y_c, _ = attention(**inputs)
    assert not torch.allclose(y_c, y_a)
    assert torch.equal(dict(attention.named_buffers())["feature_map.omega"], attention.feature_map.omega)


def test_favor_redraw_is_reproducible_under_the_same_seed():
    attention = build("favor:m=16")
    torch.manual_seed(123)
    attention.redraw_features()
    first = attention.feature_map.omega.clone()
    torch.manual_seed(123)
    attention.redraw_features()
    assert torch.equal(attention.feature_map.omega, first)


def test_deterministic_variants_ignore_redraw():
    attention = build("dpfp:nu=2")
    inputs = random_inputs(attention, 9)
    y_a, _ = attention(**inputs)
    attention.redraw_features()
    y_b, _ = attention(**inputs)
    assert torch.equal(y_a, y_b)


# --------------------------------------------------------------------------------------------
# 7. Bad input raises VariantError (a ValueError) naming the problem.
# --------------------------------------------------------------------------------------------


def test_variant_error_is_a_value_error():
    assert issubclass(VariantError, ValueError)


def test_unknown_variant_name_lists_allowed_names():
    with pytest.raises(VariantError) as excinfo:
        variants.parse_spec("nope")
    message = str(excinfo.value)
    assert "nope" in message
    for name in variants.REGISTRY:
        assert name in message
    with pytest.raises(VariantError, match="nope"):
        variants.build_attention("nope:m=3", d_key=8)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("dpfp:nu=0", "nu"),
        ("favor:m=-1", "m"),
        ("dpfp:foo=1", "foo"),
        ("dpfp:nu=x", "nu"),
        ("dpfp-delta:nu=0", "nu"),
    ],
)
def test_bad_spec_parameter_raises_variant_error_naming_it(spec, named):
    for parse in (variants.parse_spec, lambda s: variants.build_attention(s, d_key=8)):
        with pytest.raises(VariantError) as excinfo:
            parse(spec)
        assert named in str(excinfo.value)


def test_unknown_spec_parameter_lists_allowed_parameters():
    with pytest.raises(VariantError, match="allowed parameters: nu"):
        variants.parse_spec("dpfp:foo=1")


def test_dpfp_nu_too_large_for_d_key_raises():
    with pytest.raises(VariantError, match="nu"):
        variants.build_attention("dpfp:nu=16", d_key=8)


def test_valid_spec_round_trips_through_its_canonical_string():
    spec = variants.parse_spec(" dpfp-delta : nu = 2 ")
    assert (spec.name, spec.params) == ("dpfp-delta", {"nu": 2})
    assert str(spec) == "dpfp-delta:nu=2"
    assert variants.parse_spec(str(spec)) == spec
    assert str(variants.parse_spec("favor")) == "favor:m=64"


@pytest.mark.parametrize("spec", SPECS)
def test_forward_with_3d_query_raises(spec):
    attention = build(spec)
    inputs = random_inputs(attention, 4)
    inputs["q"] = inputs["q"][0]
    with pytest.raises(VariantError, match=r"^q: "):
        attention(**inputs)


@pytest.mark.parametrize("spec", SPECS)
def test_forward_with_mismatched_sequence_lengths_raises(spec):
    attention = build(spec)
    inputs = random_inputs(attention, 4)
    inputs["v"] = torch.randn(B, H, 5, D_V)
    with pytest.raises(VariantError, match="must agree"):
        attention(**inputs)


@pytest.mark.parametrize("spec", DELTA_SPECS)
def test_delta_forward_without_beta_raises(spec):
    attention = build(spec)
    inputs = random_inputs(attention, 4)
    inputs["beta"] = None
    with pytest.raises(VariantError, match="beta"):
        attention(**inputs)
    with pytest.raises(VariantError, match="beta"):
        attention.write(inputs["k"], inputs["v"])


@pytest.mark.parametrize("spec", DELTA_SPECS)
def test_delta_forward_with_wrongly_shaped_beta_raises(spec):
    attention = build(spec)
    inputs = random_inputs(attention, 4)
    inputs["beta"] = inputs["beta"][..., None]
    with pytest.raises(VariantError, match="beta"):
        attention(**inputs)


@pytest.mark.parametrize("spec", DELTA_SPECS)
def test_sum_rule_state_passed_to_delta_variant_raises(spec):
    attention = build(spec)
    sum_spec = spec.replace("-delta", "")
    sum_state = carried_state(build(sum_spec))
    assert sum_state.W.shape == carried_state(attention).W.shape  # same shape: only the kind differs
    with pytest.raises(VariantError, match="state"):
        attention(**random_inputs(attention, 4), state=sum_state)


@pytest.mark.parametrize("spec", ["linear", "favor:m=16", "dpfp:nu=2"])
def test_delta_rule_state_passed_to_sum_variant_raises(spec):
    attention = build(spec)
    delta_state = carried_state(build(spec.replace(":", "-delta:") if ":" in spec else spec + "-delta"))
    with pytest.raises(VariantError, match="state"):
        attention(**random_inputs(attention, 4), state=delta_state)


@pytest.mark.parametrize("spec", SPECS)
def test_state_of_another_kind_raises(spec):
    attention = build(spec)
    other = carried_state(build("linear" if spec == "softmax" else "softmax"))
    with pytest.raises(VariantError, match="state"):
        attention(**random_inputs(attention, 4), state=other)


BROKEN_CACHES = {  # (k cache, v cache) of a softmax module with d_key 2, beside q (1, 1, T, 2)
    "v of another token count": ((1, 1, 3, 2), (1, 1, 4, 4)),
    "v of another batch": ((1, 1, 3, 2), (2, 1, 3, 4)),
    "v of other heads": ((1, 1, 3, 2), (1, 2, 3, 4)),
    "v of 3 dimensions": ((1, 1, 3, 2), (1, 3, 4)),
    "k of 5 dimensions": ((1, 1, 1, 3, 2), (1, 1, 3, 4)),
}


@pytest.mark.parametrize("call", ["read", "write_read", "write", "forward"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("case", list(BROKEN_CACHES))
def test_kv_cache_whose_keys_and_values_disagree_raises(case, window, call):
    """A KVCacheState is k (B, H, P, d_key) and v (B, H, P, d_v): one with a v of another batch, heads
    or rank was read by broadcasting (an output of B = 2 for a query of B = 1), and one with a v of
    another P raised "Expected size for first two dimensions of batch2 tensor" deep in torch."""
    attention = variants.build_attention("softmax" if window is None else f"softmax:window={window}", d_key=2)
    k_shape, v_shape = BROKEN_CACHES[case]
    state = variants.KVCacheState(torch.randn(k_shape), torch.randn(v_shape), 3)
    q, k, v = torch.randn(1, 1, 1, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 4)
    calls = {"read": lambda: attention.read(q, state), "write_read": lambda: attention.write_read(k, v, q, state=state),
             "write": lambda: attention.write(k, v, state=state), "forward": lambda: attention(k, k, v, state=state)}
    with pytest.raises(VariantError, match=r"^state: cache k .* is not a KV cache; expected k \(B, H, P, d_key\)"):
        calls[call]()


READ_W = {  # a fast weight W that is not (B, H, d_v, d_dot), for the read of a module with d_key 2
    "None": (None, r"state\.W: got 'NoneType'; expected a tensor$"),
    "2 dimensions": ((4, 2), r"state\.W: got \(4, 2\); expected shape \(B, H, d_v, d_dot\) = \(1, 1, 'd_v', 2\)$"),
    "3 dimensions": ((1, 4, 2), r"state\.W: got \(1, 4, 2\); expected shape .* = \(1, 1, 'd_v', 2\)$"),
    "0 dimensions": ((), r"state\.W: got \(\); expected shape .* = \(1, 1, 'd_v', 2\)$"),
    "5 dimensions": ((1, 1, 1, 4, 2), r"state\.W: got \(1, 1, 1, 4, 2\); expected shape .* = \(1, 1, 'd_v', 2\)$"),
}


@pytest.mark.parametrize("spec", ["linear", "linear-delta", "tanh-fwm"])
@pytest.mark.parametrize("case", list(READ_W))
def test_read_of_a_fast_weight_that_is_not_4d_raises(spec, case):
    """read() took W's d_v as state.W.shape[2] before checking W: a W of None raised
    "AttributeError: 'NoneType' object has no attribute 'shape'" and one of fewer than 3 dimensions
    "IndexError: tuple index out of range" (forward and write named state.W)."""
    attention = variants.build_attention(spec, d_key=2)
    shape, message = READ_W[case]
    z = torch.zeros(1, 1, 2) if attention.update_rule.carries_normalizer else None
    state = FastWeightState(None if shape is None else torch.zeros(shape), z, 3)
    with pytest.raises(VariantError, match="^" + message):
        attention.read(torch.randn(1, 1, 1, 2), state)


BAD_POSITIONS = {"None": None, "a string": "3", "negative": -1, "a float": 2.0, "a tensor": torch.tensor(3),
                 "a bool": True}


@pytest.mark.parametrize("call", ["forward", "write", "read", "write_read"])
@pytest.mark.parametrize("spec", ["softmax", "softmax:window=2", "linear", "linear-delta", "tanh-fwm"])
@pytest.mark.parametrize("case", list(BAD_POSITIONS))
def test_state_whose_position_is_not_a_token_count_raises(case, spec, call):
    """A state's position counts its tokens, and each call adds T to it: a position of None or a
    string raised "TypeError: unsupported operand type(s) for +" in forward and write, and a float, a
    tensor or a negative count was carried into the next state (2.0 + 2 = 4.0), which the language
    model uses to cut its segments."""
    attention = variants.build_attention(spec, d_key=2)
    q, k, v = torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 3)
    beta = torch.rand(1, 1, 2) if attention.uses_beta else None
    state = attention.write(k, v, beta)
    state.position = BAD_POSITIONS[case]
    calls = {"forward": lambda: attention(q, k, v, beta=beta, state=state), "read": lambda: attention.read(q, state),
             "write": lambda: attention.write(k, v, beta, state),
             "write_read": lambda: attention.write_read(k, v, q, beta, state)}
    message = f"state.position: got {BAD_POSITIONS[case]!r}; expected the number of tokens the state has seen"
    with pytest.raises(VariantError, match="^" + re.escape(message) + r" \(an integer >= 0\)$"):
        calls[call]()


@pytest.mark.parametrize("spec", ["softmax", "linear", "linear-delta"])
def test_state_whose_position_is_a_numpy_integer_continues(spec):
    """A count held as a NumPy integer (read from an array a user keeps positions in) is a count."""
    np = pytest.importorskip("numpy")
    attention = variants.build_attention(spec, d_key=2)
    q, k, v = torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 3)
    beta = torch.rand(1, 1, 2) if attention.uses_beta else None
    state = attention.write(k, v, beta)
    state.position = np.int64(2)
    expected = attention(q, k, v, beta=beta, state=attention.write(k, v, beta))
    y, after = attention(q, k, v, beta=beta, state=state)
    assert torch.equal(y, expected[0]) and after.position == 4


@pytest.mark.parametrize("spec", ["softmax", "linear", "linear-delta"])
def test_state_whose_position_is_a_narrow_numpy_integer_counts_past_its_width(spec):
    """Each call added its T to the position in the position's own type: np.uint8(255) + 2 wrapped to 1
    (with a RuntimeWarning), np.int8(127) + 2 to -127, which the next call refused as negative."""
    np = pytest.importorskip("numpy")
    attention = variants.build_attention(spec, d_key=2)
    q, k, v = torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 3)
    beta = torch.rand(1, 1, 2) if attention.uses_beta else None
    for position in (np.uint8(255), np.int8(127)):
        state = attention.write(k, v, beta)
        state.position = position
        after = [attention(q, k, v, beta=beta, state=state)[1], attention.write(k, v, beta, state=state)]
        assert [s.position for s in after] == [int(position) + 2] * 2
        assert all(type(s.position) is int for s in after)


@pytest.mark.parametrize("spec", SPECS)
def test_bad_form_name_raises(spec):
    attention = build(spec)
    with pytest.raises(VariantError, match="form") as excinfo:
        attention(**random_inputs(attention, 4), form="sideways")
    assert "recurrent" in str(excinfo.value)


@pytest.mark.parametrize("chunk_size", [0, -3])
@pytest.mark.parametrize("spec", SPECS)
def test_non_positive_chunk_size_raises(spec, chunk_size):
    attention = build(spec)
    with pytest.raises(VariantError, match="chunk_size"):
        attention(**random_inputs(attention, 4), form="chunk", chunk_size=chunk_size)


def test_attention_layer_rejects_bad_sizes_and_inputs():
    with pytest.raises(VariantError, match="d_model"):
        AttentionLayer("linear", d_model=30, n_heads=4)
    with pytest.raises(VariantError, match="n_heads"):
        AttentionLayer("linear", d_model=32, n_heads=0)
    layer = AttentionLayer("linear", d_model=32, n_heads=2)
    with pytest.raises(VariantError, match="x"):
        layer(torch.randn(2, 5, 16))
