"""What the harness needs from a task: a typed config, a model, batches, a loss and an evaluation.

A task never looks at variant names: it receives a spec string and builds its model with
:mod:`variants`. The harness (``fwbench.run.training``) owns the loop, seeding, early stopping and
records; a task owns the data and the maths of its loss.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from fwbench.variants import FORMS, chunk_size_in_use, parse_spec
from fwbench.variants.errors import MAX_SIZE, shown, too_large
from fwbench.variants.registry import form_in_use

#: The most layers a task model builds. Each layer is a Python module made one by one, so a count no
#: memory holds (``n_layers = 10**30``) built layers until memory ran out, for hours, instead of failing.
MAX_LAYERS = 4096
LAYERS_WHY = "a model's layers are built one by one"


class TaskConfig(Protocol):
    """A frozen dataclass of hyper-parameters; the fields below are read by the training loop."""

    batch_size: int
    lr: float
    eval_every: int
    patience: int
    target_loss: float
    max_steps: int


class Task(Protocol):
    """Interface of a task that the generic training loop can drive."""

    name: ClassVar[str]
    config_class: ClassVar[type]

    def validate(self, config: Any) -> None:
        """Raise ``ValueError`` naming the field if ``config`` is out of range."""

    def build_model(self, config: Any, variant: str) -> nn.Module: ...

    def train_batch(self, config: Any, generator: torch.Generator) -> Any:
        """A training batch drawn from ``generator`` (CPU tensors; the loop moves them)."""

    def loss(self, model: nn.Module, batch: Any, config: Any) -> Tensor:
        """Scalar training loss of ``model`` on ``batch`` (nats or the task's own unit)."""

    def evaluate(self, model: nn.Module, config: Any, generator: torch.Generator,
                 device: torch.device) -> dict[str, float]:
        """Evaluation metrics; must contain ``loss``, the quantity early stopping watches."""

    # Optional: ``float64_keys: ClassVar[frozenset[str]]``, the float config keys the task computes in float64,
    # not in float32 training: the grid refuses them only below float64's smallest normal number, not float32's
    # (see :func:`fwbench.run.grid.refuse_tiny_floats`; default: none).
    # Optional: ``acting_config(config, variant) -> dict``, the config keys that act for this variant
    # (the run id hashes only these; default: every key). See :func:`acting_config`.
    # Optional: ``acting_variant(config, variant) -> str``, the variant spec as it computes here (the run id
    # hashes it; default: the spec). See :func:`variant_over`.
    # Optional: ``final_evaluation(model, config, device, seed) -> dict``, run once after training.
    # Its ``metrics`` entry (name → float) joins the record's metrics; everything else (JSON-ready)
    # is stored in the record under ``final_evaluation`` (the LM task's long-context evaluation
    # and generated sample). Optional config fields the loop reads: see ``fwbench.run.training``.


def config_field_types(config_class: type) -> dict[str, type]:
    """Map each field name of a config dataclass to its Python type (int, float, str, bool)."""
    resolved = {"int": int, "float": float, "str": str, "bool": bool}
    out = {}
    for f in fields(config_class):
        t = f.type if isinstance(f.type, type) else resolved.get(str(f.type).split("|")[0].strip(), str)
        out[f.name] = t
    return out


def check_fields(config: Any, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = ()) -> None:
    """The range checks every task's ``validate`` shares: integer fields (not bools) that must be ≥ 1 (``None``
    allowed: unset), integer fields that must be ≥ 0, ``target_loss`` (a loss: ≥ 0) and the attention ``form``.

    Raises:
        ValueError: naming the first field out of range, its value and what is allowed.
    """
    for name in (*positive, *non_negative):
        value = getattr(config, name)
        # a spec built in Python skips the grid loader's type check: True passed as 1, 64.0 as 64
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ValueError(f"{name}: got {shown(value)}; expected an integer")
    for name in positive:
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ValueError(f"{name}: got {shown(value)}; expected a positive integer (>= 1)")
    for name in non_negative:
        value = getattr(config, name)
        if value < 0:
            raise ValueError(f"{name}: got {shown(value)}; expected an integer >= 0")
    for name in (*positive, *non_negative):
        value = getattr(config, name)
        maximum, why = (MAX_LAYERS, LAYERS_WHY) if name == "n_layers" else (MAX_SIZE, "")
        if isinstance(value, numbers.Integral) and value > maximum:
            raise ValueError(too_large(name, value, maximum, why))
    target_loss = getattr(config, "target_loss", None)
    if target_loss is not None and not target_loss >= 0:  # `not >=` also refuses NaN
        raise ValueError(f"target_loss: got {shown(target_loss)}; expected a loss >= 0 (training stops once the "
                         "evaluation loss is at most it; losses are never negative, so below 0 it never would)")
    if getattr(config, "form", "auto") not in FORMS:
        raise ValueError(f"form: got {config.form!r}; expected one of {', '.join(FORMS)}")


def check_int(name: str, value: Any, minimum: int = 1, note: str = "", maximum: int = MAX_SIZE,
              why: str = "") -> int:
    """``value`` as an ``int`` if it is an integer (Python's or NumPy's; not a bool, not a float such as 2.0, not
    a torch tensor, which the callers would pass on to torch as it is) in [``minimum``, ``maximum``], else a
    ``ValueError`` naming ``name`` in :func:`check_fields`'s words (with ``note`` after them). For the size arguments of the
    task generators and models, checked before any torch work: a size of 0 or below raised torch's
    RuntimeError (``random_ expects 'from' to be less than 'to'``, ``Trying to create tensor with negative
    dimension``), a float or a string a TypeError, and one above torch's largest size (2**63 − 1) a TypeError
    or an OverflowError. A size within that range but too large for memory still ends in torch's
    allocator error, which names the bytes asked for.

    Raises:
        ValueError: ``NAME: got VALUE; expected a positive integer (>= 1)`` (``an integer >= MINIMUM``), or
            ``NAME: got VALUE; expected at most MAXIMUM (WHY)`` (see :func:`~fwbench.variants.errors.too_large`).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        expected = "a positive integer (>= 1)" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name}: got {shown(value)}; expected {expected}{note}")
    if value > maximum:
        raise ValueError(too_large(name, value, maximum, why))
    return int(value)


def variant_over(variant: str, tokens: int) -> str:
    """``variant`` as it computes on attention calls of at most ``tokens`` tokens: softmax with a window
    of at least ``tokens`` keys attends to every key, as softmax without one (its spec is returned
    then); every other variant as given. A task's ``acting_variant`` (hashed in the run id) calls it
    with the longest call it makes."""
    spec = parse_spec(variant)
    window = spec.params.get("window")
    if spec.info.update_rule is None and window is not None and window >= tokens:
        return str(parse_spec(spec.name))
    return variant


def acting_config(config: Any, variant: str, path: str) -> dict[str, Any]:
    """``config`` as a dict of the keys that change what a run computes, for the run id.

    ``chunk_size`` is written as the chunk size the variant's attention runs ``path`` with (the
    config's, or the rule's default where it is unset) and left out where no chunk size acts there
    (softmax, FWM, the parallel and recurrent forms; see :func:`variants.chunk_size_in_use`).
    ``path``: the attention form the task's model runs, or ``write`` / ``write_read``.

    ``eval_every`` > ``max_steps`` is written as ``max_steps + 1``: no such value reaches a scheduled
    evaluation, so each evaluates the run at its last step only (the loop always evaluates the model
    it ends with) and they name one run. (``eval_every = max_steps`` is a run of its own: its one
    evaluation is the scheduled one, whose curve point holds the step's training loss.)

    Raises:
        VariantError: a form the variant's rule has no kernel for (``config.form`` or ``path``).
    """
    acting = asdict(config)
    if acting.get("eval_every") is not None and acting.get("max_steps") is not None:
        acting["eval_every"] = min(acting["eval_every"], acting["max_steps"] + 1)
    if "form" in acting:
        chunk_size_in_use(variant, acting["form"])  # refuses a form the rule has no kernel for
    if "chunk_size" in acting:
        used = chunk_size_in_use(variant, path, acting["chunk_size"])
        if used is None:
            del acting["chunk_size"]
        else:
            acting["chunk_size"] = used
    return acting


def forward_acting_config(config: Any, variant: str) -> dict[str, Any]:
    """:func:`acting_config` for a task whose model runs the attention's ``forward`` in ``config.form``
    (MQAR, the language model), with a form that runs the kernels ``auto`` runs written as ``auto``:
    ``chunk`` for the sum and delta rules, ``recurrent`` for the FWM rule, ``parallel`` and ``chunk``
    for softmax (:func:`variants.registry.form_in_use`). They compute one run; hashed as given, they
    trained it once per name (every run stored so far names ``auto``, so their ids are unchanged)."""
    acting = acting_config(config, variant, config.form)
    if form_in_use(variant, config.form) == form_in_use(variant, "auto"):
        acting["form"] = "auto"
    return acting


def map_tensors(batch: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``fn`` applied to every tensor of a (nested tuple / list / dict) batch; other leaves kept."""
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested tuple / dict) batch to ``device``."""
    return map_tensors(batch, lambda x: x.to(device))


def check_ids(name: str, ids: Tensor, size: int | None, size_name: str, device: torch.device | None,
              error: type[ValueError] = ValueError) -> None:
    """Refuse token or key ids (an integer tensor) that the model's embedding cannot look up: held on
    another device than the model's (``device``; None: not checked), or outside [0, ``size``) (None:
    not checked, no host read).

    An id outside the table raised "IndexError: index out of range in self" from the embedding (a
    device-side assert on CUDA); meta ids into a CPU model made the range check's host read raise
    "Tensor.item() cannot be called on meta tensors", and CPU ids into a model on meta returned meta
    outputs. The range check reads two integers back to the host (a sync per call on CUDA); meta ids
    have no values and are not read (a shapes-only dry run of a model on meta).

    Raises:
        ValueError (or ``error``, e.g. VariantError): ``NAME.device: got ...`` or ``NAME: got ids in
        [low, high]; expected ids in [0, SIZE_NAME=size)``.
    """
    if device is not None and ids.device != device:
        raise error(f"{name}.device: got '{ids.device}'; expected the model's device ({device})")
    if size is not None and ids.numel() and ids.device.type != "meta":
        low, high = (int(x) for x in torch.aminmax(ids))
        if low < 0 or high >= size:
            raise error(f"{name}: got ids in [{low}, {high}]; expected ids in [0, {size_name}={size})")
