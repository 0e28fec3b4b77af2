"""The dtype every kernel computes in, and the product that keeps NaN/inf causal.

Kernels compute in the wider of their inputs' dtype and fp32 (:func:`compute_dtype`): fp16, bf16
and fp32 inputs run in fp32 (a low-precision running sum of ~1-sized terms stops growing at 256 in
bf16), float64 inputs run in float64, so that ``torch.autograd.gradcheck`` and a float64 reference
see the kernels' true arithmetic. The carried state is kept in the same compute dtype.

A masked product ``tril(A) @ X`` multiplies the rows of later tokens by exact zeros; 0·NaN = NaN,
so one NaN token would turn every earlier output of its chunk NaN. :func:`causal_matmul` and
:func:`masked_matmul` keep non-finite entries out of the product and mark the outputs that may
read them instead.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor

from . import module_state


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """float64 if any given tensor is float64, else fp32 (``None`` entries are skipped)."""
    wide = any(x is not None and x.dtype == torch.float64 for x in tensors)
    return torch.float64 if wide else torch.float32


# torch's own check of every device's autocast state (torch.amp uses it); a torch without it takes the full check
_any_autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)
_COVERED_BY_ANY = frozenset({"cpu", "cuda"})  # the devices whose autocast state that check reads (torch 2.13)


def autocast_on(x: Tensor) -> bool:
    """Whether autocast is on for ``x``'s device (``False`` where the device has none, as meta)."""
    device = x.device.type
    # a tenth of the full check's cost, on every call of every kernel; torch's any-device check leaves out MPS
    if device in _COVERED_BY_ANY and not _any_autocast_enabled():
        return False
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def computed_in_fp32(x: Tensor) -> AbstractContextManager:
    """Autocast off while it is on for ``x``'s device, else nothing: fast weights are computed in
    :func:`compute_dtype`, and autocast would run their matmuls in bf16/fp16. This reaches the forward
    only; :func:`run_in_fp32` turns it off for the backward too. There the sum-normalised
    read's gradient, a difference of near-equal terms over a small mass zᵀφ(q), lost every digit
    (DPFP's query gradient 100 % off the fp32 run's), and CPU's solve_triangular refuses bf16.
    Neither reaches the backward of a forward run outside the block (or in an inner
    ``torch.autocast(..., enabled=False)``) that is called inside it: call ``backward()`` outside the
    autocast block, as PyTorch's AMP recipe does."""
    return torch.autocast(x.device.type, enabled=False) if autocast_on(x) else nullcontext()


def _functorch_transform_active() -> bool:
    """Whether a torch.func transform (grad, vjp, jacrev, vmap, jvp) is running this call."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def run_in_fp32(fn: Callable[..., Sequence[Tensor | None]], *inputs: Tensor | None,
                params: Iterable[Tensor] = (), module: torch.nn.Module | None = None) -> tuple[Tensor | None, ...]:
    """``fn(*inputs)`` (a sequence of tensors or ``None``) with autocast off for the inputs' device in its
    forward *and* its backward, where autocast is on; else ``fn(*inputs)`` itself, untouched.

    :func:`computed_in_fp32` alone reaches the forward only: the autograd engine runs every backward
    node under the autocast state of the thread that calls ``backward()``, so a backward inside the
    ``torch.autocast`` block ran the backward matmuls of φ, of the normaliser and of every op outside a
    hand-written kernel in bf16/fp16 (DPFP's query gradient 67 % off the same step's with the backward
    outside the block, chunk form; 9-33 % in the others), finite and without a warning. Where autograd
    records, ``fn``'s graph is therefore built inside one :class:`_AutocastOff` node, whose backward
    differentiates it with autocast off. ``params``: tensors ``fn`` reads besides ``inputs`` (a
    learnable φ's parameters: the attention module passes all of its own, its feature map's among them),
    which get their gradients through the same node. ``module``: the module ``fn`` calls; its buffers that require a
    gradient (``torch.func.functional_call`` can pass such) count as ``params`` too. The node builds ``fn``'s graph
    once and keeps it for every backward (:class:`_AutocastOff`), so ``fn`` runs once a forward, as without autocast:
    whatever φ's forward changes (BatchNorm's running statistics, spectral_norm's vectors, a buffer or submodule it
    makes, a counter, a parameter it changes in place under ``no_grad``) moves once, and a stochastic φ is
    differentiated on the sample its outputs came from, whatever generator it draws from.

    Limitation: a tensor that ``fn`` reads but that is neither in ``inputs`` nor in ``params`` (a plain tensor
    with ``requires_grad=True`` held in an attribute or a closure, not registered as an ``nn.Parameter``, or the
    parameter of a module that ``fn`` itself makes, which warns) is not found, and gets no gradient (``None``) from a
    backward under autocast; it does without autocast. A learnable φ must register such tensors as ``nn.Parameter``
    in its ``__init__`` (constants as buffers, which need no gradient). An input changed in place after the forward
    is refused where one of ``fn``'s ops saved it, as plain autograd refuses it, and always in a ``create_graph=True``
    backward, which reads the saved inputs (torch's 'modified by an inplace operation').

    Not covered: a forward run without autocast (outside the block, or in an inner
    ``torch.autocast(..., enabled=False)``) whose backward is called inside a bf16/fp16 block. That call
    takes the plain path, free of this node's cost and bit for bit the run without autocast, so its
    backward runs under the caller's autocast (DPFP's gradients 8 % off the fp32 run's): call
    ``backward()`` outside the autocast block, as PyTorch's AMP recipe does. Nor a torch.func transform
    (``torch.func.grad``, ``vjp``, ``jacrev``) called inside the block: it takes the same plain path (an
    autograd function needs a ``setup_context`` these transforms accept), so its gradients are computed
    under the block's autocast (linear's 0.3 % off the fp32 run's).

    Also not covered under autocast (break-it passes AD, AE and AF; each differs from plain autograd): a hook
    registered on a parameter φ reads (``p.register_hook``) runs twice a backward, once for the node's own
    gradient and once at the parameter (a hook that doubles a gradient quadruples it;
    ``torch.autograd.graph.register_multi_grad_hook`` fires twice with ``mode="any"`` and raises torch's 'A leaf
    node was passed to _will_engine_execute_node' with ``mode="all"``); a tensor φ reads that was made from a
    parameter outside the call and carried across steps without being detached (plain autograd refuses the
    second step) is differentiated back through every step, at a cost that grows with them; inductor
    (``torch.compile``'s default backend) compiling a call whose φ reads a tensor made outside it inside the
    compiled function raises torch's 'An intermediate tensor ... aliases an input or output'; a tensor φ keeps
    from its forward and the caller reads afterwards (an output stashed in an attribute for an auxiliary loss, the
    weight the old ``torch.nn.utils.weight_norm`` leaves on the module) belongs to φ's graph, which the node
    differentiates on its own: a backward through both raises 'Trying to backward through the graph a second
    time', and under ``functional_call`` with a made parameter the stash holds the detached leaf φ read (its
    gradient lost), and a recorded in-place op φ applies to it raises torch's 'a leaf Variable that requires grad
    is being used in an in-place operation'; a buffer made from a parameter and from another tensor too
    (``functional_call`` passing ``base * weight``) gets the parameter's part only, and likewise one made from
    another passed buffer and another tensor (``o2 = o1 * base``) the other buffer's part; a buffer that requires a
    gradient and that φ registers in its forward gets none;
    made parameters are not cut on a lazy module's first call (two made from one another then
    count twice, as before the cut); and under ``parametrize.cached()`` a made ``original`` read through the
    cached weight by two calls gets the first call's gradient only. A backward that
    does not keep the graph lets the node's whole graph go, so a second one through another output (``y.sum().backward()``, then
    ``state.W.sum().backward()``) raises 'Trying to backward through the graph a second time' where plain
    autograd may answer; forward-mode AD (``torch.autograd.forward_ad``) and ``is_grads_batched=True`` with
    ``create_graph=True`` raise torch's 'You must implement the jvp function' / 'Batching rule not
    implemented'; and under ``torch.utils.checkpoint(..., use_reentrant=False)`` a backward recomputes the
    checkpointed forward twice where plain autograd recomputes it once: φ's graph is differentiated in a nested
    backward, which the checkpoint serves with a recomputation of its own, beside the caller's (for its other
    ops, a projection in the region, or the saved inputs a ``create_graph=True`` backward reads). It costs one
    more forward of the region, and a φ with state moves it once more (a counter 6 against 4, BatchNorm's
    count likewise): a checkpointed forward must not change state, as torch's checkpoint asks.

    Shapes and dtypes are ``fn``'s; raises what ``fn`` raises."""
    x = next(t for t in inputs if t is not None)
    if not autocast_on(x):
        return tuple(fn(*inputs))
    with torch.autocast(x.device.type, enabled=False):
        params = [p for p in params if p.requires_grad]
        # its buffers that require a gradient (none in the built-in variants): leaves, and made ones
        # (_made_buffers_as_params); inline: dynamo could not hand a lazy module's buffers to a function ('proxy')
        buffers = [] if module is None else [b for b in module.buffers() if b.requires_grad]
        if buffers:
            # one input a tensor: held as a parameter and a buffer too (or passed so by functional_call), it got
            # each of its gradients twice
            given = {id(p) for p in params}
            buffers = [b for b in buffers if id(b) not in given]
            made = [b for b in buffers if not b.is_leaf]
            params += [b for b in buffers if b.is_leaf]
            if made:
                # a lazy module's first call is not cut (_apply): its made parameters are the node's inputs as they are
                cut = set() if any(module_state.lazy(t) for t in params) else _made_params_in_slots(module, params)
                params += _made_buffers_as_params(made, params, cut)
        recorded = any(t is not None and t.requires_grad for t in (*inputs, *params))
        # inference_mode records nothing, also under a nested enable_grad(), and its tensors cannot be saved;
        # torch.func's transforms (grad, vjp, jacrev) refuse an autograd function without setup_context in one
        # torch message of many lines, where fn's plain ops answer (linear, FAVOR+): there the forward alone
        # runs with autocast off, as computed_in_fp32
        if (not torch.is_grad_enabled() or torch.is_inference_mode_enabled() or not recorded
                or _functorch_transform_active()):
            return tuple(fn(*inputs))
        return _apply(fn, len(inputs), x.device.type, (*inputs, *params), module)


def _made_buffers_as_params(made: Sequence[Tensor], params: Sequence[Tensor], cut: set[int] = frozenset()
                            ) -> list[Tensor]:
    """Of the buffers ``made`` by a graph (``functional_call`` passing ``base * 2``, or a tensor made from the
    inputs), those the node takes as inputs: the ones whose history does not reach ``params``. One whose history
    reaches them (a view of a parameter, registered in ``__init__``) is left out: φ's graph reaches the parameter
    through it, and as an input too it was counted twice (2.0x); left out of the inputs too, a made buffer's
    gradient was lost (FAVOR+'s ω passed made: 0.5 of plain autograd's, q's gradient 80 % off with a buffer made
    from q). A made parameter whose id is in ``cut`` (:func:`_made_params_in_slots`) is read by φ as a leaf of its
    own, so a buffer made from it does not reach it in φ's graph and is an input (``a = base * 1`` for a parameter
    and ``a * 2`` for a buffer: base's gradient was the parameter path's alone). None is swapped out of its slot (a
    second thread calling the module would see the swap)."""
    targets = {id(p) for p in params}
    made_edges = {_edge(p) for p in params if p.grad_fn is not None and id(p) not in cut}
    kept = [b for b in made if not _history_reaches(b, targets, made_edges)]
    # one made from another kept (o2 = o1 * 3) is reached through it, as a view of a parameter is: as an input too,
    # its path to o1 was counted twice (7/4 of plain autograd's gradient, break-it pass AI). Outputs are told apart
    # by their edge, not their node: one made from unbind's second output does not reach its first (a node test
    # dropped it, and its gradient: 0.12x plain autograd's, break-it pass AJ).
    edges = {_edge(b) for b in kept}
    return [b for b in kept if not _history_reaches(b, set(), edges - {_edge(b)})]


def _made_params_in_slots(module: torch.nn.Module | None, params: Sequence[Tensor | None]) -> set[int]:
    """Ids of the ``params`` made by a graph that sit in a parameter slot of ``module`` or of a module in it:
    those :func:`_cut_at_made_params` swaps for leaves of their own during φ's forward."""
    made = {id(p) for p in params if p is not None and p.grad_fn is not None}
    if module is None or not made:
        return set()
    return {id(value) for owner in module.modules() for value in owner._parameters.values() if id(value) in made}


def _edge(t: Tensor) -> tuple:
    """The autograd edge that made ``t``: its node and which of the node's outputs ``t`` is."""
    return t.grad_fn, t.output_nr


def _history_reaches(t: Tensor, targets: set[int], made_edges: set) -> bool:
    """Whether the graph that made ``t`` reaches a leaf whose id is in ``targets`` or an edge (node, output) in
    ``made_edges``: of a multi-output node (unbind, split), only the outputs whose edges lead there."""
    if _edge(t) in made_edges:
        return True
    stack, seen = [t.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if id(getattr(node, "variable", None)) in targets:
            return True
        for edge in node.next_functions:
            if edge in made_edges:
                return True
            stack.append(edge[0])
    return False


# whether the backward running now keeps the graph (retain_graph=True, or create_graph=True by default): torch's own
# check (AOTAutograd reads it); a torch without it keeps every graph until its node dies, as a retained one is kept
_graph_kept = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)
Graph = tuple[list, list[Tensor]]  # (one leaf per tensor of a node, or None; the outputs built from those leaves)


def _apply(fn: Callable[..., Sequence[Tensor | None]], n_inputs: int, device: str,
           tensors: Sequence[Tensor | None], module: torch.nn.Module | None = None) -> tuple[Tensor | None, ...]:
    """``fn(*tensors[:n_inputs])`` through one :class:`_AutocastOff` node (``tensors[n_inputs:]``: the
    params ``fn`` reads), ``None`` outputs kept in place."""
    missing: list[bool] = []

    def present(*args: Tensor | None) -> tuple[Tensor, ...]:
        # an autograd function returns tensors only: a None output (the delta rule's z) is left out
        outputs = tuple(fn(*args))
        missing[:] = [out is None for out in outputs]
        return tuple(out for out in outputs if out is not None)

    if any(module_state.lazy(t) for t in tensors[n_inputs:]):
        # a lazy module's first call (nn.LazyBatchNorm1d in φ): its parameters get their shapes in fn, and a node
        # made before that holds their gradient accumulators at shape [0] (torch's 'invalid gradient ... expected
        # shape compatible with [0]' in the backward), so fn's graph is built first and the node takes it; a lazy
        # module that fn does not call keeps parameters without values, which fn cannot have read
        tensors, graph = _built_first(present, n_inputs, tensors)
        found = _AutocastOff.apply(lambda tensors, needs_grad: graph, device, False, *tensors)
    else:
        # a partial, not a lambda: module as a closure cell of this function made dynamo fail ('has no attribute
        # proxy') where it hands the lazy branch's tensors to the uncompiled _built_first
        found = _AutocastOff.apply(functools.partial(_graph, present, n_inputs, module=module), device, False, *tensors)
    if unreached := module_state.unreached_parameters(module, tensors):
        warnings.warn(f"fwbench: under autocast, the parameters {', '.join(unreached)}, of a module that the "
                      "feature map's forward made or attached, get no gradient from this call (plain autograd "
                      "gives them one): make the module in the feature map's __init__", stacklevel=3)
    outputs = iter(found)
    return tuple(None if gone else next(outputs) for gone in missing)


def _graph(fn: Callable[..., Sequence[Tensor]], n_inputs: int, tensors: Sequence[Tensor | None],
           needs_grad: Sequence[bool], module: torch.nn.Module | None = None) -> Graph:
    """``fn``'s graph, built with autocast off (the caller's block): its leaves are the inputs detached (a gradient
    wanted where ``needs_grad`` says) and the params as they are, so it reaches a graph that made a param (a weight
    that ``parametrize`` computed). A param that is itself made by a graph (``functional_call`` passing ``w - lr *
    g``, MAML's adapted weight) is read by ``fn`` as a leaf of its own in ``module`` (:func:`_cut_at_made_params`):
    its history is the caller's graph's, which the node's gradient for it goes on through; differentiated here too,
    it was counted twice where it reached another param (a bias gradient 5 % off), or freed for the caller's."""
    inputs = [None if t is None else t.detach().requires_grad_(need)
              for t, need in zip(tensors[:n_inputs], needs_grad)]
    params = list(tensors[n_inputs:])
    with torch.enable_grad(), _cut_at_made_params(module, params) as cut:
        outputs = list(fn(*inputs))
    return [*inputs, *(cut.get(id(p), p) for p in params)], outputs


@contextmanager
def _cut_at_made_params(module: torch.nn.Module | None, params: Sequence[Tensor | None]) -> Iterator[dict]:
    """Within the block, every parameter slot of ``module`` that holds one of ``params`` made by a graph (a tensor
    ``functional_call`` passed for a parameter), and every buffer slot it tied to one, holds a detached leaf of it
    instead, one per tensor; yields {id of the param: its leaf}. Each slot gets its tensor back afterwards, unless
    the block put something else there. A made buffer of its own is not swapped (the node's gradient stops at it,
    :func:`_made_buffers_as_params`), nor is any slot of a module that ``functional_call`` did not fill: a swap is
    seen by every thread that calls the module meanwhile (a buffer viewing a parameter, swapped in fdbb213, lost a
    second thread's gradient)."""
    cut: dict[int, Tensor] = {}
    swapped: list[tuple[dict, str, Tensor, Tensor]] = []
    if in_parameters := _made_params_in_slots(module, params):
        for owner in module.modules():
            for slots in (owner._parameters, owner._buffers):
                for name, value in list(slots.items()):
                    if value is not None and id(value) in in_parameters:
                        leaf = cut.setdefault(id(value), value.detach().requires_grad_(value.requires_grad))
                        slots[name] = leaf
                        swapped.append((slots, name, value, leaf))
    try:
        yield cut
    finally:
        for slots, name, value, leaf in swapped:
            if slots.get(name) is leaf:
                slots[name] = value


@torch.compiler.disable  # dynamo's trace of a lazy module's initialisation diverged ('SpeculationLogDivergence')
def _built_first(fn: Callable[..., Sequence[Tensor]], n_inputs: int, tensors: Sequence[Tensor | None]
                 ) -> tuple[list[Tensor | None], Graph]:
    """``fn``'s graph built before its node (:func:`_graph`), and the tensors for the node: the parameters still
    without values left out (those of a lazy module that ``fn`` does not call)."""
    needs_grad = [t is not None and t.requires_grad for t in tensors[:n_inputs]]
    leaves, outputs = _graph(fn, n_inputs, tensors, needs_grad)
    kept = [i for i, t in enumerate(tensors) if i < n_inputs or not module_state.lazy(t)]
    return [tensors[i] for i in kept], ([leaves[i] for i in kept], outputs)


class _AutocastOff(torch.autograd.Function):
    """:func:`run_in_fp32`'s node: a graph built with autocast off (``build(tensors, needs_grad)``: its leaves, one
    per tensor of the node, and its outputs; :func:`_graph` builds ``fn``'s), kept in ``ctx`` and differentiated by
    ``backward`` with autocast off. The graph is kept for as long as the backward keeps the node's
    (``retain_graph=True``, ``create_graph=True``), so a second backward differentiates the same graph, and let go
    with it otherwise. Under ``create_graph=True`` the backward's vector-Jacobian product is built from that graph
    too, as a graph of its leaves and of the incoming gradients, and goes through another such node, so the
    second-order graph's backward runs with autocast off too, and so on for every order: recorded under the
    caller's autocast, a gradient penalty's second derivatives were bf16 (linear-fwm's 460 % off the fp32 run's).
    ``fn`` runs once a forward, as under plain autograd: its module's state (BatchNorm's statistics, a buffer it
    registers) moves once, and its random numbers (dropout) are drawn once. It ran again for a second backward and
    for a ``create_graph`` backward before, which had to find the forward's module state and random generators
    (two hundred lines that break-it passes kept finding exceptions to: a φ's Python attributes, parameters changed
    in place, an attached module's earlier values)."""

    @staticmethod
    def forward(ctx, build, device, shared, *tensors):
        """``shared``: the graph may be differentiated by another node too (a vector-Jacobian product's reaches its
        first-order graph), so every backward keeps it (``retain_graph``) while ``ctx`` holds it."""
        ctx.device, ctx.shared = device, shared
        ctx.set_materialize_grads(False)  # an unused output (the state W, often) adds no backward through fn
        ctx.graph = build(tensors, ctx.needs_input_grad[3:])
        # for a create_graph backward only, which needs the tensors that require a gradient (connected to the
        # caller's graph); one that needs none is not saved: made under inference_mode, it cannot be
        ctx.save_for_backward(*(t if t is not None and t.requires_grad else None for t in tensors))
        outputs = tuple(out.detach() for out in ctx.graph[1])
        # an output that fn made from nothing that requires a gradient (the state W with q alone learnable) does
        # not require one, as without autocast (it did, so a carried state chained the steps' graphs)
        ctx.mark_non_differentiable(*(out for out, made in zip(outputs, ctx.graph[1]) if not made.requires_grad))
        return outputs

    @staticmethod
    def _grads(leaves: list, outputs: Sequence[Tensor], grads: Sequence[Tensor | None], wanted: Sequence[bool],
               create_graph: bool, retain_graph: bool) -> tuple[Tensor | None, ...]:
        """The gradient of Σ⟨grads, outputs⟩ for every leaf that is ``wanted`` and requires one (else ``None``)."""
        asked = [t if want and t is not None and t.requires_grad else None for t, want in zip(leaves, wanted)]
        inputs = [t for t in asked if t is not None]
        pairs = [(out, grad) for out, grad in zip(outputs, grads, strict=True)
                 if grad is not None and out.requires_grad]
        if not inputs or not pairs:
            return (None,) * len(leaves)
        found = iter(torch.autograd.grad([out for out, _ in pairs], inputs, [grad for _, grad in pairs],
                                         create_graph=create_graph, retain_graph=retain_graph, allow_unused=True))
        return tuple(None if t is None else next(found) for t in asked)

    @staticmethod
    def _first_order(ctx, leaves: list, outputs: Sequence[Tensor], grads: Sequence[Tensor | None],
                     wanted: Sequence[bool]) -> tuple[Tensor | None, ...]:
        """A first-order backward's gradients. The graph is kept through it (``retain_graph``): a later backward may
        need it (the caller's keeps its own graph, or a vector-Jacobian node was built from it), and it may reach a
        graph made outside fn (a weight that ``parametrize.cached()`` computed once for two attention calls, or a
        tensor φ reads that was made from a parameter), which the caller's one backward runs through once per call
        here: freed, the second call raised 'Trying to backward through the graph a second time'. It is let go with
        ``ctx.graph``. A graph that ``torch.compile`` (inductor) compiled with donated buffers refuses to be kept
        ('... requires create_graph=False and retain_graph=False'): where neither the caller nor another node needs
        it again, it is then differentiated once more without being kept, which plain ``torch.compile`` does."""
        try:
            return _AutocastOff._grads(leaves, outputs, grads, wanted, create_graph=False, retain_graph=True)
        except RuntimeError as error:
            if "donated buffers" not in str(error) or _graph_kept() or ctx.shared:
                raise
        return _AutocastOff._grads(leaves, outputs, grads, wanted, create_graph=False, retain_graph=False)

    @staticmethod
    def backward(ctx, *grads):
        graph = ctx.graph
        if graph is None:
            ctx.saved_tensors  # noqa: B018 (raises torch's 'Trying to backward through the graph a second time')
            raise RuntimeError("fwbench: this autocast node's graph was freed by an earlier backward: pass "
                               "retain_graph=True to the first backward to call another")
        leaves, outputs = graph
        wanted = ctx.needs_input_grad[3:]
        with torch.autocast(ctx.device, enabled=False):
            if not torch.is_grad_enabled():
                found = _AutocastOff._first_order(ctx, leaves, outputs, grads, wanted)
            else:
                found = _AutocastOff._vector_jacobian_node(ctx, leaves, outputs, grads, wanted)
        if not _graph_kept():
            ctx.graph = None  # as autograd frees the node's saved tensors: kept, it lived as long as the outputs
        return (None, None, None, *found)

    @staticmethod
    def _vector_jacobian_node(ctx, leaves: list, outputs: Sequence[Tensor], grads: Sequence[Tensor | None],
                              wanted: Sequence[bool]) -> tuple[Tensor | None, ...]:
        """A create_graph=True backward: the vector-Jacobian product as a graph of the leaves and of the incoming
        gradients, through a node of its own (whose tensors are the saved ones, connected to the caller's graph,
        and the gradients), so that its backward is autocast-off too. The saved tensors are read, so an input
        changed in place since the forward is refused (torch's 'modified by an inplace operation')."""
        saved = ctx.saved_tensors
        grad_leaves = [None if g is None else g.detach().requires_grad_(g.requires_grad) for g in grads]
        products = _AutocastOff._grads(leaves, outputs, grad_leaves, wanted, create_graph=True, retain_graph=True)
        present = [p for p in products if p is not None]
        if not present:
            return products
        ctx.shared = True  # the product's graph reaches this one: a backward through either keeps it
        next_graph = ([*leaves, *grad_leaves], present)
        found = iter(_AutocastOff.apply(lambda tensors, needs_grad: next_graph, ctx.device, True, *saved, *grads))
        return tuple(None if p is None else next(found) for p in products)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """``torch.cat`` of tensors of one dtype (a KV cache and its new tokens), with autocast off for their
    device where it is on: CPU autocast's promote policy for cat knows fp32, float64 and its own dtype
    only, and raised 'Unexpected floating ScalarType in at::autocast::prioritize' for fp16 tensors
    under bf16 autocast (softmax's recurrent form, and every form with a carried cache). For one dtype
    the result is autocast's own where it answers."""
    if autocast_on(tensors[0]):
        with torch.autocast(tensors[0].device.type, enabled=False):
            return torch.cat(tensors, dim=dim)
    return torch.cat(tensors, dim=dim)  # without a context: softmax's recurrent step calls this twice a token


def all_finite(*tensors: Tensor | None) -> bool:
    """Whether every element of the given tensors is finite: one sum per tensor (a sum is finite
    only if every term is; NaN and ±inf propagate), and the exact per-element check only when a
    sum of finite values overflowed. One host synchronisation. Tensors on ``meta`` hold no values and
    count as finite: a shape-only run then takes the kernels' plain path (it raised "Tensor.item()
    cannot be called on meta tensors" here, for every fast-weight variant; softmax's reads already
    skip the check on meta)."""
    present = [x for x in tensors if x is not None and x.numel() and not x.is_meta]
    if not present:
        return True
    sums = torch.stack([x.sum(dtype=torch.float64 if x.dtype == torch.float64 else torch.float32) for x in present])
    if bool(torch.isfinite(sums).all()):
        return True
    return all(bool(torch.isfinite(x).all()) for x in present)


def causal_matmul(lower: Tensor, x: Tensor) -> Tensor:
    """``lower @ x`` for lower-triangular ``lower`` (…, C, C) and ``x`` (…, C, D), where row s of
    the result reads rows j ≤ s of ``x`` only, also when a later row holds NaN or ±inf.

    A non-finite entry x[t, d] is left out of the product (read as 0) and every output entry
    [s, d] with s ≥ t is set to NaN: the outputs before t are what they would be without it, the
    outputs from t on are non-finite, as in the recurrent form. Costs one pass over ``x`` more
    than a plain matmul, so the kernels call it only when their inputs are not all finite.
    """
    bad = ~torch.isfinite(x)
    reached = bad.cumsum(dim=-2, dtype=torch.int32) > 0  # entries at or after a non-finite one
    product = lower @ zeroed_in_layout(x, bad)
    return product.masked_fill(reached, float("nan"))


def masked_matmul(weights: Tensor, x: Tensor, allowed: Tensor) -> Tensor:
    """``weights @ x`` (…, T, P) @ (…, P, D) where output row s reads only the rows j of ``x`` with
    ``allowed[s, j]`` (a boolean (T, P) mask; ``weights`` is 0 elsewhere), also when another row
    holds NaN or ±inf: such an entry x[j, d] is read as 0, and the outputs [s, d] of every row s
    allowed to read it are set to NaN. For softmax attention with a cache (P ≥ T keys)."""
    bad = ~torch.isfinite(x)
    product = weights @ zeroed_in_layout(x, bad)
    reached = (allowed.to(x.dtype) @ bad.to(x.dtype)) > 0
    return product.masked_fill(reached, float("nan"))


def zeroed_in_layout(x: Tensor, bad: Tensor) -> Tensor:
    """``x`` with its ``bad`` entries set to 0, in ``x``'s own memory layout. Why: a BLAS may pick
    another kernel, and so another summation order, for a row-major operand than for a column-major
    one (MKL's AVX2 path on an AMD EPYC: 1 ulp of the largest term apart), and ``masked_fill``
    returns a row-major copy of a column-major ``x`` (``solve_triangular``'s result); the product's
    unreached entries must be those of the plain product, bit for bit, on any machine.

    ``clone`` keeps the strides of a dense ``x`` only; an expanded one (a stride of 0: one query
    broadcast over the key dimension, one key over the tokens) came back contiguous, and the fused
    attention kernel rounds a contiguous operand differently (2e-8 apart before t). Such an ``x`` is
    copied as the memory it reads, and viewed with its own strides again; an entry that several
    elements share is zeroed for all of them, so ``bad`` must mark by value (non-finite, or, in
    softmax, too large against the other operand's largest entry), alike for every element that
    shares an entry."""
    zeroed = x.clone()  # preserve_format: the strides of a dense x are kept
    if zeroed.stride() == x.stride() or x.numel() == 0:
        return zeroed.masked_fill_(bad, 0.0)
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
    memory = x.as_strided((span,), (1,), x.storage_offset()).clone()
    where = torch.arange(span, device=x.device).as_strided(x.shape, x.stride())[bad]  # memory index per bad entry
    memory = memory.index_fill(0, where, 0.0)
    return memory.as_strided(x.shape, x.stride())


def denormals_are_flushed() -> bool:
    """Whether this thread flushes denormal floats to zero now (torch has no getter for the mode:
    it is read from its effect on one denormal number, 1e-39 in fp32)."""
    return bool((torch.tensor([1e-39]) * 1.0).item() == 0.0)


@contextmanager
def denormals_kept() -> Iterator[None]:
    """Run the block with denormal floats kept (no FTZ/DAZ) on this thread, then restore the mode it had.

    Why: under DAZ, Python's own float operations read a denormal as 0 too (``5e-324 <= 0`` is True, and
    ``repr`` prints it as ``0.0``): a config check made inside :func:`denormals_flushed` (a run's own checks, or
    any check after a caller turned the mode on) refused ``power_a = 5e-324`` as "got 0.0". The checks of a
    config run under this, so that they read each value as itself.
    """
    was_on = denormals_are_flushed()
    if was_on:
        torch.set_flush_denormal(False)
    try:
        yield
    finally:
        if was_on:
            torch.set_flush_denormal(True)


@contextmanager
def denormals_flushed() -> Iterator[None]:
    """Run the block with denormal floats flushed to zero on this thread (FTZ/DAZ), then restore.

    Why: on x86 CPUs an operation on a denormal number (below 1.2e-38 in fp32) costs tens of times
    an ordinary one, and the suite's models drift into that range as they train: every FWM write
    divides the fast weight by s ≥ 1, so an old association decays geometrically (a Setting 2 step
    at S = 200 spent about half its time there), and FAVOR+ with the delta rule at S = 140 went
    from 37 to 155 ms of CPU per step over its first 3000 steps (31 ms from the same state with
    denormals flushed). Values that small are below any tolerance the suite uses. The training
    loops (:func:`fwbench.run.training.fit`, :func:`fwbench.run.packing.fit_packed`) run under it,
    as the FWM kernel does. Whether it was on is read with :func:`denormals_are_flushed`.
    With more than one intra-op thread, only this one is set.
    """
    was_on = denormals_are_flushed()
    if not torch.set_flush_denormal(True):  # the CPU has no such mode: nothing to do
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(was_on)
