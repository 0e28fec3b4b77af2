"""Tests written for the survivors of the mutation pass over the autocast node (``run_in_fp32`` and
``_AutocastOff`` in variants/kernels/precision.py, and variants/kernels/module_state.py), 7 December 2026
(docs/mutation.md). Each checks a value against plain autograd (the same call without autocast) or a value that
the documentation promises."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.nn.functional as F

from fwbench.variants import FastWeightAttention, FeatureMap, build_attention
from fwbench.variants.kernels import delta_rule_write_read
from fwbench.variants.kernels.precision import run_in_fp32


class _ElementwisePhi(FeatureMap):
    """Base of the small learnable feature maps below: d_dot = d_key."""

    name = "probe-elu"

    @property
    def d_dot(self) -> int:
        return self.d_key


class _SpareLazyPhi(_ElementwisePhi):
    """elu + 1 of x times a learnable scale; holds a LazyLinear that its forward never calls."""

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.spare = torch.nn.LazyLinear(3)

    def forward(self, x):
        return F.elu(x * self.scale) + 1


class _DoubledScalePhi(_ElementwisePhi):
    """elu + 1 of x times a buffer made from a learnable scale in ``__init__`` (``scale * 2``, not a view)."""

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.register_buffer("twice", self.scale * 2)

    def forward(self, x):
        return F.elu(x * self.twice) + 1


class _ScaleOffsetPhi(_ElementwisePhi):
    """elu + 1 of x times a learnable scale, minus an offset held as a buffer."""

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.a = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.register_buffer("offset", torch.zeros(d_key))

    def forward(self, x):
        return F.elu(x * self.a - self.offset) + 1


class _OffsetPhi(_ElementwisePhi):
    """elu + 1 of x minus an offset held as a buffer; no parameter."""

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.register_buffer("offset", torch.zeros(d_key))

    def forward(self, x):
        return F.elu(x - self.offset) + 1


class _MakingPhi(_ElementwisePhi):
    """elu + 1 of a linear map that the first forward makes (its parameters are no input of the node: a warning)."""

    def forward(self, x):
        if not hasattr(self, "lin"):
            self.lin = torch.nn.Linear(self.d_key, self.d_key)
        return F.elu(self.lin(x)) + 1


def _queries(seed: int = 1) -> torch.Tensor:
    return 0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(seed))


def test_a_lazy_module_that_phi_does_not_call_is_named_in_no_warning_under_cpu_autocast():
    """A lazy module's parameters without values are no node input (module_state.lazy), and they are not a module
    that φ made either: ``unreached_parameters`` leaves them out, so the call warns of nothing (the mutant that
    asked ``lazy(None)`` named spare.weight and spare.bias), and the scale's gradient is plain autograd's."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_SpareLazyPhi(4), rule="sum", form="chunk")
        q = _queries()
        with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            warnings.simplefilter("error")
            attention(q, q, q)[0].float().square().sum().backward()
        return attention.feature_map.scale.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


def test_a_buffer_computed_from_a_parameter_in_init_passes_its_gradient_once_under_cpu_autocast():
    """A buffer made in ``__init__`` as ``scale * 2`` (its graph: a product whose second operand, the constant,
    has no node) is reached through the parameter, so it is no node input. The walk over its history skips the
    constant's empty slot and goes on to the parameter; one that stopped there took the buffer as an input too,
    and the scale's gradient came back twice plain autograd's."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_DoubledScalePhi(4), rule="sum", form="chunk")
        q = _queries()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            attention(q, q, q)[0].float().square().sum().backward()
        return attention.feature_map.scale.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


def test_a_made_buffer_beside_a_learnable_parameter_passes_its_gradient_under_cpu_autocast():
    """functional_call passing a buffer made from a tensor outside (``base * 2``) to a φ that also has a learnable
    parameter: the buffer's history reaches no node parameter, so it is an input and base gets plain autograd's
    gradient (the mutant that compared the history's nodes with ``id(None)`` took every node without a
    ``variable`` as a parameter's: the buffer was left out and base's gradient was None)."""

    def grads(autocast: bool) -> list[torch.Tensor | None]:
        attention = FastWeightAttention(_ScaleOffsetPhi(4), rule="sum", form="chunk")
        q = _queries()
        base = torch.linspace(0.5, 1.5, 4).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = torch.func.functional_call(attention, {"feature_map.offset": base * 2}, (q, q, q))[0]
            y.float().square().sum().backward()
        return [base.grad, attention.feature_map.a.grad]

    for got, wanted in zip(grads(True), grads(False), strict=True):
        assert got is not None and wanted is not None
        torch.testing.assert_close(got, wanted, rtol=1e-5, atol=1e-6)


def test_a_buffer_made_by_a_graph_that_reuses_its_steps_is_walked_once_per_node():
    """A made buffer whose graph reuses each step twice (24 steps of b = (b + b) / 2: 2^24 paths through 49 nodes):
    the walk over its history visits each node once and the call takes milliseconds; one that forgot the nodes it
    had seen walked every path (seconds at 2^16 paths already, doubling each step). base's gradient is plain
    autograd's."""

    def grad(autocast: bool) -> tuple[torch.Tensor, float]:
        attention = FastWeightAttention(_OffsetPhi(4), rule="sum", form="chunk")
        q = _queries()
        base = torch.linspace(-0.5, 0.5, 4).requires_grad_()
        b = base
        for _ in range(24):
            b = 0.5 * (b + b)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            torch.func.functional_call(attention, {"feature_map.offset": b}, (q, q, q))[0].float().square().sum().backward()
        return base.grad, time.perf_counter() - start

    got, seconds = grad(True)
    torch.testing.assert_close(got, grad(False)[0], rtol=1e-5, atol=1e-6)
    assert seconds < 5.0, f"the call took {seconds:.1f} s"


@pytest.mark.parametrize("first", ["x", "None"])
def test_run_in_fp32_without_a_module_differentiates_with_autocast_off(first):
    """``run_in_fp32`` called without ``module`` (its default) under CPU autocast, its first input x or ``None``
    (inputs may be None: the delta rule's z0): the forward and the backward run in fp32, so the gradients are plain
    autograd's (a mutant that read ``module.buffers()`` whatever the module, and one that read ``requires_grad``
    of a None input, raised AttributeError)."""

    def grads(autocast: bool) -> list[torch.Tensor]:
        x = torch.linspace(-1, 1, 8).reshape(2, 4).requires_grad_()
        w = torch.linspace(0.1, 0.9, 16).reshape(4, 4).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if first == "None":
                y, = run_in_fp32(lambda none, x: (x @ w,), None, x, params=[w])
            else:
                y, = run_in_fp32(lambda x: (x @ w,), x, params=[w])
            assert y.dtype == torch.float32
            y.square().sum().backward()
        return [x.grad, w.grad]

    for got, wanted in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(got, wanted, rtol=1e-6, atol=1e-6)


def _delta_inputs() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 4, generator=generator)
    k = F.normalize(torch.randn(1, 2, 9, 4, generator=generator), dim=-1)
    v = torch.randn(1, 2, 9, 4, generator=generator)
    beta = torch.rand(1, 2, 9, generator=generator)
    return q, k, v, beta


def test_the_delta_write_read_kernel_called_inside_cpu_autocast_computes_in_fp32():
    """``delta_rule_write_read`` (exported by variants.kernels) called directly inside a bf16 autocast block turns
    autocast off itself (``computed_in_fp32``): its output is the fp32 call's, bit for bit. With autocast left on,
    CPU's triangular solve refused the bf16 Gram matrix (NotImplementedError), and a block built without the
    device or with ``enabled=None`` raised."""
    q, k, v, beta = _delta_inputs()
    plain = delta_rule_write_read(q, k, v, beta, chunk_size=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = delta_rule_write_read(q, k, v, beta, chunk_size=4)
    assert got.dtype == torch.float32
    assert torch.equal(got, plain)


def test_the_delta_write_read_kernel_takes_meta_inputs_inside_cpu_autocast():
    """Meta tensors (shape inference) inside a CPU autocast block: autocast is off for the meta device, so the
    kernel adds no block of its own and answers with the output's shape and dtype (``torch.autocast("meta",
    enabled=False)``, which a mutant entered whatever the state, raised 'unsupported scalarType')."""
    q, k, v, beta = (t.to("meta") for t in _delta_inputs())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = delta_rule_write_read(q, k, v, beta, chunk_size=4)
    assert (y.device.type, tuple(y.shape), y.dtype) == ("meta", (1, 2, 5, 4), torch.float32)


class _PassesNoGradient(torch.autograd.Function):
    """The identity forward; its backward passes no gradient (a stop-gradient op of the caller's own)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def test_a_node_whose_outputs_get_no_gradient_passes_none_under_cpu_autocast():
    """The attention output read only through an op that passes no gradient back: the node's backward gets
    nothing to differentiate and passes nothing, so q's gradient is the other term's alone, as without autocast
    (a mutant's branch for that case raised TypeError)."""

    def grad(autocast: bool) -> torch.Tensor:
        attention = build_attention("linear", 4, form="chunk")
        q = _queries().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y, _ = attention(q, q, q)
            (_PassesNoGradient.apply(y).float().sum() + q.sum()).backward()
        return q.grad

    assert torch.equal(grad(True), grad(False))
    assert torch.equal(grad(True), torch.ones(1, 2, 8, 4))


def test_the_warning_for_parameters_phi_makes_names_the_attention_call():
    """The warning that parameters of a module φ makes get no gradient under autocast is attributed to the
    attention module's call of run_in_fp32 (variants/attention.py), two frames above where it is raised, not to
    precision.py or to torch's module machinery."""
    attention = FastWeightAttention(_MakingPhi(4), rule="sum", form="chunk")
    q = _queries().requires_grad_()
    with warnings.catch_warnings(record=True) as caught, torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        attention(q, q, q)
    ours = [w for w in caught if "fwbench: under autocast" in str(w.message)]
    assert len(ours) == 1
    assert ours[0].filename.replace("\\", "/").endswith("variants/attention.py"), ours[0].filename


def test_a_buffer_made_from_a_made_parameter_passes_its_gradient_under_cpu_autocast():
    """Mutation pass of 7 December 2026 (_made_buffers_as_params 4) found it: a buffer that functional_call passes
    made from a made parameter (a = base * 1 for the parameter, a * 2 for the buffer) was left out of the node's
    inputs as 'reached through the parameter', but φ reads the parameter as a cut leaf, so the buffer's path was
    lost (base's gradient [1.82, -0.31, 0.09, -0.01] against plain autograd's [0.67, 0.82, 0.02, 0.07])."""
    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_ScaleOffsetPhi(4), rule="sum", form="chunk")
        q = _queries()
        base = torch.linspace(0.5, 1.5, 4).requires_grad_()
        a = base * 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            given = {"feature_map.a": a, "feature_map.offset": a * 2}
            torch.func.functional_call(attention, given, (q, q, q))[0].float().square().sum().backward()
        return base.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # inductor compiles C++: about 10 s with a warm cache, 20 s cold
def test_an_inductor_compiled_call_refuses_a_retained_backward_under_cpu_autocast_as_without_it():
    """A backward that keeps its graph (``retain_graph=True``) through a call compiled by inductor with donated
    buffers: torch refuses it with its 'donated buffers' error at the first backward, and the autocast node passes
    that error on (its retry without keeping the graph is for backwards that keep nothing). Two mutants retried here
    too: the first backward went through and the second raised 'Trying to backward through the graph a second
    time', which names the wrong cause.

    Whether torch refuses depends on how inductor compiled the call (in the full suite, after other compiled tests,
    the plain call took both backwards): the autocast call must do what the plain one does, error or not."""
    torch._dynamo.reset()
    attention = build_attention("linear", 4, form="chunk")
    q, k, v = (0.5 * torch.randn(2, 2, 8, 4, generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3))
    outcomes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's graph-break notes
        compiled = torch.compile(attention)
        for autocast in False, True:
            query = q.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = compiled(query, k, v)[0].float().square().sum()
            outcome = "refused at the first backward"
            try:
                loss.backward(retain_graph=True)
                outcome = "refused at the second backward"
                loss.backward()
                outcome = "both went through"
            except RuntimeError as exc:
                outcome += f": {str(exc).splitlines()[0][:60]}"
            outcomes.append(outcome)
    assert outcomes[1] == outcomes[0]


class _ScaleOffsetSpareLazyPhi(_ScaleOffsetPhi):
    """_ScaleOffsetPhi beside a LazyLinear that the forward never calls: every call takes the lazy path, where made
    parameters are not cut."""

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.spare = torch.nn.LazyLinear(3)


def test_a_buffer_made_from_a_made_parameter_on_the_lazy_path_passes_its_gradient_once_under_cpu_autocast():
    """The lazy path does not cut made parameters, so φ's graph reaches ``a`` through the buffer ``a * 2`` and the
    buffer must stay out of the node's inputs there: as an input too, its path was counted twice (the fix of
    ``_made_buffers_as_params`` 4 must tell the two paths apart; checked by emptying ``made_edges``)."""
    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_ScaleOffsetSpareLazyPhi(4), rule="sum", form="chunk")
        q = _queries()
        base = torch.linspace(0.5, 1.5, 4).requires_grad_()
        a = base * 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the lazy module's 'under development' note
            given = {"feature_map.a": a, "feature_map.offset": a * 2}
            torch.func.functional_call(attention, given, (q, q, q))[0].float().square().sum().backward()
        return base.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)


class _TwoOffsetsPhi(_ElementwisePhi):
    """elu + 1 of x times a learnable scale, minus two offsets held as buffers."""

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.a = torch.nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.register_buffer("o1", torch.zeros(d_key))
        self.register_buffer("o2", torch.zeros(d_key))

    def forward(self, x):
        return F.elu(x * self.a - self.o1 - self.o2) + 1


def _chain(base):
    o1 = base * 2
    return {"feature_map.o1": o1, "feature_map.o2": o1 * 3}


def _unbound(base):
    o1, o2 = torch.stack([base * 2, base * 3]).unbind(0)
    return {"feature_map.o1": o1, "feature_map.o2": o2}


def _views(base):
    made = base * 2
    return {"feature_map.o1": made.view(4), "feature_map.o2": made.view(2, 2).reshape(4)}


def _from_a_sibling_output(base):
    o1, other = torch.stack([base * 2, base * 3]).unbind(0)
    return {"feature_map.o1": o1, "feature_map.o2": other * 5}


def _from_a_split_sibling(base):
    o1, other = torch.cat([base * 2, base * 3]).split(4)
    return {"feature_map.o1": o1, "feature_map.o2": other.view(2, 2).reshape(4)}


def _chain_from_a_made_parameter(base):
    a = base * 1
    o1 = a * 2
    return {"feature_map.a": a, "feature_map.o1": o1, "feature_map.o2": o1 * 3}


@pytest.mark.parametrize("given", [_chain, _unbound, _views, _from_a_sibling_output, _from_a_split_sibling,
                                   _chain_from_a_made_parameter])
def test_buffers_made_from_one_another_pass_their_gradient_once_under_cpu_autocast(given):
    """Break-it pass AI: functional_call passing o1 = base * 2 and o2 = o1 * 3 made both node inputs, and φ's graph
    reached o1 through o2 as well, so the o2 → o1 path counted twice (base's gradient 7/4 of plain autograd's; with
    a made parameter a and o1 = a * 2, o2 = o1 * 3, [2.067, 0.303, …] against [2.202, 0.168, …]). Two outputs of one
    op (unbind) and two views of one made tensor must each stay inputs, and so must one made from another output of
    the op that made o1 (break-it pass AJ: a test by node dropped it, 0.12x plain autograd's gradient)."""
    def grad(autocast: bool) -> torch.Tensor:
        attention = FastWeightAttention(_TwoOffsetsPhi(4), rule="sum", form="chunk")
        q = _queries()
        base = torch.linspace(0.5, 1.5, 4).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            torch.func.functional_call(attention, given(base), (q, q, q))[0].float().square().sum().backward()
        return base.grad

    torch.testing.assert_close(grad(True), grad(False), rtol=1e-5, atol=1e-6)
