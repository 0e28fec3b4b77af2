"""The FWM rule of Schlag, Munkhdalai & Schmidhuber 2021 (ICLR): the delta-rule write on φ that is
not sum-normalised, W rescaled by max(1, ‖W‖_F) after each write, y = LayerNorm(W φ(q)).

Kernels: :mod:`variants.kernels.fwm_rule`. The rescaling is not associative, so the rule has only
the recurrent form, and no chunk size acts anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..kernels import fwm_rule as kernels
from .base import UpdateRule


def _recurrent(pq, pk, v, beta, W0, z0, chunk_size):
    return (*kernels.fwm_rule_recurrent(pq, pk, v, beta, W0), None)


@dataclass(frozen=True)
class FwmRule(UpdateRule):
    """The FWM rule; its state is W alone."""

    def write(self, pk: Tensor, v: Tensor, beta, W0, z0, chunk_size: int):
        return kernels.fwm_rule_write(pk, v, beta, W0), None

    def read(self, pq: Tensor, W: Tensor, z: Tensor | None) -> Tensor:
        return kernels.fwm_rule_read(pq, W)


FWM = FwmRule(
    name="fwm", key="fwm", description="FWM rule (rescaled W, layer-normed read-out)",
    source="Schlag, Munkhdalai & Schmidhuber 2021 (ICLR); paper Section 6.1, Setting 2",
    kernels={"recurrent": _recurrent}, auto_form="recurrent",
    uses_beta=True, carries_normalizer=False, sum_normalize=False, needs_non_negative_features=False,
    chunked_paths=(),
    why_forms="its rescaling by max(1, ‖W‖_F) after each write is not associative, so it has no parallel or chunk form",
)
