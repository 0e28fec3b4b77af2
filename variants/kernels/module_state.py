"""What :func:`~.precision.run_in_fp32`'s autocast node must know of the module whose feature map φ it calls.

The node builds φ's graph once a forward and keeps it for every backward, so φ's forward runs as often as under
plain autograd, and whatever it changes in its module (BatchNorm's running statistics, spectral_norm's vectors, a
buffer it registers, a step counter) moves once a forward. Two things remain:

- a lazy module's parameters before its first forward (:func:`lazy`), which hold no values and must not be
  inputs of a node made before they get their shapes;
- the parameters of a module that φ makes or attaches in its forward: they were not among the node's inputs,
  which are listed before φ runs, so that call gives them no gradient (plain autograd does). :func:`unreached_parameters`
  names them, and ``run_in_fp32`` warns.
"""

from __future__ import annotations

import torch
from torch import Tensor


def lazy(t: object) -> bool:
    """Whether ``t`` is a lazy module's parameter or buffer that holds no values yet (``nn.LazyBatchNorm1d``'s
    before its first forward)."""
    return isinstance(t, torch.nn.parameter.UninitializedTensorMixin)


def unreached_parameters(module: torch.nn.Module | None, inputs: list[Tensor | None]) -> list[str]:
    """Names of the parameters of ``module`` that require a gradient but are not among ``inputs`` (the node's):
    those of a module that the forward made or attached, which get no gradient from it."""
    if module is None:
        return []
    given = {id(t) for t in inputs if t is not None}
    return [name for name, p in module.named_parameters()
            if p.requires_grad and id(p) not in given and not lazy(p)]
