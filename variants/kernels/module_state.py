"""The state of a module that a recomputation of its forward must find as the forward found it.

:func:`~.precision.run_in_fp32` runs a feature map φ again for a second backward through a retained graph and
for a ``create_graph=True`` backward (as ``torch.utils.checkpoint`` does). Plain autograd never runs φ twice, so
whatever φ's forward changes in its module (BatchNorm's running statistics, spectral_norm's vectors, a buffer it
registers, deletes or initialises, a submodule it makes) and whatever changed after it (the parameters
``torch.func.functional_call`` put in place and took out again, a ``.eval()`` call) must be set back to the
forward's for each recomputation, and to the caller's after it.

Not covered (break-it passes AA and AB; each gives a recomputation other values than the forward's, so gradients
of a second backward or a gradient penalty under autocast differ from plain autograd's, by 2-40 % in the cases
tried): Python attributes other than parameters, buffers, submodules and the training flag (a step counter that
φ moves); a parameter that φ changes in place (a decay step under ``no_grad``: moved again by each recomputation,
and a gradient penalty raises torch's 'modified by an inplace operation'); buffers that are views of one tensor
(copied apart); the values and training flag before the forward of a module that φ attaches (it was not in the
tree); a buffer that requires a gradient (``functional_call`` with such a buffer: it gets none). And the
parameters of a module that φ makes or attaches in its forward are no inputs of the autocast node, so that call
gives them no gradient (plain autograd does): :func:`unreached_parameters` names them, and ``run_in_fp32``
warns. A φ whose forward changes
only what torch's own layers change (BatchNorm's statistics, spectral_norm's vectors, a lazy module's first
initialisation) is covered. One difference runs the other way: statistics that a later call moves in place (a
BatchNorm's, between ``write`` and ``read``) do not bump torch's version counter, so plain autograd's second
backward reads them moved, and a recomputation here reads them as the forward did.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor

ABSENT = object()  # a slot its module did not hold when the forward began
_LAZY = object()  # a lazy module's buffer before its first forward, which holds no values yet
_KINDS = ("_parameters", "_buffers", "_modules")

Slot = tuple[torch.nn.Module, str, str]  # (owner, "_parameters" | "_buffers" | "_modules", name)


def lazy(t: object) -> bool:
    """Whether ``t`` is a lazy module's parameter or buffer that holds no values yet (``nn.LazyBatchNorm1d``'s
    before its first forward)."""
    return isinstance(t, torch.nn.parameter.UninitializedTensorMixin)


class Before(NamedTuple):
    """``module``'s state as a forward found it (:func:`before`): the ids of its modules, what each slot held
    (:func:`_held`), and each module's training flag."""

    module: torch.nn.Module
    owners: set[int]
    slots: dict[Slot, object]
    modes: list[tuple[torch.nn.Module, bool]]


def _slots(module: torch.nn.Module) -> list[Slot]:
    """Every parameter, buffer and submodule slot of ``module`` and of its submodules, ``None`` ones included."""
    return [(owner, kind, name) for owner in module.modules() for kind in _KINDS for name in getattr(owner, kind)]


def _held(slot: Slot, copies: dict[int, Tensor]) -> object:
    """What a recomputation must find in ``slot``. A parameter or submodule itself: the node's gradients reach a
    tensor that ``functional_call`` put there only if φ reads that very tensor. A buffer's copy, one per tensor
    (``copies``): buffers that share a tensor share the copy, and a recomputation moves both, as the forward did.
    ``None`` as it is; ``_LAZY`` for a buffer without values."""
    owner, kind, name = slot
    value = getattr(owner, kind)[name]
    if kind != "_buffers" or value is None:
        return value
    if lazy(value):
        return _LAZY
    if id(value) not in copies:
        copies[id(value)] = value.detach().clone()
    return copies[id(value)]


def before(module: torch.nn.Module | None) -> Before | None:
    """``module``'s state before a forward (``None`` for no module)."""
    if module is None:
        return None
    copies: dict[int, Tensor] = {}
    owners = list(module.modules())
    return Before(module, {id(owner) for owner in owners}, {slot: _held(slot, copies) for slot in _slots(module)},
                  [(owner, owner.training) for owner in owners])


class Replay(NamedTuple):
    """What each recomputation sets (:func:`replayed`): (slot, value) pairs, and training flags."""

    slots: list[tuple[Slot, object]]
    modes: list[tuple[torch.nn.Module, bool]]


def replay(found: Before | None) -> Replay:
    """The state each recomputation starts from, read after the forward against ``found`` (:func:`before`).

    - What the slot held before the forward, for every slot it had (one the forward deleted included, which a
      recomputation finds and deletes again).
    - ``ABSENT`` for a slot the forward added to a module it found (a buffer it registered, a submodule it
      made): a recomputation adds it again, from the same random numbers.
    - For a slot of a module that the forward attached, what it held after the forward: a module that existed
      before (one φ adopts, ``self.norm = shared``) is attached again by a recomputation, whose moves then land
      on copies, and the caller finds it as the forward left it. Its values before the forward are unknown (it
      was not in the tree), so the recomputation reads them as moved once.
    - A lazy buffer that the forward initialised: its value after the forward, the earliest it had (a BatchNorm
      in training mode never reads its running statistics); one the forward left without values: left alone."""
    if found is None:
        return Replay([], [])
    slots: list[tuple[Slot, object]] = []
    copies: dict[int, Tensor] = {}
    after = _slots(found.module)
    for slot in after:
        if slot in found.slots:
            value = found.slots[slot]
            if value is _LAZY:
                value = _held(slot, copies)
        elif id(slot[0]) in found.owners:
            value = ABSENT
        else:  # a module the forward attached: one it made is not there in a recomputation; one that existed is
            value = _held(slot, copies)
        if value is not _LAZY:
            slots.append((slot, value))
    gone = found.slots.keys() - set(after)
    slots += [(slot, value) for slot, value in found.slots.items() if slot in gone and value is not _LAZY]
    return Replay(slots, found.modes)


def unreached_parameters(found: Before | None, inputs: list[Tensor | None]) -> list[str]:
    """Names of the parameters of ``found.module`` that require a gradient but are not among ``inputs`` (the
    node's): those of a module that the forward made or attached, which get no gradient from it."""
    if found is None:
        return []
    given = {id(t) for t in inputs if t is not None}
    return [name for name, p in found.module.named_parameters()
            if p.requires_grad and id(p) not in given and not lazy(p)]


def _set(slot: Slot, value: object) -> None:
    """``slot`` set to ``value``, or taken out for ``ABSENT``."""
    owner, kind, name = slot
    if value is ABSENT:
        getattr(owner, kind).pop(name, None)
    else:
        getattr(owner, kind)[name] = value


@contextmanager
def replayed(plan: Replay) -> Iterator[None]:
    """Run the block with the slots and training flags that ``plan`` (:func:`replay`) gives, then set back those
    it found. Buffers get fresh copies of the plan's values (one per tensor): a graph built in the block saves
    them (BatchNorm's backward reads its running statistics), and a buffer set back in place made that backward
    raise torch's 'modified by an inplace operation'."""
    kept = [(slot, getattr(slot[0], slot[1]).get(slot[2], ABSENT)) for slot, _ in plan.slots]
    kept_modes = [(owner, owner.training) for owner, _ in plan.modes]
    clones: dict[int, Tensor] = {}
    for slot, value in plan.slots:
        if slot[1] == "_buffers" and isinstance(value, Tensor):
            if id(value) not in clones:
                clones[id(value)] = value.clone()
            value = clones[id(value)]
        _set(slot, value)
    for owner, training in plan.modes:
        owner.training = training
    try:
        yield
    finally:
        for slot, value in kept:
            _set(slot, value)
        for owner, training in kept_modes:
            owner.training = training
