"""The gate's sensitivity to a slowdown in one direction of a kernel (issue 14.11 break-it): timed, so it
lives with the benchmarks (`nox -s bench`), not in the test suite, which never asserts a timing.

A 2x slower softmax forward alone read 1.29x on the forward-and-backward case (the gate's 1.5 passed it);
the forward's own case must read it whole."""

from __future__ import annotations

import torch

from fwbench.bench.regression import PERF_CASES, measure_ratio


def test_a_kernel_twice_as_slow_in_its_forward_alone_doubles_its_direction_case(monkeypatch):
    """The softmax forward planted twice as slow (the fused kernel run twice per forward, its backward
    untouched): the train_forward case reads about 2x (the gate's 1.5 fails it), where the forward and
    backward case read 1.29x and passed."""
    from fwbench.variants.kernels import softmax

    torch.set_num_threads(1)
    case = {c.name: c for c in PERF_CASES}["softmax_parallel_train_forward_T1024"]
    before = min(measure_ratio(case, rounds=5)[0] for _ in range(2))
    graph = softmax._FusedAttention._graph

    def twice(*args):
        graph(*args)
        return graph(*args)

    monkeypatch.setattr(softmax._FusedAttention, "_graph", staticmethod(twice))
    after = min(measure_ratio(case, rounds=5)[0] for _ in range(2))
    assert after / before > 1.6, (before, after)
