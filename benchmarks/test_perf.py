"""Each benchmark times one kernel call (or one training step) with pytest-benchmark, in rounds
that each time the calibration matmul right before the case (pytest-benchmark's untimed ``setup``;
a backward case's forward too, :class:`~fwbench.bench.regression.BackwardAlone`).
Both are also timed in CPU time of this thread (:func:`~fwbench.bench.regression.cpu_seconds`),
and the figure judged is the median over rounds of case / calibration CPU time
(:func:`~fwbench.bench.regression.paired_ratio`), stored in ``extra_info``. A ratio past the
threshold × baseline is measured again, up to four times a second apart (:func:`~fwbench.bench.regression.measure_ratio`),
and the case fails when the smallest of them is still past it
(:func:`~fwbench.bench.regression.confirmed_ratio`). ``--update-baseline`` stores the smallest of
:data:`~fwbench.bench.regression.BASELINE_MEASUREMENTS` measurements. pytest-benchmark's table shows wall times.

``--plant-slowdown MODULE:FUNCTION`` (conftest.py) makes that kernel run twice per call: the check
of the gate itself, which must then fail the cases the kernel dominates."""

from __future__ import annotations

import pytest

from fwbench.bench.regression import (
    BASELINE_MEASUREMENTS,
    PAIRED_RATIO_ROUNDS,
    PERF_CASES,
    calibration_workload,
    compare,
    confirmed_ratio,
    cpu_seconds,
    measure_ratio,
    paired_ratio,
)


@pytest.mark.parametrize("case", PERF_CASES, ids=[case.name for case in PERF_CASES])
def test_perf(benchmark, case, baseline, threshold, measured, request):
    updating = request.config.getoption("--update-baseline")
    if not updating and case.name not in baseline:
        # judged against nothing, it passed before: a gate that "never fails" this case (nothing timed)
        pytest.skip(f"no baseline ratio for {case.name} ({request.config._fwbench_baseline.where()}): "
                    f"nothing to judge it against; `nox -s bench -- --update-baseline -k {case.name}` adds it")
    fn, calibration = case.build(), calibration_workload()
    calibration_times: list[float] = []
    case_times: list[float] = []
    prepare = getattr(fn, "prepare", lambda: None)  # a backward case's forward: untimed, out of the wall time too

    def setup():
        calibration_times.append(cpu_seconds(calibration))
        prepare()

    benchmark.pedantic(lambda: case_times.append(cpu_seconds(fn)), setup=setup,
                       rounds=PAIRED_RATIO_ROUNDS, warmup_rounds=1, iterations=1)
    if benchmark.stats is None:  # --benchmark-disable: each benchmark ran once, untimed
        pytest.skip("pytest-benchmark is disabled; nothing to compare")
    rounds = slice(-PAIRED_RATIO_ROUNDS, None)  # the warm-up round is not judged
    ratio = paired_ratio(case_times[rounds], calibration_times[rounds])
    if updating:
        # the baseline is the smallest of a few measurements, as a judged ratio past the threshold is
        # the smallest of its confirmations: both then read the least contended stretch
        measured_ratios = [ratio] + [measure_ratio(case)[0] for _ in range(BASELINE_MEASUREMENTS - 1)]
        ratio = min(measured_ratios)
        benchmark.extra_info.update(ratios_measured=measured_ratios)
    else:
        ratio, measured_ratios = confirmed_ratio(ratio, lambda: measure_ratio(case)[0], threshold * baseline[case.name])
        benchmark.extra_info.update(ratios_measured=measured_ratios)
    seconds = benchmark.stats.stats.median
    benchmark.extra_info.update(calibration_cpu_s=calibration_times[rounds], case_cpu_s=case_times[rounds],
                                calibration_ratio=ratio)
    ratios, times = measured
    ratios[case.name], times[case.name] = ratio, seconds
    regressions = compare({case.name: ratio}, baseline, threshold)
    if regressions:
        pytest.fail(regressions[0].message(), pytrace=False)
