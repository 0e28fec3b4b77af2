"""Each benchmark times one kernel call (or one training step) with pytest-benchmark, divides
its median by a calibration matmul timed just before it, stores that ratio in ``extra_info``,
and fails when the ratio exceeds the committed baseline by more than the threshold."""

from __future__ import annotations

import pytest

from fwbench.bench.regression import PERF_CASES, calibration_workload, compare, median_seconds


@pytest.mark.parametrize("case", PERF_CASES, ids=[case.name for case in PERF_CASES])
def test_perf(benchmark, case, baseline, threshold, measured):
    fn = case.build()
    calibration = median_seconds(calibration_workload(), repeats=5)
    benchmark.pedantic(fn, rounds=5, warmup_rounds=1, iterations=1)
    if benchmark.stats is None:  # --benchmark-disable: each benchmark ran once, untimed
        pytest.skip("pytest-benchmark is disabled; nothing to compare")
    seconds = benchmark.stats.stats.median
    ratio = seconds / calibration
    benchmark.extra_info.update(calibration_s=calibration, calibration_ratio=ratio)
    ratios, times = measured
    ratios[case.name], times[case.name] = ratio, seconds
    regressions = compare({case.name: ratio}, baseline, threshold)
    if regressions:
        pytest.fail(regressions[0].message(), pytrace=False)
