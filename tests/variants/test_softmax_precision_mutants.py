"""Values of ``variants/kernels/softmax.py`` that the last mutation pass left unchecked (issue 14
item 14): the causal mask, its values against a loop and the device it is made on (the meta device
stands in for a GPU: its tensors have a device and a shape but no data)."""

from __future__ import annotations

import pytest
import torch

from fwbench.variants.kernels.softmax import _causal_mask


@pytest.mark.parametrize("T, P, window", [(3, 0, None), (2, 3, None), (4, 2, 2)])
def test_the_causal_mask_lets_each_query_see_its_window_of_earlier_keys(T, P, window):
    """Query t (global index P + t) may attend key j iff j ≤ P + t and, with a window, j > P + t − window."""
    expected = torch.tensor([[j <= P + t and (window is None or j > P + t - window) for j in range(P + T)]
                             for t in range(T)])
    assert torch.equal(_causal_mask(T, P, window, torch.device("cpu")), expected)


def test_the_causal_mask_is_made_on_the_queries_device():
    """On another device (meta) both position ranges are made there: the mask lives beside q."""
    mask = _causal_mask(3, 2, 2, torch.device("meta"))
    assert mask.device.type == "meta" and mask.shape == (3, 5) and mask.dtype == torch.bool
