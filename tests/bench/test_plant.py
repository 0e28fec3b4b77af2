"""``--plant-slowdown`` reaches every caller of the kernel it doubles, also one that imported it by
name, so the gate sees the planted 2× (issue 14 kind 11)."""

from __future__ import annotations

import pytest
import torch

import fwbench.tasks.one_hot_read as one_hot_read
import fwbench.variants.kernels.dpfp_scores as dpfp_scores
from fwbench.bench.plant import plant_slowdown


def test_a_plant_reaches_callers_that_imported_the_kernel_by_name(monkeypatch):
    calls = []
    original = dpfp_scores.dpfp_query_scores

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    # the kernel as both modules hold it, counted, before the plant doubles it
    monkeypatch.setattr(dpfp_scores, "dpfp_query_scores", counted)
    monkeypatch.setattr(one_hot_read, "dpfp_query_scores", counted)
    undo = plant_slowdown("fwbench.variants.kernels.dpfp_scores:dpfp_query_scores")
    try:
        assert one_hot_read.dpfp_query_scores is dpfp_scores.dpfp_query_scores is not counted
        k, phi_q = torch.randn(1, 1, 5, 4), torch.rand(1, 1, 1, 8)
        one_hot_read.dpfp_query_scores(k, phi_q, 1)
        assert len(calls) == 2
    finally:
        undo()
    assert one_hot_read.dpfp_query_scores is counted and dpfp_scores.dpfp_query_scores is counted


@pytest.mark.parametrize("target", ["variants.kernels.delta_rule:delta_rule_chunk", "fwbench.variants.kernels.delta_rule:",
                                    "fwbench.variants.kernels.delta_rule:nothing", "fwbench.nothing:f",
                                    "fwbench.variants.kernels.delta_rule:DEFAULT_CHUNK_SIZE"])
def test_a_target_that_would_plant_nothing_is_refused(target):
    with pytest.raises(ValueError, match="--plant-slowdown: got"):
        plant_slowdown(target)
