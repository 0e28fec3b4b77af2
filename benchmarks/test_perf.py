"""Each benchmark times one kernel call (or one training step) with pytest-benchmark, in rounds
that each time the calibration matmul right before the case (pytest-benchmark's untimed ``setup``,
timed here); the figure is the median over rounds of case / calibration
(:func:`~fwbench.bench.regression.paired_ratio`), stored in ``extra_info``; it fails when that ratio
exceeds the committed baseline by more than the threshold.

``--plant-slowdown MODULE:FUNCTION`` (conftest.py) makes that kernel run twice per call: the check
of the gate itself, which must then fail the cases the kernel dominates."""

from __future__ import annotations

import pytest

from fwbench.bench.regression import PAIRED_RATIO_ROUNDS, PERF_CASES, calibration_workload, compare, paired_ratio, timed_once


@pytest.mark.parametrize("case", PERF_CASES, ids=[case.name for case in PERF_CASES])
def test_perf(benchmark, case, baseline, threshold, measured):
    fn, calibration = case.build(), calibration_workload()
    calibration_times: list[float] = []
    benchmark.pedantic(fn, setup=lambda: calibration_times.append(timed_once(calibration)),
                       rounds=PAIRED_RATIO_ROUNDS, warmup_rounds=1, iterations=1)
    if benchmark.stats is None:  # --benchmark-disable: each benchmark ran once, untimed
        pytest.skip("pytest-benchmark is disabled; nothing to compare")
    case_times = list(benchmark.stats.stats.data)
    ratio = paired_ratio(case_times, calibration_times[-len(case_times):])
    seconds = benchmark.stats.stats.median
    benchmark.extra_info.update(calibration_s=calibration_times[-len(case_times):], calibration_ratio=ratio)
    ratios, times = measured
    ratios[case.name], times[case.name] = ratio, seconds
    regressions = compare({case.name: ratio}, baseline, threshold)
    if regressions:
        pytest.fail(regressions[0].message(), pytrace=False)
