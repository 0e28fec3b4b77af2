"""Values of ``variants/kernels/softmax.py`` that the last mutation pass left unchecked (issue 14
item 14): the causal mask, its values against a loop and the device it is made on (the meta device
stands in for a GPU: its tensors have a device and a shape but no data); and the two helpers of
``variants/kernels/precision.py`` every kernel calls, :func:`all_finite` and :func:`compute_dtype`."""

from __future__ import annotations

import pytest
import torch

from fwbench.variants.kernels import softmax
from fwbench.variants.kernels.precision import all_finite, compute_dtype
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


def test_all_finite_answers_for_every_tensor_given():
    """True for finite tensors (None and empty ones skipped, and no tensor at all), also when their
    sum overflows (3e38 + 3e38 in fp32, 1e308 + 1e308 in float64); False as soon as one tensor holds a
    NaN or ±inf, in any dtype and position."""
    finite = torch.ones(2, 3)
    assert all_finite() is True and all_finite(None, torch.empty(0)) is True
    assert all_finite(finite, None, torch.empty(0, 4)) is True
    assert all_finite(torch.full((2,), 3e38), finite) is True
    assert all_finite(torch.full((2,), 1e308, dtype=torch.float64)) is True
    assert all_finite(torch.full((2,), 6e4, dtype=torch.float16)) is True  # the fp16 sum overflows
    for bad in (float("nan"), float("inf"), -float("inf")):
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            holder = torch.zeros(3, dtype=dtype)
            holder[1] = bad
            assert all_finite(finite, None, holder) is False
            assert all_finite(holder, finite) is False


def test_compute_dtype_is_float64_if_any_tensor_is_float64():
    """None entries are skipped; fp16, bf16 and fp32 compute in fp32; one float64 tensor anywhere
    makes float64."""
    f64, f32, f16 = (torch.zeros(1, dtype=d) for d in (torch.float64, torch.float32, torch.float16))
    assert compute_dtype() == torch.float32 and compute_dtype(None) == torch.float32
    assert compute_dtype(f16, None, torch.zeros(1, dtype=torch.bfloat16)) == torch.float32
    assert compute_dtype(f32, f16) == torch.float32
    assert compute_dtype(None, f32, f64) == torch.float64 and compute_dtype(f64) == torch.float64


def test_softmax_parallel_asks_for_its_mask_on_the_queries_device(monkeypatch):
    """The mask of a call is made on q's device (a recorder of the device asked for: on a GPU a mask
    left on the CPU is refused by the fused kernel); the output is the one of the real mask."""
    asked = []

    def recording_mask(T, P, window, device):
        asked.append(device)
        return _causal_mask(T, P, window, device)

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=generator) for _ in range(3))
    expected = softmax.softmax_parallel(q, k, v, window=3)[0]
    monkeypatch.setattr(softmax, "_causal_mask", recording_mask)
    assert torch.equal(softmax.softmax_parallel(q, k, v, window=3)[0], expected)
    assert asked == [q.device]
