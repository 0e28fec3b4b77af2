"""Values of ``tasks/retrieval.py`` that the last mutation pass left unchecked (issue 14 item 14):
the range check of value ids that runs off the CPU, and the device of the last-occurrence lookup.
No GPU is needed: a tensor that reports another device stands in for a CUDA tensor, and the meta
device for a GPU's (its tensors have shapes and devices but no data)."""

from __future__ import annotations

import pytest
import torch

from fwbench.tasks.retrieval import last_occurrence_values, retrieval_loss


class _ReportsCuda(torch.Tensor):
    """CPU data that reports ``cuda:0`` as its device, so that the check written for GPU tensors runs
    (on CPU ``scatter_`` reports a bad id itself and the check is skipped)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def _on_gpu(ids: list[list[int]]) -> torch.Tensor:
    return torch.tensor(ids).as_subclass(_ReportsCuda)


@pytest.mark.parametrize("ids, shown", [([[-1, 3], [1, 2]], "[-1, 3]"), ([[0, 4], [1, 2]], "[0, 4]"),
                                        ([[-2, 5], [1, 2]], "[-2, 5]")])
def test_off_cpu_value_ids_out_of_range_name_their_range(ids, shown):
    """S = 4: ids must lie in [0, 4); the error names the smallest and largest id given."""
    with pytest.raises(ValueError) as error:
        retrieval_loss(torch.zeros(2, 2, 4), _on_gpu(ids), 4)
    assert str(error.value) == f"targets: got ids in {shown}; expected ids in [0, 4)"


def test_off_cpu_value_ids_at_both_ends_of_the_range_give_the_loss():
    """Ids 0 and S − 1 = 3 are valid: with all-zero scores the loss is ½·‖one-hot‖² = 0.5 per query."""
    loss = retrieval_loss(torch.zeros(2, 2, 4), _on_gpu([[0, 3], [3, 0]]), 4)
    assert float(loss) == 0.5


def test_last_occurrence_values_stay_on_the_keys_device():
    """Keys on another device (meta stands in for a GPU): the positions are made there too, so the
    lookup runs there and returns (B, Q) targets and presence flags on that device."""
    keys = torch.empty(2, 5, dtype=torch.long, device="meta")
    targets, present = last_occurrence_values(keys, keys, keys[:, :3])
    assert (targets.device.type, present.device.type) == ("meta", "meta")
    assert targets.shape == present.shape == (2, 3)
    assert present.dtype == torch.bool
