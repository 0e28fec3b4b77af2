"""The fla dispatch's decisions word for word, and its switch read in-process (issue 14 item 14;
``docs/mutation.md``). ``test_fla_dispatch.py`` checks a key phrase of each reason and reads
the switch in fresh processes (a slow test): a reason's text changed around the phrase, or the
switch's parsing changed, went unseen."""

from __future__ import annotations

import pytest
import torch
from test_fla_dispatch import _tensors, on_cpu  # noqa: F401 (on_cpu is a fixture)

from fwbench.variants import VariantError
from fwbench.variants.kernels import delta_rule_chunk, fla_dispatch


@pytest.mark.parametrize(("rule", "inputs", "tf32", "backend", "reason"), [
    ("sum", dict(dtype=torch.bfloat16), False, "fla", "fla's chunk_simple_gla on CUDA"),
    ("delta", dict(dtype=torch.float16), False, "fla", "fla's chunk_delta_rule on CUDA"),
    ("delta", dict(dtype=torch.float64), True, "ours", "float64: fla computes in fp32 at most"),
    ("delta", dict(dtype=torch.bfloat16, phi_dtype=torch.float64), False, "ours", "float64: fla computes in fp32 at most"),
    ("delta", dict(dtype=torch.float32), True, "ours", "float32: fla's chunk_delta_rule accepts fp16/bf16 only"),
    ("sum", dict(dtype=torch.float32), False, "ours",
     "float32 with TF32 matmuls off: fla's Triton dots would round to TF32"),
    ("sum", dict(dtype=torch.bfloat16, phi_dtype=torch.float16), False, "ours",
     "q, k, v dtypes torch.float16, torch.float16, torch.bfloat16: fla takes φ in v's dtype or fp32"),
    ("sum", dict(dtype=torch.int32, phi_dtype=torch.float32), False, "ours", "dtype torch.int32: fla takes fp16, bf16 or fp32"),
    ("delta", dict(dtype=torch.bfloat16, d_dot=384), False, "ours",
     "d_dot 384 > 256: beyond fla's delta-rule state kernel"),
    ("delta", dict(dtype=torch.bfloat16, d_dot=256), False, "fla", "fla's chunk_delta_rule on CUDA"),
    ("delta", dict(dtype=torch.bfloat16, d_v=7), False, "ours",
     "odd d_dot 8 or d_v 7 in torch.bfloat16: fla's backward needs even sizes"),
    ("sum", dict(dtype=torch.float16, d_dot=9), False, "ours",
     "odd d_dot 9 or d_v 6 in torch.float16: fla's backward needs even sizes"),
    ("sum", dict(dtype=torch.bfloat16, T=0), False, "ours", "T = 0: nothing to compute"),
    ("sum", dict(dtype=torch.bfloat16, T=1), False, "fla", "fla's chunk_simple_gla on CUDA"),
])
def test_each_decision_gives_its_whole_reason(on_cpu, monkeypatch, rule, inputs, tf32, backend, reason):  # noqa: F811
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: tf32)
    decision = fla_dispatch.decide(rule, *_tensors(**inputs))
    assert decision == (backend, reason)


@pytest.mark.parametrize(("q_dtype", "k_dtype", "backend"), [
    (torch.bfloat16, torch.float16, "ours"),   # a key in neither v's dtype nor fp32
    (torch.float16, torch.bfloat16, "ours"),   # a query in neither
    (torch.bfloat16, torch.float32, "fla"),    # each in v's dtype or fp32: fla casts both to v's
    (torch.float32, torch.bfloat16, "fla"),
])
def test_queries_and_keys_are_each_checked_against_v_dtype_and_fp32(on_cpu, q_dtype, k_dtype, backend):  # noqa: F811
    """v in bf16. Mutants ``decide`` 33, 34 (``or`` → ``and`` between the query's and the key's
    checks) and 38 (the rule for unequal q and k dtypes applied to 16-bit v instead of fp32 v)."""
    q, _, v = _tensors(torch.bfloat16, phi_dtype=q_dtype)
    _, k, _ = _tensors(torch.bfloat16, phi_dtype=k_dtype)
    assert fla_dispatch.decide("sum", q, k, v).backend == backend


@pytest.mark.parametrize(("d_v", "backend"), [(9, "ours"), (4, "fla"), (8, "fla")])
def test_an_odd_value_size_in_16_bit_stays_with_ours(on_cpu, d_v, backend):  # noqa: F811
    """Mutant ``decide`` 100 (``d_v % 3`` for ``d_v % 2``: 9 passes, 4 is refused)."""
    assert fla_dispatch.decide("sum", *_tensors(torch.bfloat16, d_v=d_v)).backend == backend


@pytest.mark.parametrize(("dtype", "d_dot"), [(torch.float32, 8), (torch.bfloat16, 384)])
def test_the_delta_dispatch_asks_for_the_delta_rule(on_cpu, monkeypatch, dtype, d_dot):  # noqa: F811
    """fp32 with TF32 allowed, or d_dot 384 in bf16: fla would take the sum rule's call, not the delta
    rule's, which stays with ours (the same bits as :func:`delta_rule_chunk`). Mutants
    ``delta_rule_chunk_dispatch`` 1, 9, 10 (the rule passed to ``decide`` as None, ``"XXdeltaXX"``,
    ``"DELTA"``: read as the sum rule)."""
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: True)
    q, k, v = (x.to(dtype) for x in _tensors(torch.float32, d_dot=d_dot))
    beta = torch.full(q.shape[:3], 0.5, dtype=dtype)
    y, W = fla_dispatch.delta_rule_chunk_dispatch(q / d_dot, k / d_dot, v, beta)
    assert on_cpu.calls == {"sum": 0, "delta": 0}
    y_ours, W_ours = delta_rule_chunk(q / d_dot, k / d_dot, v, beta)
    assert torch.equal(y, y_ours) and torch.equal(W, W_ours)


def test_the_decisions_before_fla_is_asked_give_their_whole_reasons(monkeypatch):
    monkeypatch.setattr(fla_dispatch, "_enabled", False)
    assert fla_dispatch.decide("sum", *_tensors(torch.bfloat16)) == (
        "ours", "the fla dispatch is off (FWBENCH_FLA=0 or set_fla_enabled(False))")
    monkeypatch.setattr(fla_dispatch, "_enabled", True)
    assert fla_dispatch.decide("sum", *_tensors(torch.bfloat16)) == ("ours", "tensors on cpu, fla's kernels run on CUDA")
    monkeypatch.setattr(fla_dispatch, "FLA_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(fla_dispatch, "load_fla_kernels", lambda: (None, "why not"))
    assert fla_dispatch.decide("delta", *_tensors(torch.bfloat16)) == ("ours", "why not")


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("1", True), (" On ", True), ("TRUE", True), ("yes", True),
                                                ("0", False), ("off", False), ("False", False), (" no", False)])
def test_the_switch_is_read_from_the_environment_on_first_use(monkeypatch, value, enabled):
    monkeypatch.setattr(fla_dispatch, "_enabled", None)
    if value is None:
        monkeypatch.delenv(fla_dispatch.FLA_ENV, raising=False)
    else:
        monkeypatch.setenv(fla_dispatch.FLA_ENV, value)
    assert fla_dispatch.fla_enabled() is enabled
    monkeypatch.setenv(fla_dispatch.FLA_ENV, "0" if enabled else "1")
    assert fla_dispatch.fla_enabled() is enabled  # read once, then kept


def test_a_bad_switch_value_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(fla_dispatch, "_enabled", None)
    monkeypatch.setenv(fla_dispatch.FLA_ENV, " maybe")
    with pytest.raises(VariantError) as raised:
        fla_dispatch.fla_enabled()
    assert str(raised.value) == "$FWBENCH_FLA: got ' maybe'; expected 1 (on, the default) or 0 (off)"
