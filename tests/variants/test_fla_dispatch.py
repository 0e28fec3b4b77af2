"""Specification of the CUDA path through fla's Triton kernels (``variants.kernels.fla_dispatch``).

On CPU (always run):
- the dispatch decision: which chunk-form calls go to fla and which stay with our kernels, each
  with its reason (switch, device, availability, dtype, d_dot, odd sizes in 16-bit, T = 0), and the
  ``FWBENCH_FLA=0`` switch read from the environment (a bad value: ``docs/bad_input.md`` row L64);
- the translation of our calls into fla's contract (layout (B, T, H, D), ``scale=1.0``, state
  S = Wᵀ, the sum rule's normaliser computed outside): fla's functions are replaced by stand-ins that
  implement fla-core 0.6.0's documented contract on top of fla's own pure-PyTorch references
  (``fla/ops/{simple_gla,delta_rule}/naive.py``, loaded from their files), so a transposed layout,
  fla's default scale d_key^−½ or a state in the wrong orientation shows up as a numeric mismatch
  against our chunk form — outputs, final states and gradients, in fp32 and bf16;
- the rules' chunk kernels go through the dispatch.

On CUDA with fla and triton installed (skipped elsewhere): fla's real kernels against our chunk
forms, forward and backward, in bf16 and (the sum rule, TF32 on) fp32; fp32 delta falls back.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import LOW_PRECISION_REL_RMSE, assert_close

from fwbench.variants.kernels import delta_rule_chunk, fla_dispatch, sum_rule_chunk
from fwbench.variants.rules import DELTA, SUM

TOL = 1e-5
B, H, D_DOT, D_V = 2, 3, 8, 6
BF16_TOL = LOW_PRECISION_REL_RMSE[torch.bfloat16]


def _fla_naive(folder: str):
    """fla's ``ops/<folder>/naive.py`` as a module (fla's package itself needs triton to import)."""
    pytest.importorskip("einops", reason="fla-core's reference kernels need einops")
    found = importlib.util.find_spec("fla")
    if found is None:
        pytest.skip("fla-core is not installed (pip install fla-core==0.6.0)")
    file = Path(next(iter(found.submodule_search_locations))) / "ops" / folder / "naive.py"
    loader = importlib.util.spec_from_file_location(f"fla_naive_{folder}_for_dispatch", file)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


class FlaStandIns:
    """fla-core 0.6.0's ``chunk_simple_gla`` and ``chunk_delta_rule`` contracts on CPU: (B, T, H, D)
    tensors, β (B, T, H), ``scale`` d_key^−½ when ``None``, state (B, H, K, V) fp32, outputs in the
    input dtype; the arithmetic is fla's own naive recurrences. ``allow_fp32_delta`` lifts fla's
    refusal of fp32 in the delta rule so that its translation can be checked at fp32 tolerance."""

    def __init__(self, allow_fp32_delta: bool = False):
        self.gla = _fla_naive("simple_gla")
        self.delta_naive = _fla_naive("delta_rule")
        self.allow_fp32_delta = allow_fp32_delta
        self.calls = {"sum": 0, "delta": 0}

    def kernels(self) -> fla_dispatch.FlaKernels:
        return fla_dispatch.FlaKernels(sum=self.sum, delta=self.delta)

    def sum(self, q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
            state_v_first=False, **kwargs):
        assert g is None and g_gamma is None and not state_v_first and "head_first" not in kwargs
        assert q.dtype == k.dtype == v.dtype, "fla's kernels take q, k and v in one dtype"
        Bq, T, Hq, K = q.shape
        assert k.shape == q.shape and v.shape[:3] == (Bq, T, Hq)
        if initial_state is not None:
            assert initial_state.shape == (Bq, Hq, K, v.shape[-1]) and initial_state.dtype == torch.float32
        self.calls["sum"] += 1
        no_gate = torch.zeros(Bq, T, Hq)
        return self.gla.naive_recurrent_simple_gla(q, k, v, no_gate, scale=scale, initial_state=initial_state,
                                                   output_final_state=output_final_state)

    def delta(self, q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, **kwargs):
        assert q.dtype == k.dtype == v.dtype and "head_first" not in kwargs and not use_qk_l2norm_in_kernel
        assert self.allow_fp32_delta or q.dtype != torch.float32, "fla's chunk_delta_rule rejects float32"
        Bq, T, Hq, K = q.shape
        assert k.shape == q.shape and beta.shape == (Bq, T, Hq) and v.shape[:3] == (Bq, T, Hq)
        if initial_state is not None:
            assert initial_state.shape == (Bq, Hq, K, v.shape[-1]) and initial_state.dtype == torch.float32
        self.calls["delta"] += 1
        scale = K ** -0.5 if scale is None else scale
        # the naive recurrence always scales q by K^−½: pre-scale in fp32 to apply ``scale`` instead
        head_first = [x.transpose(1, 2).float() for x in (q * 1.0, k, v, beta)]
        head_first[0] = head_first[0] * (scale * K ** 0.5)
        o, S = self.delta_naive.delta_rule_recurrence(*head_first, initial_state=initial_state,
                                                      output_final_state=output_final_state)
        # fla returns no final state unless asked (its naive recurrence only drops it for an exact False)
        return o.transpose(1, 2).to(q.dtype), S if output_final_state else None


@pytest.fixture
def on_cpu(monkeypatch):
    """Let the dispatch send CPU tensors to fla, with stand-ins for fla's kernels; returns them."""
    stand_ins = FlaStandIns()
    monkeypatch.setattr(fla_dispatch, "FLA_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(fla_dispatch, "load_fla_kernels", lambda: (stand_ins.kernels(), ""))
    monkeypatch.setattr(fla_dispatch, "_enabled", True)
    return stand_ins


def _features(*shape, dtype=torch.float32, sum_normalised=False):
    """φ-mapped inputs as the modules make them: elu+1 of Gaussians (> 0), optionally divided by their sum."""
    x = F.elu(torch.randn(*shape)) + 1.0
    if sum_normalised:
        x = x / x.sum(-1, keepdim=True)
    return x.to(dtype)


def _sum_inputs(T, dtype=torch.float32, carried=False, d_dot=D_DOT, d_v=D_V):
    q, k = _features(B, H, T, d_dot, dtype=dtype), _features(B, H, T, d_dot, dtype=dtype)
    v = torch.randn(B, H, T, d_v).to(dtype)
    W0 = torch.randn(B, H, d_v, d_dot) if carried else None
    z0 = _features(B, H, d_dot) if carried else None
    return q, k, v, W0, z0


def _delta_inputs(T, dtype=torch.float32, carried=False, d_dot=D_DOT, d_v=D_V):
    q = _features(B, H, T, d_dot, dtype=dtype, sum_normalised=True)
    k = _features(B, H, T, d_dot, dtype=dtype, sum_normalised=True)
    v = torch.randn(B, H, T, d_v).to(dtype)
    beta = torch.sigmoid(torch.randn(B, H, T)).to(dtype)
    W0 = torch.randn(B, H, d_v, d_dot) if carried else None
    return q, k, v, beta, W0


# --------------------------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------------------------


def _tensors(dtype=torch.float32, T=5, d_dot=D_DOT, d_v=D_V, phi_dtype=None):
    """q, k (φ, in ``phi_dtype``, default ``dtype``) and v (in ``dtype``), all ones."""
    q, k = (torch.ones(B, H, T, d_dot, dtype=phi_dtype or dtype) for _ in range(2))
    return q, k, torch.ones(B, H, T, d_v, dtype=dtype)


@pytest.mark.parametrize(("rule", "inputs", "tf32", "backend", "reason"), [
    ("sum", dict(dtype=torch.bfloat16), False, "fla", "chunk_simple_gla"),
    ("delta", dict(dtype=torch.bfloat16), False, "fla", "chunk_delta_rule"),
    ("delta", dict(dtype=torch.float16), False, "fla", "chunk_delta_rule"),
    ("sum", dict(dtype=torch.float64), True, "ours", "float64"),
    ("delta", dict(dtype=torch.float64), True, "ours", "float64"),
    ("delta", dict(dtype=torch.float32), True, "ours", "fp16/bf16 only"),
    ("sum", dict(dtype=torch.float32), False, "ours", "TF32"),
    ("sum", dict(dtype=torch.float32), True, "fla", "chunk_simple_gla"),
    ("delta", dict(dtype=torch.bfloat16, phi_dtype=torch.float32), False, "fla", "chunk_delta_rule"),
    ("sum", dict(dtype=torch.bfloat16, phi_dtype=torch.float32), False, "fla", "chunk_simple_gla"),
    ("sum", dict(dtype=torch.bfloat16, phi_dtype=torch.float16), False, "ours", "in v's dtype or fp32"),
    ("sum", dict(dtype=torch.float32, phi_dtype=torch.bfloat16), True, "ours", "in v's dtype or fp32"),
    ("delta", dict(dtype=torch.bfloat16, phi_dtype=torch.float64), False, "ours", "float64"),
    ("delta", dict(dtype=torch.bfloat16, d_dot=384), False, "ours", "d_dot 384 > 256"),
    ("sum", dict(dtype=torch.bfloat16, d_dot=384), False, "fla", "chunk_simple_gla"),
    ("delta", dict(dtype=torch.bfloat16, d_v=7), False, "ours", "even sizes"),
    ("sum", dict(dtype=torch.bfloat16, d_dot=9), False, "ours", "even sizes"),
    ("sum", dict(dtype=torch.float32, d_dot=9), True, "fla", "chunk_simple_gla"),
    ("delta", dict(dtype=torch.bfloat16, T=0), False, "ours", "T = 0"),
])
def test_decision_per_call(on_cpu, monkeypatch, rule, inputs, tf32, backend, reason):
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: tf32)
    decision = fla_dispatch.decide(rule, *_tensors(**inputs))
    assert (decision.backend, decision.uses_fla) == (backend, backend == "fla")
    assert reason in decision.reason


def test_decision_switched_off_stays_with_ours(on_cpu):
    fla_dispatch.set_fla_enabled(False)
    decision = fla_dispatch.decide("delta", *_tensors(torch.bfloat16))
    assert decision.backend == "ours" and "FWBENCH_FLA=0" in decision.reason
    fla_dispatch.set_fla_enabled(True)
    assert fla_dispatch.decide("delta", *_tensors(torch.bfloat16)).uses_fla


def test_decision_off_cuda_and_without_fla(monkeypatch):
    monkeypatch.setattr(fla_dispatch, "_enabled", True)
    decision = fla_dispatch.decide("sum", *_tensors(torch.bfloat16))
    assert decision.backend == "ours" and "on cpu" in decision.reason
    monkeypatch.setattr(fla_dispatch, "FLA_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(fla_dispatch, "load_fla_kernels", lambda: (None, "fla's Triton kernels cannot be imported (x)"))
    decision = fla_dispatch.decide("sum", *_tensors(torch.bfloat16))
    assert decision.backend == "ours" and "cannot be imported" in decision.reason


def test_fla_is_not_importable_without_triton_and_says_so():
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("triton is installed here")
    kernels, reason = fla_dispatch.load_fla_kernels()
    assert kernels is None and "cannot be imported" in reason and "fwbench[gpu]" in reason


@pytest.mark.slow
@pytest.mark.parametrize(("value", "enabled"), [("0", False), ("off", False), ("1", True), (None, True)])
def test_environment_switch_read_by_a_fresh_process(value, enabled):
    env = {name: val for name, val in os.environ.items() if name != fla_dispatch.FLA_ENV}
    if value is not None:
        env[fla_dispatch.FLA_ENV] = value
    code = "from fwbench.variants.kernels import fla_dispatch as f; print(f.fla_enabled())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(enabled)


# --------------------------------------------------------------------------------------------
# The translation into fla's contract, against our chunk forms
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("carried", [False, True], ids=["zero_state", "carried_state"])
@pytest.mark.parametrize("T", [1, 37, 64])
def test_sum_rule_fp32_through_fla_contract_matches_ours(on_cpu, monkeypatch, T, carried):
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: True)
    q, k, v, W0, z0 = _sum_inputs(T, carried=carried)
    y, W, z = fla_dispatch.sum_rule_chunk_dispatch(q, k, v, W0, z0)
    assert on_cpu.calls["sum"] == 1
    y_ref, W_ref, z_ref = sum_rule_chunk(q, k, v, W0, z0)
    assert_close(y, y_ref, TOL)
    assert_close(W, W_ref, TOL)
    assert_close(z, z_ref, TOL)
    assert W.dtype == z.dtype == torch.float32


def test_sum_rule_through_fla_contract_keeps_tiny_attention_mass_normalised(on_cpu, monkeypatch):
    """Queries of total mass ~1e-8 (FAVOR+ can give less): still normalised, as in our kernels (a
    floor, not an added eps, guards the division)."""
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: True)
    q, k, v, W0, z0 = _sum_inputs(40, carried=True)
    y, _, _ = fla_dispatch.sum_rule_chunk_dispatch(q * 1e-9, k, v, W0, z0)
    assert_close(y, sum_rule_chunk(q * 1e-9, k, v, W0, z0)[0], TOL)


@pytest.mark.parametrize("carried", [False, True], ids=["zero_state", "carried_state"])
@pytest.mark.parametrize("T", [1, 37, 64])
def test_delta_rule_fp32_through_fla_contract_matches_ours(T, carried):
    stand_ins = FlaStandIns(allow_fp32_delta=True)
    q, k, v, beta, W0 = _delta_inputs(T, carried=carried)
    y, W = fla_dispatch.fla_delta_rule_chunk(stand_ins.delta, q, k, v, beta, W0)
    y_ref, W_ref = delta_rule_chunk(q, k, v, beta, W0)
    assert_close(y, y_ref, TOL)
    assert_close(W, W_ref, TOL)


@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_bf16_through_fla_contract_matches_ours(on_cpu, rule):
    """bf16 inputs: the fla path against our chunk form on the same inputs, at bf16 tolerance."""
    if rule == "sum":
        q, k, v, W0, z0 = _sum_inputs(70, torch.bfloat16, carried=True)
        (y, W, z), (y_ref, W_ref, z_ref) = (fla_dispatch.sum_rule_chunk_dispatch(q, k, v, W0, z0),
                                            sum_rule_chunk(q, k, v, W0, z0))
        assert_close(z, z_ref, BF16_TOL)
        assert z.dtype == torch.float32
    else:
        q, k, v, beta, W0 = _delta_inputs(70, torch.bfloat16, carried=True)
        (y, W), (y_ref, W_ref) = (fla_dispatch.delta_rule_chunk_dispatch(q, k, v, beta, W0),
                                  delta_rule_chunk(q, k, v, beta, W0))
    assert on_cpu.calls[rule] == 1
    assert y.dtype == torch.bfloat16 and W.dtype == torch.float32
    assert_close(y.float(), y_ref.float(), BF16_TOL)
    assert_close(W, W_ref, BF16_TOL)


def test_sum_rule_through_fla_contract_sums_bf16_keys_in_fp32(on_cpu):
    """From the zero state the normaliser z is the keys' own sum: kept in fp32 (to fp32 rounding of
    our chunk form's), where a sum of 70 bf16 keys in bf16 would be off by ~1e-3."""
    q, k, v, _, _ = _sum_inputs(70, torch.bfloat16)
    y, _, z = fla_dispatch.sum_rule_chunk_dispatch(q, k, v)
    y_ref, _, z_ref = sum_rule_chunk(q, k, v)
    assert on_cpu.calls["sum"] == 1
    assert z.dtype == torch.float32
    assert_close(z, z_ref, TOL)
    assert_close(y.float(), y_ref.float(), BF16_TOL)


def test_sum_rule_through_fla_contract_reads_a_float64_carried_state_as_fp32(on_cpu, monkeypatch):
    """The contract gives fla an fp32 state and computes the normaliser in fp32: a float64 W0, z0 (a
    caller's; the modules keep the state in the compute dtype) gives, bit for bit, what the same state
    rounded to fp32 first gives, and W_T, z_T come back fp32."""
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: True)
    q, k, v, W0, z0 = _sum_inputs(20, carried=True)
    W0_64, z0_64 = W0.double() + 1e-12 * torch.randn_like(W0.double()), z0.double() * (1 + 1e-12)
    y, W, z = fla_dispatch.sum_rule_chunk_dispatch(q, k, v, W0_64, z0_64)
    y_32, W_32, z_32 = fla_dispatch.sum_rule_chunk_dispatch(q, k, v, W0_64.float(), z0_64.float())
    assert on_cpu.calls["sum"] == 2
    assert W.dtype == z.dtype == torch.float32
    assert torch.equal(y, y_32) and torch.equal(W, W_32) and torch.equal(z, z_32)


def test_sum_rule_through_fla_contract_without_normalisation_is_the_numerator(on_cpu):
    """``normalize=False``: y_t = W_t q_t, as our chunk form computes it."""
    q, k, v, W0, z0 = _sum_inputs(37, carried=True)
    y, W, z = fla_dispatch.fla_sum_rule_chunk(on_cpu.sum, q, k, v, W0, z0, normalize=False)
    y_ref, W_ref, z_ref = sum_rule_chunk(q, k, v, W0, z0, normalize=False)
    assert_close(y, y_ref, TOL)
    assert_close(W, W_ref, TOL)
    assert_close(z, z_ref, TOL)


def test_tf32_allowed_reads_torch_backends_flag():
    flag = torch.backends.cuda.matmul.allow_tf32
    try:
        for value in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = value
            assert fla_dispatch.tf32_allowed() is value
    finally:
        torch.backends.cuda.matmul.allow_tf32 = flag


def _gradients(fn, inputs):
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in inputs]
    outputs = [out for out in fn(*leaves) if out is not None]
    torch.manual_seed(123)  # the same cotangents on both sides (randn, not randn_like: it copies strides)
    loss = sum((out.float() * torch.randn(out.shape, device=out.device)).sum() for out in outputs)
    return torch.autograd.grad(loss, [x for x in leaves if x is not None])


def test_sum_rule_backward_through_fla_contract_matches_ours(on_cpu, monkeypatch):
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: True)
    inputs = _sum_inputs(45, carried=True)
    grads = _gradients(fla_dispatch.sum_rule_chunk_dispatch, inputs)
    assert on_cpu.calls["sum"] == 1
    for grad, grad_ref in zip(grads, _gradients(sum_rule_chunk, inputs), strict=True):
        assert_close(grad, grad_ref, TOL)


def test_delta_rule_backward_through_fla_contract_matches_ours():
    stand_ins = FlaStandIns(allow_fp32_delta=True)
    inputs = _delta_inputs(45, carried=True)
    grads = _gradients(lambda *x: fla_dispatch.fla_delta_rule_chunk(stand_ins.delta, *x), inputs)
    for grad, grad_ref in zip(grads, _gradients(delta_rule_chunk, inputs), strict=True):
        assert_close(grad, grad_ref, TOL)


def test_fallback_is_our_kernel_exactly(on_cpu):
    """fp32 delta falls back: the dispatch returns exactly our chunk form and never calls fla."""
    q, k, v, beta, W0 = _delta_inputs(33, carried=True)
    y, W = fla_dispatch.delta_rule_chunk_dispatch(q, k, v, beta, W0, chunk_size=16)
    y_ref, W_ref = delta_rule_chunk(q, k, v, beta, W0, chunk_size=16)
    assert on_cpu.calls["delta"] == 0
    assert torch.equal(y, y_ref) and torch.equal(W, W_ref)


@pytest.mark.parametrize("rule", [SUM, DELTA], ids=["sum", "delta"])
def test_rule_chunk_kernels_go_through_the_dispatch(on_cpu, rule):
    T = 20
    if rule is SUM:
        q, k, v, W0, z0 = _sum_inputs(T, torch.bfloat16, carried=True)
        beta = None
    else:
        q, k, v, beta, W0 = _delta_inputs(T, torch.bfloat16, carried=True)
        z0 = None
    rule.kernels["chunk"](q, k, v, beta, W0, z0, 32)
    assert on_cpu.calls[rule.name] == 1
    rule.kernels["chunk"](q.float(), k.float(), v.float(), None if beta is None else beta.float(), W0, z0, 32)
    assert on_cpu.calls[rule.name] == 1  # fp32: ours (TF32 is off here)


# --------------------------------------------------------------------------------------------
# On CUDA with fla's real kernels
# --------------------------------------------------------------------------------------------

needs_cuda_fla = pytest.mark.skipif(
    not torch.cuda.is_available() or fla_dispatch.load_fla_kernels()[0] is None,
    reason="needs a CUDA device and fla-core with triton (pip install fwbench[gpu])",
)


def _cuda(inputs, dtype, n_tokens):
    """The first ``n_tokens`` inputs (q, k, v and β) on CUDA in ``dtype``; the carried state in fp32."""
    return [None if x is None else x.to("cuda", dtype if i < n_tokens else torch.float32) for i, x in enumerate(inputs)]


@needs_cuda_fla
@pytest.mark.parametrize(("rule", "d_dot"), [("sum", 64), ("delta", 64), ("delta", 256), ("sum", 384)])
def test_cuda_fla_bf16_matches_ours_forward_and_backward(monkeypatch, rule, d_dot):
    """d_dot 64 (DPFP ν=1 at d_key 32), 256 (the delta kernel's widest), 384 (DPFP ν=3 at d_key 64)."""
    monkeypatch.setattr(fla_dispatch, "_enabled", True)
    torch.manual_seed(0)
    T, d_v = 300, 64
    if rule == "sum":
        inputs = _sum_inputs(T, carried=True, d_dot=d_dot, d_v=d_v)
        fla_fn, ours_fn = fla_dispatch.sum_rule_chunk_dispatch, sum_rule_chunk
    else:
        inputs = _delta_inputs(T, carried=True, d_dot=d_dot, d_v=d_v)
        fla_fn, ours_fn = fla_dispatch.delta_rule_chunk_dispatch, delta_rule_chunk
    inputs = _cuda(inputs, torch.bfloat16, 3 if rule == "sum" else 4)
    assert fla_dispatch.decide(rule, *inputs[:3]).uses_fla
    for out, ref in zip(fla_fn(*inputs), ours_fn(*inputs), strict=True):
        if ref is not None:
            assert_close(out.float(), ref.float(), BF16_TOL)
    for grad, grad_ref in zip(_gradients(fla_fn, inputs), _gradients(ours_fn, inputs), strict=True):
        assert_close(grad.float(), grad_ref.float(), BF16_TOL)


@needs_cuda_fla
def test_cuda_fla_fp32_sum_rule_with_tf32_matches_ours(monkeypatch):
    monkeypatch.setattr(fla_dispatch, "_enabled", True)
    monkeypatch.setattr(fla_dispatch, "tf32_allowed", lambda: True)
    torch.manual_seed(0)
    inputs = _cuda(_sum_inputs(300, carried=True, d_dot=64, d_v=64), torch.float32, 3)
    assert fla_dispatch.decide("sum", *inputs[:3]).uses_fla
    for out, ref in zip(fla_dispatch.sum_rule_chunk_dispatch(*inputs), sum_rule_chunk(*inputs), strict=True):
        assert_close(out, ref, 5e-3)  # TF32 products: a 10-bit mantissa
    for grad, grad_ref in zip(_gradients(fla_dispatch.sum_rule_chunk_dispatch, inputs),
                              _gradients(sum_rule_chunk, inputs), strict=True):
        assert_close(grad, grad_ref, 5e-3)


@needs_cuda_fla
def test_cuda_fp32_delta_rule_stays_with_ours(monkeypatch):
    monkeypatch.setattr(fla_dispatch, "_enabled", True)
    inputs = _cuda(_delta_inputs(100, carried=True, d_dot=64, d_v=64), torch.float32, 4)
    assert not fla_dispatch.decide("delta", *inputs[:3]).uses_fla
    for out, ref in zip(fla_dispatch.delta_rule_chunk_dispatch(*inputs), delta_rule_chunk(*inputs), strict=True):
        assert torch.equal(out, ref)


def _module_fla_and_ours(spec: str, device: str):
    """A bf16 module's outputs over two calls (the second continuing the first's state), once with
    the dispatch on and once off; φ comes from the feature map in fp32, v and β are bf16."""
    from fwbench import variants

    torch.manual_seed(0)
    attention = variants.build_attention(spec, d_key=16, form="chunk").eval().to(device)
    q, k, v = (torch.randn(B, H, 100, 16, device=device).to(torch.bfloat16) for _ in range(3))
    beta = torch.sigmoid(torch.randn(B, H, 100, device=device)).to(torch.bfloat16) if attention.uses_beta else None
    parts = [{"q": q[:, :, a:b], "k": k[:, :, a:b], "v": v[:, :, a:b],
              "beta": None if beta is None else beta[:, :, a:b]} for a, b in ((0, 70), (70, 100))]
    results = {}
    for backend in ("fla", "ours"):
        fla_dispatch.set_fla_enabled(backend == "fla")
        y1, state = attention(**parts[0])
        y2, _ = attention(**parts[1], state=state)
        results[backend] = torch.cat([y1, y2], dim=2).float()
    fla_dispatch.set_fla_enabled(True)
    return attention.update_rule.name, results


@pytest.mark.parametrize("spec", ["dpfp:nu=1", "dpfp-delta:nu=1"])
def test_attention_module_in_bf16_reaches_fla_and_agrees_with_ours(on_cpu, spec):
    """The whole module (φ in fp32, sum normalisation, carried state) in bf16 reaches fla's contract
    and agrees with our kernels."""
    rule, results = _module_fla_and_ours(spec, "cpu")
    assert on_cpu.calls[rule] == 2
    assert_close(results["fla"], results["ours"], BF16_TOL)


@needs_cuda_fla
@pytest.mark.parametrize("spec", ["dpfp:nu=1", "dpfp-delta:nu=1", "dpfp-delta:nu=3"])
def test_cuda_attention_module_in_bf16_with_fla_agrees_with_ours(monkeypatch, spec):
    monkeypatch.setattr(fla_dispatch, "_enabled", True)
    _, results = _module_fla_and_ours(spec, "cuda")
    assert_close(results["fla"], results["ours"], BF16_TOL)
