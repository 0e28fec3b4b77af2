"""torch.compile over the attention variants whose kernels are hand-written autograd functions.

Break-it pass X: 2c6aaa6 gave those functions a shared ``apply`` override (recording nothing inside
inference mode), which torch.compile cannot trace: every such variant raised torch's 8-line
'InternalTorchDynamoError: AsPythonConstantNotImplementedError: AutogradFunctionVariable() is not a constant',
with or without autocast, where 578b132 compiled them. Compiled, each call gives the eager call's gradient."""

from __future__ import annotations

import warnings

import pytest
import torch

from fwbench.variants import build_attention

# each reaches one hand-written function: _DPFP (nu=1 chunk), _DPFPQueryScores (nu=2 parallel), _FusedAttention,
# _FlushedScan, _DeltaWriteRead (the delta rule's fused write_read)
CASES = [("dpfp", "chunk"), ("dpfp:nu=2", "parallel"), ("softmax", "parallel"), ("linear-fwm", "recurrent"),
         ("dpfp-delta", "chunk")]


@pytest.mark.slow  # about 5 s a case: dynamo traces each call
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16 autocast"])
@pytest.mark.parametrize("spec, form", CASES)
def test_a_compiled_attention_call_gives_the_eager_gradients(spec, form, autocast):
    torch._dynamo.reset()
    attention = build_attention(spec, 4, form=form)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=generator).requires_grad_() for _ in range(3))
    beta = torch.rand(1, 2, 8, generator=generator)

    def loss(q, k, v):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if spec == "dpfp-delta":
                out = attention.write_read(k, v, q, beta)
            else:
                out = attention(q, k, v, beta)[0] if spec == "linear-fwm" else attention(q, k, v)[0]
            return (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's graph-break notes (data-dependent guards in the kernels)
        compiled = torch.autograd.grad(torch.compile(loss, backend="eager")(q, k, v), (q, k, v))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.slow
def test_a_compiled_call_under_cpu_autocast_initialises_a_lazy_module_in_phi():
    """Break-it pass AA: a φ holding nn.LazyBatchNorm1d, compiled, under bf16 autocast: dynamo's trace of the lazy
    module's first call, which builds φ's graph before the autocast node, diverged (torch's 200-line
    'SpeculationLogDivergence' / 'UserDefinedObjectVariable has no attribute proxy'). That step runs eagerly now,
    and the gradient is the uncompiled fp32 call's."""
    import torch.nn.functional as F

    from fwbench.variants import FastWeightAttention
    from fwbench.variants.feature_maps import FeatureMap

    class LazyBatchNormPhi(FeatureMap):
        name = "lazy-batchnorm-elu"

        def __init__(self, d_key: int):
            super().__init__(d_key)
            self.norm = torch.nn.LazyBatchNorm1d()

        @property
        def d_dot(self) -> int:
            return self.d_key

        def forward(self, x):
            return F.elu(self.norm(x.reshape(-1, x.shape[-1])).reshape(x.shape)) + 1

    def grad(compiled: bool, autocast: bool) -> torch.Tensor:
        torch._dynamo.reset()
        torch.manual_seed(0)
        attention = FastWeightAttention(LazyBatchNormPhi(4), rule="sum", form="chunk").train()
        call = torch.compile(attention, backend="eager") if compiled else attention
        generator = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(2, 2, 8, 4, generator=generator).requires_grad_() for _ in range(3))
        with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            warnings.simplefilter("ignore")
            call(q, k, v)[0].float().sum().backward()
        return q.grad

    torch.testing.assert_close(grad(compiled=True, autocast=True), grad(compiled=False, autocast=False),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # inductor compiles C++: about 20 s
def test_an_inductor_compiled_call_under_cpu_autocast_takes_a_plain_backward():
    """Break-it pass AD: with torch.compile's default backend (inductor), a plain ``loss.backward()`` under bf16
    autocast raised torch's 'This backward function was compiled with non-empty donated buffers which requires
    create_graph=False and retain_graph=False' for linear attention in the chunk form: the autocast node
    differentiated φ's graph with retain_graph=True in every backward. It keeps the graph only where a backward
    must (the caller's retains its own, or the graph reaches one made outside φ), and the gradient is the eager
    call's."""
    torch._dynamo.reset()
    attention = build_attention("linear", 4, form="chunk")
    q, k, v = (0.5 * torch.randn(2, 2, 8, 4, generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3))

    def grad(call) -> torch.Tensor:
        query = q.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            call(query, k, v)[0].float().square().sum().backward()
        return query.grad

    eager = grad(attention)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's graph-break notes
        compiled = grad(torch.compile(attention))
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
