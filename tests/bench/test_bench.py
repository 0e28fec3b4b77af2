"""Specification of ``fwbench bench`` and of the performance-regression check.

- The measuring primitives are exact where they can be: peak memory of a known allocation
  pattern, FLOPs of a matmul.
- A small bench run writes one record per (variant, form, mode, T) to ``bench.jsonl``, and the
  acceptance ratios, tables, CLI and report section are built from them.
- The regression comparison flags a ratio past the threshold, naming the benchmark and both
  ratios; benchmarks without a baseline are not judged.
- CI's short check: the short benchmarks measured now are within the gross threshold of the
  committed baseline (a chunk form falling back to the token loop would fail it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fwbench.bench.measure import count_flops, peak_memory_bytes, time_call, time_interleaved
from fwbench.bench.regression import (
    BASELINE_DIR,
    BASELINE_FORMAT,
    GROSS_THRESHOLD,
    PERF_CASES,
    JudgedBaseline,
    PerfCase,
    baseline_cpu,
    baseline_path_for,
    choose_baseline,
    compare,
    confirmed_ratio,
    cpu_seconds,
    judged_baseline,
    load_baseline,
    measure_ratio,
    paired_ratio,
    read_baseline,
    write_baseline,
)
from fwbench.bench.suite import BENCH_RECORDS, FORWARD, FORWARD_BACKWARD, BenchProfile, run_bench
from fwbench.bench.summary import (
    acceptance_ratios,
    bench_frame,
    format_ratios,
    readable_bench_records,
    summary_record,
    time_table,
)
from fwbench.cli import main
from fwbench.report.bench_section import section_bench
from fwbench.run.environment import cpu_identity, cpu_model
from fwbench.run.store import ResultsStore

CPU = torch.device("cpu")


@pytest.mark.slow
def test_peak_memory_counts_tensor_bytes_alive_at_the_peak():
    def allocate():
        a = torch.ones(1000, 1000)  # 4 MB
        b = a * 2  # 8 MB alive
        del a
        c = torch.ones(2000, 1000)  # 4 + 8 = 12 MB alive: the peak
        return b.sum() + c.sum()

    assert 12_000_000 <= peak_memory_bytes(allocate, CPU) <= 12_000_100


@pytest.mark.slow
def test_flop_count_of_a_matmul_and_its_backward():
    a = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(16, 4)
    assert count_flops(lambda: a @ b) == 2 * 8 * 16 * 4
    assert count_flops(lambda: (a @ b).sum().backward()) == 2 * (2 * 8 * 16 * 4)


@pytest.mark.slow
def test_flop_count_includes_in_place_matmuls():
    """The delta rule's forward updates its state with baddbmm_, which torch's counter skips."""
    state, a, b = torch.zeros(3, 5, 7), torch.randn(3, 5, 6), torch.randn(3, 6, 7)
    assert count_flops(lambda: state.baddbmm_(a, b)) == 2 * 3 * 5 * 6 * 7
    assert count_flops(lambda: torch.baddbmm(state, a, b)) == 2 * 3 * 5 * 6 * 7
    m = torch.zeros(5, 7)
    assert count_flops(lambda: m.addmm_(a[0], b[0])) == 2 * 5 * 6 * 7


def test_long_calls_are_timed_once():
    timing = time_call(lambda: None, CPU, repeats=4, long_call_s=0.0)
    assert timing.repeats == 1
    assert time_call(lambda: None, CPU, repeats=4).repeats == 4


def test_a_slow_first_call_is_warm_up_not_the_measurement():
    """A first call that compiles (as fla's Triton kernels do) is long; the calls after it are not."""
    import time

    calls = []

    def compiles_on_first_call():
        calls.append(None)
        time.sleep(0.3 if len(calls) == 1 else 0.001)

    timing = time_call(compiles_on_first_call, CPU, repeats=3, long_call_s=0.2)
    assert timing.repeats == 3 and timing.median_s < 0.1
    assert len(calls) == 1 + 1 + 3  # warm-up, the check that it was a one-off, three timed calls


def test_interleaved_timing_alternates_the_sides_of_a_ratio():
    import time

    calls = []
    fns = {"ours": lambda: calls.append("ours"), "fla": lambda: (calls.append("fla"), time.sleep(0.01))}
    timings = time_interleaved(fns, CPU, rounds=3)
    assert calls == ["ours", "fla"] + ["ours", "fla", "fla", "ours", "ours", "fla"]  # warm-ups, then turns
    assert timings["fla"].median_s >= 0.01 > timings["ours"].median_s and timings["ours"].repeats == 3
    with pytest.raises(ValueError, match="rounds"):
        time_interleaved(fns, CPU, rounds=0)
    with pytest.raises(ValueError, match="rounds"):
        time_interleaved(fns, CPU, rounds=True)
    # long calls get fewer rounds, never more than asked for
    assert time_interleaved(fns, CPU, rounds=5, long_call_s=0.0, long_rounds=2)["ours"].repeats == 2
    assert time_interleaved(fns, CPU, rounds=1, long_call_s=0.0, long_rounds=3)["ours"].repeats == 1


def test_cpu_time_leaves_out_waiting_and_counts_work():
    import time

    def busy() -> None:
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass

    timings = time_interleaved({"waits": lambda: time.sleep(0.05), "works": busy}, CPU, rounds=3, cpu_time=True)
    assert timings["waits"].median_s < 0.01 and timings["works"].median_s >= 0.02
    with pytest.raises(ValueError, match="cpu_time: got True on cuda"):
        time_interleaved({"works": busy}, torch.device("cuda"), rounds=1, cpu_time=True)


TINY = BenchProfile(
    "tiny", "test", lengths=(32, 64), max_length={"recurrent": 32, "parallel": 64, "softmax-recurrent": 32,
                                                   "sdpa": 64, "fla-recurrence": 32, "fla-chunkwise": 64},
    repeats=1, memory_max_recurrent=32, comparison_length=64, precision_length=64, chunk_sweep=(16, 32),
    sweep_length=64, train_steps=3, step_cases=(("dpfp:nu=1", 1, 12), ("dpfp-fwm:nu=1", 2, 6)),
)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bench")
    store = ResultsStore(directory, records_file=BENCH_RECORDS)
    result = run_bench(TINY, CPU, store=store, variants=["softmax", "dpfp", "dpfp-delta"], quiet=True)
    return directory, store, result


@pytest.mark.slow
def test_bench_times_the_large_s_and_fwm_training_steps(tiny_run):
    _, _, result = tiny_run
    rows = result.extras["step_times"]
    assert [(r["variant"], r["setting"], r["S"]) for r in rows] == [("dpfp:nu=1", 1, 12), ("dpfp-fwm:nu=1", 2, 6)]
    assert all(0 < r["step_s"] < 10 and r["repeats"] == 1 for r in rows)


@pytest.mark.slow
def test_bench_writes_one_record_per_case_with_time_memory_and_flops(tiny_run):
    directory, store, result = tiny_run
    stored = store.records()
    assert len(stored) == len(result.records) and (directory / BENCH_RECORDS).exists()
    assert not (directory / "runs.jsonl").exists(), "bench records go to their own file"
    frame = bench_frame(stored)
    main_cases = frame[frame["sweep"].isna() & (frame["form"] != "anchor")]
    # softmax: parallel, recurrent; dpfp and dpfp-delta: chunk, parallel, recurrent; × 2 modes × 2 lengths
    assert len(main_cases) == (2 + 3 + 3) * 2 * 2
    skipped = main_cases[main_cases["status"] == "skipped"]
    assert set(skipped["form"]) == {"recurrent"} and set(skipped["T"]) == {64}, "recurrent is capped at T=32"
    ok = main_cases[main_cases["status"] == "ok"]
    assert (ok["median_s"] > 0).all() and (ok["tokens_per_s"] > 0).all()
    chunk = ok[ok["form"] == "chunk"]
    assert (chunk["gflop"] > 0).all() and chunk["peak_mem_bytes"].notna().all()
    # each case's fraction of peak uses the matmul peak timed beside it, not the one from the start
    stored_chunk = [r for r in stored if r.get("form") == "chunk" and r.get("status") == "ok" and "gflop" in r]
    assert stored_chunk and all(
        r["fraction_of_peak"] == pytest.approx(r["gflops_per_s"] / r["matmul_peak_gflops_adjacent"])
        and r["matmul_peak_gflops_adjacent"] > 0 for r in stored_chunk)
    delta_fb = chunk[(chunk["variant"] == "dpfp-delta:nu=1") & (chunk["mode"] == FORWARD_BACKWARD)]
    delta_fwd = chunk[(chunk["variant"] == "dpfp-delta:nu=1") & (chunk["mode"] == FORWARD)]
    assert delta_fb["gflop"].min() > delta_fwd["gflop"].max() / 2, "the backward's FLOPs are counted too"
    assert {"sdpa (torch)", "fla delta_rule_chunkwise"} <= set(frame["variant"])
    assert {"C=16 (ms)", "C=32 (ms)"}, set(frame[frame["sweep"] == "chunk_size"]["chunk_size"]) == {16, 32}


@pytest.mark.slow
def test_bench_ratios_cover_every_acceptance_figure(tiny_run):
    _, _, result = tiny_run
    ratios = acceptance_ratios(bench_frame(result.records), result.extras)
    names = " | ".join(r.name for r in ratios)
    for expected in ("speed-up over recurrent", "dpfp chunk time", "fla delta_rule_chunkwise", "GFLOP/s",
                     "SDPA", "peak memory", "Setting 2 training", "fp16/bf16"):
        assert expected in names
    comparison = result.extras["fla_comparison"]
    assert comparison["rel_rmse"] <= 1e-5, "ours and fla's chunkwise delta rule compute the same outputs"
    assert all(row["finite"] for row in result.extras["precision"]["rows"])
    training = result.extras["setting2_training"]
    assert training["steps"] == 3
    # fewer steps than the warm-up: no median step to take, the figure is the plain mean
    assert training["timed_steps"] == 0 and training["steps_per_s"] == training["mean_steps_per_s"] > 0
    text = format_ratios(ratios)
    assert "PASS" in text or "FAIL" in text
    assert not math.isnan(ratios[0].value), "recurrent and chunk at T=32 give the speed-up"
    paired = result.extras["paired"]
    assert paired["chunk_vs_recurrent"]["T"] == 32 and paired["sdpa_vs_linear"]["T"] == 64  # the profile's caps
    for name, ratio in zip(("chunk_vs_recurrent", "delta_vs_sum"), ratios[:2]):
        pair = paired[name]
        assert ratio.value == pair["ratio"] == pair["first_s"] / pair["second_s"] and "timed in turns" in ratio.detail


@pytest.mark.slow
def test_ratios_fall_back_to_the_grid_without_paired_timings(tiny_run):
    _, _, result = tiny_run
    extras = {k: v for k, v in result.extras.items() if k != "paired"}
    frame = bench_frame(result.records)
    ratio = acceptance_ratios(frame, extras)[0]
    rows = frame[(frame["variant"] == "dpfp-delta:nu=1") & (frame["mode"] == FORWARD_BACKWARD) & (frame["T"] == 32)]
    times = rows.set_index("form")["median_s"]
    assert ratio.detail == "from the grid" and ratio.value == pytest.approx(times["recurrent"] / times["chunk"])
    # older or damaged records: no paired block, a skipped pair, a NaN or incomplete pair
    for paired in (None, {"chunk_vs_recurrent": {"T": 32, "skipped": "OutOfMemoryError: …"}},
                   {"chunk_vs_recurrent": {**result.extras["paired"]["chunk_vs_recurrent"], "ratio": math.nan}},
                   {"chunk_vs_recurrent": {"ratio": 50.0}}):
        assert acceptance_ratios(frame, {**extras, "paired": paired})[0].detail == "from the grid"


@pytest.mark.slow
def test_paired_ratios_skip_out_of_memory_but_raise_other_errors(monkeypatch):
    import fwbench.bench.suite as bench

    runner = bench._Runner(TINY, CPU, 1, 2, 8, True, None)
    monkeypatch.setattr(bench, "time_interleaved", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("x")))
    bench._paired_ratios(runner)
    assert all("skipped" in pair for pair in runner.result.extras["paired"].values())
    monkeypatch.setattr(bench, "time_interleaved", lambda *a, **k: (_ for _ in ()).throw(NotImplementedError("bug")))
    with pytest.raises(NotImplementedError, match="bug"):
        bench._paired_ratios(runner)


@pytest.mark.slow
def test_time_table_has_one_row_per_variant_and_form(tiny_run):
    _, _, result = tiny_run
    table = time_table(bench_frame(result.records), FORWARD)
    assert list(table.columns) == ["variant", "form", "T=32", "T=64"]
    assert ("dpfp-delta:nu=1", "chunk") in set(zip(table["variant"], table["form"], strict=True))


@pytest.mark.slow
def test_report_section_draws_the_latest_session(tiny_run, tmp_path):
    directory, store, result = tiny_run
    ratios = acceptance_ratios(bench_frame(result.records), result.extras)
    store.append(summary_record(result.session, result.extras, ratios, {}))
    import pandas as pd

    frame = pd.DataFrame()
    frame.attrs["results_dir"] = str(directory)
    markdown = section_bench(frame, tmp_path)
    assert "## Speed and memory" in markdown and "Acceptance ratios" in markdown
    assert "Benchmark records skipped" not in markdown  # every record fwbench bench writes (ok, skipped, summary) is readable
    assert readable_bench_records(store.records(), BENCH_RECORDS) == (store.records(), [])
    assert (tmp_path / "bench_cpu.png").stat().st_size > 10_000
    empty = pd.DataFrame()
    empty.attrs["results_dir"] = str(tmp_path / "nothing")
    assert "No benchmark records" in section_bench(empty, tmp_path)


@pytest.mark.slow
def test_bench_command_prints_tables_and_ratios(tmp_path, capsys):
    code = main(["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                 "--results-dir", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "forward: median ms" in out and "acceptance ratios" in out and "T=32" in out
    kinds = [json.loads(line)["kind"] for line in (tmp_path / BENCH_RECORDS).read_text().splitlines()]
    assert kinds.count("bench-summary") == 1 and kinds.count("bench") > 1


@pytest.mark.parametrize("argv", [["--profile", "huge"], ["--variants", "nope"], ["--lengths", "0"],
                                  ["--lengths", str(2**63 - 1)]])
def test_bench_command_rejects_bad_input_in_one_line(tmp_path, capsys, argv):
    code = main(["bench", *argv, "--results-dir", str(tmp_path), "--quiet", "--no-extras"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fwbench: error:") and err.count("\n") == 1


def test_bench_command_refuses_a_file_as_results_dir_before_timing_anything(tmp_path, capsys, monkeypatch):
    """`fwbench bench --results-dir FILE` timed the matmul peak and the first case before the first
    append named the option; nothing is timed now (the options are checked first, then the store,
    then the runner times the matmul peak)."""
    from fwbench.bench import suite

    monkeypatch.setattr(suite, "_Runner", lambda *a, **k: pytest.fail("the matmul peak was timed"))
    blocker = tmp_path / "results"
    blocker.write_text("a file, not a directory")
    code = main(["bench", "--lengths", "8", "--results-dir", str(blocker), "--quiet", "--no-extras"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"fwbench: error: --results-dir: got {str(blocker)!r}, which is a file")


def test_the_longest_bench_length_is_what_four_fp32_inputs_leave_of_the_memory(monkeypatch):
    """--lengths 2**63 − 1 raised "Storage size calculation overflowed" from the first case."""
    from fwbench.bench import suite
    from fwbench.errors import FwbenchError

    monkeypatch.setattr(suite, "device_memory_bytes", lambda device: 64 * 2**30)  # 64 GiB
    # 4 tensors · B 2 · H 8 · d_head 64 · 4 bytes = 16 KiB per token: 64 GiB / 16 KiB = 4 Mi tokens
    assert suite.max_length(torch.device("cpu"), 2, 8, 64) == 4 * 2**20
    with pytest.raises(FwbenchError, match=r"^--lengths: got 4194305; expected at most 4194304 on cpu"):
        suite.run_bench("quick", torch.device("cpu"), lengths=[32, 4 * 2**20 + 1], variants=["linear"])


def test_the_machine_memory_is_read_for_a_cpu():
    from fwbench.bench.suite import device_memory_bytes

    assert device_memory_bytes(torch.device("cpu")) == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 2**30


# --------------------------------------------------------------------------------------------
# Regression comparison.
# --------------------------------------------------------------------------------------------


def test_compare_flags_only_ratios_past_the_threshold_and_names_both():
    baseline = {"fast": 1.0, "slow": 2.0}
    regressions = compare({"fast": 1.49, "slow": 3.2, "new": 99.0}, baseline, threshold=1.5)
    assert [r.name for r in regressions] == ["slow"]
    message = regressions[0].message()
    assert "slow" in message and "3.200" in message and "2.000" in message and "1.60×" in message


@pytest.mark.parametrize("threshold", [1.0, 0.5])
def test_compare_rejects_a_threshold_that_is_not_a_slowdown(threshold):
    with pytest.raises(ValueError, match="threshold"):
        compare({"a": 1.0}, {"a": 1.0}, threshold)


def test_baseline_round_trip_keeps_benchmarks_not_measured_now(tmp_path):
    path = tmp_path / "baseline.json"
    write_baseline({"a": 1.5, "b": 2.0}, {"a": 0.1}, {"torch": "x"}, path)
    write_baseline({"a": 1.25}, {}, {"torch": "y"}, path)
    assert load_baseline(path) == {"a": 1.25, "b": 2.0}
    assert load_baseline(tmp_path / "missing.json") == {}


#: Cases added after a committed baseline was measured, on a CPU not at hand since: the gate skips them
#: there, saying `nox -s bench -- --update-baseline -k NAME` adds them (the one-direction cases came
#: from an AMD EPYC family 25 model 17; the Intel Xeon's file and the older AMD one lack them).
NOT_YET_MEASURED = {
    "perf_baseline.json": {"softmax_parallel_train_forward_T1024", "softmax_parallel_backward_T1024",
                           "fwm_rule_kernel_train_forward_T256", "fwm_rule_kernel_backward_T256",
                           "delta_write_read_train_forward_T1024", "delta_write_read_backward_T1024"},
}
NOT_YET_MEASURED["perf_baseline-amd-epyc.json"] = NOT_YET_MEASURED["perf_baseline.json"]


def test_committed_baseline_names_every_tracked_benchmark():
    for path in sorted(BASELINE_DIR.glob("perf_baseline*.json")):
        expected = {case.name for case in PERF_CASES} - NOT_YET_MEASURED.get(path.name, set())
        assert set(load_baseline(path)) == expected, path.name
        assert baseline_cpu(path), f"{path.name} does not say which CPU measured it"
        assert baseline_path_for(baseline_cpu(path)) == path  # each file is found again for its CPU


def _baseline_on(path, cpu: str, ratio: float = 1.0):
    write_baseline({"a": ratio}, {}, {"device_name": cpu}, path)
    return path


def test_each_cpu_is_judged_against_its_own_baseline(tmp_path):
    """Ratios differ between machines (the cases read 0.31-0.99x their Intel Xeon ratios on an AMD
    EPYC: a planted 2x slowdown of the sum rule read 3.6x against a limit of 4.33x and passed)."""
    intel = _baseline_on(tmp_path / "perf_baseline.json", "Intel(R) Xeon(R) Processor", 2.0)
    assert choose_baseline("Intel(R) Xeon(R) Processor", tmp_path) == (intel, None)
    # no baseline of its own: the first one, with a warning naming both CPUs and how to make one
    path, warning = choose_baseline("AMD EPYC", tmp_path)
    assert path == intel
    assert "'AMD EPYC'" in warning and "'Intel(R) Xeon(R) Processor'" in warning
    assert "perf_baseline-amd-epyc.json" in warning and "--update-baseline" in warning
    # --update-baseline there writes the AMD file and leaves the Intel one as it was
    own = baseline_path_for("AMD EPYC", tmp_path)
    assert own == tmp_path / "perf_baseline-amd-epyc.json"
    _baseline_on(own, "AMD EPYC", 0.5)
    assert choose_baseline("AMD EPYC", tmp_path) == (own, None)
    assert load_baseline(own) == {"a": 0.5} and load_baseline(intel) == {"a": 2.0}
    assert choose_baseline("Intel(R) Xeon(R) Processor", tmp_path) == (intel, None)


def test_the_first_baseline_file_is_written_where_there_is_none(tmp_path):
    assert baseline_path_for("AMD EPYC", tmp_path) == tmp_path / "perf_baseline.json"
    assert baseline_cpu(tmp_path / "perf_baseline.json") is None
    _baseline_on(tmp_path / "perf_baseline.json", "Intel(R) Xeon(R) Processor")
    assert baseline_path_for("Weird CPU @ 2.0GHz (x/y)", tmp_path) == tmp_path / "perf_baseline-weird-cpu-2-0ghz-x-y.json"


@pytest.mark.slow
def test_short_benchmarks_are_within_the_gross_threshold_of_the_baseline():
    """CI's performance check (the short subset of ``nox -s bench``, gross threshold)."""
    torch.set_num_threads(1)
    measured = {case.name: measure_ratio(case, rounds=5)[0] for case in PERF_CASES if case.short}
    regressions = compare(measured, load_baseline(choose_baseline(cpu_identity(), model=cpu_model())[0]), GROSS_THRESHOLD)
    assert not regressions, "; ".join(r.message() for r in regressions)


def test_paired_ratio_follows_load_that_hits_both_sides_and_ignores_one_sided_bursts():
    # the load doubles both times from round 3 on; a burst hits only the case in round 1 and only
    # the calibration in round 6: every other round's ratio is 2.0, and so is the median
    calibration = [0.010, 0.010, 0.020, 0.020, 0.020, 0.030]
    case = [0.050, 0.020, 0.040, 0.040, 0.040, 0.020]
    assert paired_ratio(case, calibration) == pytest.approx(2.0)
    # the old figure: the case's median over one calibration timed before it, in a quiet stretch
    assert statistics.median(case) / min(calibration) == pytest.approx(4.0)


@pytest.mark.parametrize("case, calibration", [([], []), ([1.0], [1.0, 2.0]), ([1.0, 0.0], [1.0, 1.0])])
def test_paired_ratio_refuses_unpaired_or_empty_or_non_positive_times(case, calibration):
    with pytest.raises(ValueError, match="case_times, calibration_times"):
        paired_ratio(case, calibration)


def test_confirmed_ratio_remeasures_only_past_the_limit_and_keeps_the_smallest():
    again = iter([1.9, 1.2, 5.0])
    assert confirmed_ratio(1.0, lambda: next(again), limit=1.5, pause_s=0) == (1.0, [1.0])
    assert confirmed_ratio(2.0, lambda: next(again), limit=1.5, pause_s=0) == (1.2, [2.0, 1.9, 1.2])
    slower = iter([2.1, 1.9, 2.2, 1.8, 1.0])  # a slower kernel: every repetition is past the limit
    assert confirmed_ratio(2.0, lambda: next(slower), limit=1.5, confirmations=4, pause_s=0) == (
        1.8, [2.0, 2.1, 1.9, 2.2, 1.8])


def test_cpu_seconds_leaves_out_time_spent_waiting():
    assert cpu_seconds(lambda: time.sleep(0.2)) < 0.05
    assert cpu_seconds(lambda: sum(range(2_000_000))) > 0.005


def test_measure_ratio_times_the_case_and_the_calibration_in_turns(monkeypatch):
    import fwbench.bench.regression as regression

    calls = []
    monkeypatch.setattr(regression, "calibration_workload", lambda: lambda: calls.append("calibration"))
    case = PerfCase("planted", lambda: lambda: calls.append("case"))
    ratio, _, _ = measure_ratio(case, rounds=4)
    assert calls == ["case", "calibration"] + ["calibration", "case", "case", "calibration"] * 2
    assert ratio > 0


@pytest.mark.parametrize("name, module_name, kernel", [
    ("delta_rule_chunk_kernel_T1024", "delta_rule", "delta_rule_chunk"),
    ("sum_rule_chunk_kernel_T1024", "sum_rule", "sum_rule_chunk"),
])
def test_a_kernel_case_calls_its_kernel_as_it_is_at_call_time(monkeypatch, name, module_name, kernel):
    """``--plant-slowdown`` replaces the kernel after the case is built: the case must reach the
    replacement, once per call, with sum-normalised (B, H, T, d_dot) q, k."""
    import importlib

    module = importlib.import_module(f"fwbench.variants.kernels.{module_name}")
    case = {c.name: c for c in PERF_CASES}[name]
    fn, original, calls = case.build(), getattr(module, kernel), []

    def counted(q, k, *args, **kwargs):
        calls.append((q.shape, k.sum(-1)))
        return original(q, k, *args, **kwargs)

    monkeypatch.setattr(module, kernel, counted)
    fn()
    assert len(calls) == 1
    shape, key_sums = calls[0]
    assert shape == (2, 8, 1024, 128)
    torch.testing.assert_close(key_sums, torch.ones_like(key_sums))


def test_two_cpus_whose_names_give_one_file_name_keep_their_own_baselines(tmp_path):
    """Break-it finding: "AMD-EPYC" gives the file name of "AMD EPYC"'s baseline, so it was judged
    against the other CPU's ratios with no warning, and --update-baseline overwrote that file."""
    intel = _baseline_on(tmp_path / "perf_baseline.json", "Intel(R) Xeon(R) Processor", 2.0)
    amd = _baseline_on(tmp_path / "perf_baseline-amd-epyc.json", "AMD EPYC", 0.5)
    other = baseline_path_for("AMD-EPYC", tmp_path)
    assert other not in (intel, amd) and other.name.startswith("perf_baseline-amd-epyc-")
    path, warning = choose_baseline("AMD-EPYC", tmp_path)
    assert path == intel and "'AMD-EPYC'" in warning and other.name in warning
    _baseline_on(other, "AMD-EPYC", 0.7)
    assert choose_baseline("AMD-EPYC", tmp_path) == (other, None)
    assert choose_baseline("AMD EPYC", tmp_path) == (amd, None) and load_baseline(amd) == {"a": 0.5}
    assert baseline_path_for("AMD-EPYC", tmp_path) == other


@pytest.mark.parametrize("environment", [{}, {"device": "cpu"}, None], ids=["none", "no-device-name", "null"])
def test_a_default_baseline_that_names_no_cpu_is_no_cpus_own(tmp_path, environment):
    """Break-it finding: a perf_baseline.json without environment.device_name (an older file) was
    taken as every CPU's own: "AMD EPYC" was judged against it although perf_baseline-amd-epyc.json
    was measured there, and any other CPU with no warning; now the AMD file, and a warning naming
    the unknown origin (``"environment": null`` raised AttributeError)."""
    default = tmp_path / "perf_baseline.json"
    default.write_text(json.dumps({"benchmarks": {"a": {"ratio": 2.0}}, "environment": environment}))
    amd = _baseline_on(tmp_path / "perf_baseline-amd-epyc.json", "AMD EPYC", 0.5)
    assert choose_baseline("AMD EPYC", tmp_path) == (amd, None)
    path, warning = choose_baseline("Intel(R) Xeon(R) Processor", tmp_path)
    assert path == default and "does not name" in warning
    assert baseline_path_for("Intel(R) Xeon(R) Processor", tmp_path).name == "perf_baseline-intel-r-xeon-r-processor.json"


def test_no_baseline_at_all_says_nothing_is_judged(tmp_path):
    path, warning = choose_baseline("AMD EPYC", tmp_path)
    assert path == tmp_path / "perf_baseline.json" and "nothing is judged" in warning


NO_BASELINE_CPU, NO_BASELINE_MODEL = "Intel(R) Xeon(R) Processor [family 6, model 207, AVX512]", "Intel(R) Xeon(R) Processor"
# another CPU's baseline, of a model no machine has: the gate run in a subprocess judges the host's own CPU, and a
# real model's file (it was AMD EPYC's) was the host's own on such a machine ('fwbench baseline:
# perf_baseline-amd-epyc.json' where 'no baseline file' was expected: the test failed on every AMD EPYC host)
OTHER_MODEL, OTHER_FILE = "Other Test CPU", "perf_baseline-other-test-cpu.json"


def _no_baseline_directory(tmp_path, kind: str):
    """A baselines directory holding no file to judge ``NO_BASELINE_CPU`` against: an empty one, one that does
    not exist, or one holding only another CPU's file (good, or corrupt)."""
    directory = tmp_path / "baselines"
    if kind != "missing":
        directory.mkdir()
    if kind == "other CPU only":
        _baseline_on(directory / OTHER_FILE, OTHER_MODEL, 0.5)
    if kind == "corrupt other CPU only":
        (directory / OTHER_FILE).write_text("")
    return directory


@pytest.mark.parametrize("kind", ["empty", "missing", "other CPU only", "corrupt other CPU only"])
def test_no_baseline_file_at_all_judges_nothing_with_one_warning_saying_how_to_make_one(tmp_path, kind):
    """Where no file can judge this CPU (no perf_baseline.json, none of its own or of its model), the gate
    stopped: judged_baseline read the torch version of the missing perf_baseline.json, 'baseline
    .../perf_baseline.json: cannot be read (FileNotFoundError ...) ... (fix the file or delete it)', advice
    that cannot help. Now nothing is judged, with one warning saying so and how to make a baseline."""
    directory = _no_baseline_directory(tmp_path, kind)
    judged = judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL)
    missing = " (no such directory)" if kind == "missing" else ""
    left_out = (f"; {OTHER_FILE} is left out of the search for a file of model "
                f"{NO_BASELINE_MODEL!r}: baseline {directory / OTHER_FILE}: the file is empty; "
                f"expected {BASELINE_FORMAT} (fix the file or delete it)" if kind.startswith("corrupt") else "")
    assert judged == JudgedBaseline({}, (), (
        f"no performance baseline in {directory}{missing}: none was measured on this CPU ({NO_BASELINE_CPU!r}) and "
        "there is no perf_baseline.json, so nothing is judged. On a quiet machine, `nox -s bench -- --update-baseline` "
        f"writes perf_baseline.json for this CPU{left_out}",))
    assert judged.where() == "no baseline file"
    # and --update-baseline writes the first file there (the directory made where it is missing)
    assert baseline_path_for(NO_BASELINE_CPU, directory) == directory / "perf_baseline.json"


GATE_IN_DIRECTORY = """import functools

from fwbench.bench import regression

# loaded with -p, before benchmarks/conftest.py imports them: the gate judges against, and --update-baseline
# writes to, {directory!r}, not results/baselines/ (a directory given by the caller is kept: choose_baseline's)
judge, own_path = regression.judged_baseline, regression.baseline_path_for
regression.judged_baseline = functools.partial(judge, directory={directory!r})
regression.baseline_path_for = lambda cpu, directory={directory!r}: own_path(cpu, directory)
"""


def _gate(tmp_path, directory, *options: str) -> subprocess.CompletedProcess:
    """``python -m pytest benchmarks --collect-only OPTIONS`` with the gate's baselines in ``directory``."""
    (tmp_path / "gate_in_directory.py").write_text(GATE_IN_DIRECTORY.format(directory=str(directory)))
    root = Path(__file__).resolve().parents[2]
    environment = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    return subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-p", "gate_in_directory", "-p",
                           "no:cacheprovider", "--collect-only", *options], cwd=root, capture_output=True, text=True,
                          timeout=300, env=environment)


@pytest.mark.parametrize("kind", ["empty", "missing", "other CPU only"])
def test_the_gate_without_any_baseline_runs_and_warns_instead_of_stopping(tmp_path, kind):
    """``python -m pytest benchmarks`` on a baselines directory with no file to judge this CPU against: it stopped
    with 'ERROR: baseline .../perf_baseline.json: cannot be read (FileNotFoundError ...)' (exit 4), collecting
    nothing; now it collects every case and says, before and after, that nothing is judged and how to make a baseline."""
    done = _gate(tmp_path, _no_baseline_directory(tmp_path, kind))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fwbench baseline: no baseline file\n" in done.stdout
    warnings = [line for line in done.stdout.splitlines() if line.startswith("WARNING: ")]
    # one warning, said before the cases and again beside the verdict (as every baseline warning is)
    assert len(warnings) == 2 and len(set(warnings)) == 1 and "nothing is judged" in warnings[0], done.stdout
    assert "`nox -s bench -- --update-baseline` writes perf_baseline.json" in warnings[0]
    assert all(f"<Function test_perf[{case.name}]>" in done.stdout for case in PERF_CASES), done.stdout


def test_a_baselines_directory_that_is_a_file_is_refused_in_one_line(tmp_path):
    """results/baselines/ a file: judged, it was called missing ('(no such directory) ... nothing is judged',
    advising --update-baseline), and --update-baseline measured every case (minutes), then ended in an
    INTERNALERROR, FileExistsError, writing the baseline. Now both stop before any case, in one line."""
    directory = tmp_path / "baselines"
    directory.write_text("not a directory\n")
    expected = (f"baseline directory {directory}: got a file, not a directory; expected the directory of the baseline "
                "files (perf_baseline*.json), or no such path (move the file away)")
    for call in (lambda: judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL),
                 lambda: baseline_path_for(NO_BASELINE_CPU, directory)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == expected
    for options in ((), ("--update-baseline",)):
        done = _gate(tmp_path, directory, *options)
        assert done.returncode == 4 and done.stderr == f"ERROR: {expected}\n\n", done.stdout + done.stderr


@pytest.mark.parametrize("kind", ["dangling link", "under a file", "under a dangling link"])
def test_a_baselines_directory_that_cannot_be_made_is_refused_in_one_line(tmp_path, kind):
    """Break-it finding (h-breakA): results/baselines a link to a directory that does not exist (a moved or
    unmounted share), or a path under a file: as C196's file, judged it was called missing ('(no such
    directory) ... nothing is judged', advising --update-baseline), and --update-baseline measured every case,
    then failed writing (FileExistsError; NotADirectoryError). Now both stop before any case, in one line."""
    target = tmp_path / "gone"
    if kind == "under a file":
        (tmp_path / "results").write_text("a file\n")
        directory = tmp_path / "results" / "baselines"
        got, fix = f"a path under {tmp_path / 'results'}, a file", "move the file away"
    else:
        link = tmp_path / ("baselines" if kind == "dangling link" else "results")
        link.symlink_to(target)
        directory = tmp_path / "results" / "baselines" if kind == "under a dangling link" else link
        where = "a link" if link == directory else f"a path under {link}, a link"
        got, fix = f"{where} to {str(target)!r}, which does not exist", "create the link's target or remove the link"
    expected = (f"baseline directory {directory}: got {got}; expected the directory of the baseline files "
                f"(perf_baseline*.json), or no such path ({fix})")
    for call in (lambda: judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL),
                 lambda: baseline_path_for(NO_BASELINE_CPU, directory)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == expected
    if kind == "dangling link":
        for options in ((), ("--update-baseline",)):
            done = _gate(tmp_path, directory, *options)
            assert done.returncode == 4 and done.stderr == f"ERROR: {expected}\n\n", done.stdout + done.stderr
    assert not target.exists()


@pytest.mark.parametrize("kind", ["link to itself", "two links to each other", "under a looping link"])
def test_a_baselines_directory_that_is_a_looping_link_is_told_so(tmp_path, kind):
    """Break-it finding (h-breakC): results/baselines a link that loops (``ln -s baselines baselines``, or two links
    to each other) was refused as "a link to 'baselines', which does not exist" advising "create the link's target"
    (it exists: it is the link, and mkdir there fails as the gate did). It is called a loop, to be removed."""
    link = tmp_path / ("results" if kind == "under a looping link" else "baselines")
    if kind == "two links to each other":
        (tmp_path / "other").symlink_to(link)
        link.symlink_to(tmp_path / "other")
        target = tmp_path / "other"
    else:
        link.symlink_to(link)
        target = link
    directory = tmp_path / "results" / "baselines" if kind == "under a looping link" else link
    where = "a link" if link == directory else f"a path under {link}, a link"
    expected = (f"baseline directory {directory}: got {where} to {str(target)!r}, which leads back to it (a loop); "
                "expected the directory of the baseline files (perf_baseline*.json), or no such path (remove the link or "
                "point it at a directory)")
    for call in (lambda: judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL),
                 lambda: baseline_path_for(NO_BASELINE_CPU, directory)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == expected
    if kind == "link to itself":
        done = _gate(tmp_path, directory, "--update-baseline")
        assert done.returncode == 4 and done.stderr == f"ERROR: {expected}\n\n", done.stdout + done.stderr


@pytest.mark.parametrize("kind", ["a loop", "into a missing directory", "under a file"])
def test_a_baseline_file_that_is_a_link_no_file_can_be_made_through_is_refused_before_measuring(tmp_path, kind):
    """Break-it finding (h-breakH): results/baselines/perf_baseline.json a link that loops, or a link to nothing in a
    directory that does not exist or under a file (``ln -s ../nodir/p.json perf_baseline.json``): it was taken as
    free; the gate said "there is no perf_baseline.json, so nothing is judged" and passed, and ``--update-baseline``
    measured every case, then failed writing it (an OSError). Both stop first, in one line naming the link; the advice
    followed (the link removed), the gate goes on."""
    directory = tmp_path / "baselines"
    directory.mkdir()
    link = directory / "perf_baseline.json"
    if kind == "a loop":
        link.symlink_to("perf_baseline.json")
        why = "a link that leads back to itself (a loop)"
        remedy = "remove the link or point it at a baseline file"
    elif kind == "under a file":
        (tmp_path / "notes.txt").write_text("notes\n")
        link.symlink_to("../notes.txt/p.json")
        why = ("a link to '../notes.txt/p.json', which does not exist and cannot be made "
               f"({str(tmp_path / 'notes.txt')!r} is a file)")
        remedy = "remove the link or point it elsewhere"
    else:
        link.symlink_to("../nodir/p.json")
        why = (f"a link to '../nodir/p.json', which does not exist, in a directory that does not exist "
               f"({str(tmp_path / 'nodir')!r})")
        remedy = f"create {str(tmp_path / 'nodir')!r} or remove the link"
    expected = (f"baseline {link}: got {why}; expected a baseline file, or a link to one that can be made ({remedy})")
    for call in (lambda: judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL),
                 lambda: baseline_path_for(NO_BASELINE_CPU, directory)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == expected
    for options in ((), ("--update-baseline",)):
        done = _gate(tmp_path, directory, *options)
        assert done.returncode == 4 and done.stderr == f"ERROR: {expected}\n\n", done.stdout + done.stderr
    link.unlink()  # the advice followed
    assert baseline_path_for(NO_BASELINE_CPU, directory) == link


def test_a_baseline_file_that_is_a_named_pipe_is_refused_not_read(tmp_path):
    """Break-it finding (h-breakH): results/baselines/perf_baseline.json a named pipe (``mkfifo``): the gate, judged
    or with --update-baseline, hung for ever reading it (read_baseline's read_text blocks until something writes to
    it), with no word. It is refused as a file that is not a baseline, in one line; the advice followed (the pipe
    deleted), the gate goes on."""
    directory = tmp_path / "baselines"
    directory.mkdir()
    pipe = directory / "perf_baseline.json"
    os.mkfifo(pipe)
    expected = (f"baseline {pipe}: got a named pipe (FIFO), not a file; expected {BASELINE_FORMAT} (fix the file or "
                "delete it)")
    # in a subprocess with a timeout: the old code blocks in the read
    probe = ("import sys; from pathlib import Path\n"
             "from fwbench.bench.regression import baseline_path_for, judged_baseline\n"
             "for call in (lambda: judged_baseline(sys.argv[2], Path(sys.argv[1]), model=sys.argv[3]),\n"
             "             lambda: baseline_path_for(sys.argv[2], Path(sys.argv[1]))):\n"
             "    try:\n        call()\n    except ValueError as exc:\n        print(exc)\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", probe, str(directory), NO_BASELINE_CPU, NO_BASELINE_MODEL], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout == f"{expected}\n{expected}\n", done.stdout + done.stderr
    for options in ((), ("--update-baseline",)):
        gate = _gate(tmp_path, directory, *options)
        assert gate.returncode == 4 and gate.stderr == f"ERROR: {expected}\n\n", gate.stdout + gate.stderr
    pipe.unlink()  # the advice followed
    assert baseline_path_for(NO_BASELINE_CPU, directory) == pipe


@pytest.mark.parametrize("kind", ["a link", "a chain of links", "under such a link"])
def test_a_baselines_directory_that_leads_into_another_links_loop_names_that_link(tmp_path, kind):
    """Break-it finding (h-breakH): results/baselines a link into the loop of another link (``ln -s loop/sub
    baselines; ln -s loop loop``; a chain, or a path under such a link) was called "a link to 'loop/sub', which leads
    back to it (a loop)": it does not lead back to itself, and 'loop', the link that loops, went unnamed. Each link is
    named to the one that loops; the advice followed (the link pointed at a directory), the gate goes on."""
    (tmp_path / "loop").symlink_to("loop")
    link = tmp_path / ("results" if kind == "under such a link" else "baselines")
    if kind == "a chain of links":
        link.symlink_to("mid")
        (tmp_path / "mid").symlink_to("loop/sub")
        named = "'mid', a link to 'loop/sub'"
    else:
        link.symlink_to("loop/sub")
        named = "'loop/sub'"
    directory = tmp_path / "results" / "baselines" if kind == "under such a link" else link
    where = "a link" if link == directory else f"a path under {link}, a link"
    expected = (f"baseline directory {directory}: got {where} to {named}, which leads into {str(tmp_path / 'loop')!r}, "
                "a link that leads back to itself (a loop); expected the directory of the baseline files "
                "(perf_baseline*.json), or no such path (remove the link or point it at a directory)")
    for call in (lambda: judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL),
                 lambda: baseline_path_for(NO_BASELINE_CPU, directory)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == expected
    link.unlink()  # the advice followed
    (tmp_path / "d").mkdir()
    link.symlink_to("d")
    assert baseline_path_for(NO_BASELINE_CPU, directory).parent == directory


def test_a_baselines_directory_that_links_to_itself_by_another_spelling_is_a_loop_of_its_own(tmp_path):
    """Break-it finding (h-breakJ): results/baselines a link to itself by an absolute path through a linked directory
    (``ln -s /via/baselines baselines``, /via a link to its directory) was "a link to '…/via/baselines', which leads
    into '…/via/baselines', a link that leads back to itself (a loop)", as if it led into another link's loop: it is
    its own, as ``ln -s baselines baselines`` is (C215)."""
    (tmp_path / "via").symlink_to(tmp_path)
    directory = tmp_path / "baselines"
    directory.symlink_to(tmp_path / "via" / "baselines")
    expected = (f"baseline directory {directory}: got a link to {str(tmp_path / 'via' / 'baselines')!r}, which leads "
                "back to it (a loop); expected the directory of the baseline files (perf_baseline*.json), or no such "
                "path (remove the link or point it at a directory)")
    for call in (lambda: judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL),
                 lambda: baseline_path_for(NO_BASELINE_CPU, directory)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == expected


def test_a_baselines_directory_that_is_a_link_to_a_link_to_nothing_names_each_link(tmp_path):
    """Break-it finding (h-breakC): results/baselines -> b -> gone was refused as "a link to 'b', which does not exist",
    advising "create the link's target": b exists (a link), and mkdir b fails. Each link is named, to the missing end."""
    (tmp_path / "b").symlink_to(tmp_path / "gone")
    directory = tmp_path / "baselines"
    directory.symlink_to(tmp_path / "b")
    expected = (f"baseline directory {directory}: got a link to {str(tmp_path / 'b')!r}, a link to "
                f"{str(tmp_path / 'gone')!r}, which does not exist; expected the directory of the baseline files "
                f"(perf_baseline*.json), or no such path (create {str(tmp_path / 'gone')!r} or remove the links)")
    for call in (lambda: judged_baseline(NO_BASELINE_CPU, directory, model=NO_BASELINE_MODEL),
                 lambda: baseline_path_for(NO_BASELINE_CPU, directory)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == expected


def test_a_chain_of_relative_links_to_nothing_advises_the_path_that_mends_it(tmp_path, monkeypatch):
    """Break-it finding (h-breakE): results/baselines -> b -> ../gone/deep, each link relative (as ``ln -s b baselines``
    makes it), the gate run from the repository's root: it advised "create '../gone/deep'", which, followed there,
    made a directory beside the repository, and the links still led to nothing. The path to create is named as
    reached from anywhere, and following the advice mends the directory."""
    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    monkeypatch.chdir(repo)
    directory = Path("results") / "baselines"
    directory.symlink_to("b")
    (directory.parent / "b").symlink_to("../gone/deep")
    with pytest.raises(ValueError) as caught:
        baseline_path_for(NO_BASELINE_CPU, directory)
    advised = re.search(r"\(create '([^']+)' or remove the links\)$", str(caught.value))
    assert advised, str(caught.value)
    os.makedirs(advised.group(1))  # following the advice, from where the gate ran
    assert baseline_path_for(NO_BASELINE_CPU, directory).parent == directory


@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_baselines_directory_that_is_a_link_to_a_link_to_a_file_names_each_link(tmp_path, under):
    """Break-it finding (h-breakF): results/baselines a link to a link to a file (``ln -s mid baselines; ln -s
    notes.txt mid``) was "a link to 'mid', a file, not a directory": mid is a link. Each link is named to the file;
    the advice followed, the gate goes on."""
    (tmp_path / "notes.txt").write_text("not a directory")
    (tmp_path / "mid").symlink_to("notes.txt")
    link = tmp_path / "baselines"
    link.symlink_to("mid")
    directory = link / "cpu" if under else link
    with pytest.raises(ValueError) as caught:
        baseline_path_for(NO_BASELINE_CPU, directory)
    assert "a link to 'mid', a link to 'notes.txt', a file, not a directory" in str(caught.value), str(caught.value)
    assert str(caught.value).endswith("(remove the link or point it at a directory)"), str(caught.value)
    link.unlink()  # the advice followed
    assert baseline_path_for(NO_BASELINE_CPU, directory).parent == directory


@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_baselines_directory_that_is_a_link_to_a_file_is_told_so(tmp_path, under):
    """Break-it finding (h-breakE): results/baselines a link to a file (or a path under such a link) was refused as "a
    file, not a directory" advising "move the file away": followed, the link led to nothing, refused next (C203).
    The link is named, and removing it, as advised, lets the gate go on."""
    (tmp_path / "notes.txt").write_text("not a directory")
    link = tmp_path / "baselines"
    link.symlink_to("notes.txt")
    directory = link / "cpu" if under else link
    with pytest.raises(ValueError) as caught:
        baseline_path_for(NO_BASELINE_CPU, directory)
    assert "a link to 'notes.txt', a file, not a directory" in str(caught.value), str(caught.value)
    assert str(caught.value).endswith("(remove the link or point it at a directory)"), str(caught.value)
    link.unlink()  # the advice followed
    assert baseline_path_for(NO_BASELINE_CPU, directory).parent == directory


@pytest.mark.parametrize("chained", [True, False], ids=["a chain", "one link"])
@pytest.mark.parametrize("command", ["gate", "run"])
def test_a_chain_of_links_through_a_directory_link_to_nothing_advises_a_path_that_can_be_made(tmp_path, capsys,
                                                                                              command, chained):
    """Break-it finding (h-breakF): a chain of links whose end lies under a link to nothing (``ln -s mid L; ln -s
    d/sub mid; ln -s gone d``) was advised "create '…/d/sub'": ``mkdir -p`` says 'File exists' (d, a link to
    nothing); for one link (``ln -s d/sub L``) the gate said "create the link's target", d/sub. The end is named with
    its directories' links resolved, '…/gone/sub'; followed, the gate goes on and ``fwbench run --results-dir L``
    (told by the same link_chain) stores its record."""
    from fwbench.cli import main

    link = tmp_path / "L"
    if chained:
        link.symlink_to("mid")
        (tmp_path / "mid").symlink_to("d/sub")
    else:
        link.symlink_to("d/sub")
    (tmp_path / "d").symlink_to("gone")
    end = str(tmp_path / "gone" / "sub")
    grid = tmp_path / "grid.toml"
    grid.write_text('name = "one"\ntask = "retrieval"\n[defaults]\neval_every = 2\neval_sequences = 2\n'
                    'batch_size = 2\nmax_steps = 2\nd_key = 4\n[profiles.quick]\nvariant = "linear"\nS = 3\nseed = 1\n')
    argv = ["run", str(grid), "--results-dir", str(link), "--quiet"]
    if command == "gate":
        with pytest.raises(ValueError) as caught:
            baseline_path_for(NO_BASELINE_CPU, link)
        message = str(caught.value)
    else:
        assert main(argv) == 2
        message = capsys.readouterr().err.strip()
    assert message.endswith(f"(create {end!r} or remove the link{'s' if chained else ''})"), message
    os.makedirs(end)  # the advice followed, as mkdir -p
    if command == "gate":
        assert baseline_path_for(NO_BASELINE_CPU, link).parent == link
    else:
        assert main(argv) == 0 and (link / "runs.jsonl").is_file()


@pytest.mark.parametrize("chained", [False, True], ids=["a link", "a link to a link"])
@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_baselines_directory_linked_under_a_file_is_not_advised_to_be_created(tmp_path, under, chained):
    """Break-it finding (h-breakF): results/baselines a link to a path under a file (``ln -s notes.txt/sub
    baselines``) was advised "create the link's target or remove the link" (for a chain, "create '…/notes.txt/sub'"):
    no one can create it, notes.txt being a file. The file is named and the link advised to be removed or repointed;
    followed, the gate goes on."""
    (tmp_path / "notes.txt").write_text("not a directory")
    link = tmp_path / "baselines"
    if chained:
        link.symlink_to("mid")
        (tmp_path / "mid").symlink_to("notes.txt/sub")
    else:
        link.symlink_to("notes.txt/sub")
    directory = link / "cpu" if under else link
    with pytest.raises(ValueError) as caught:
        baseline_path_for(NO_BASELINE_CPU, directory)
    chain = "'mid', a link to 'notes.txt/sub'" if chained else "'notes.txt/sub'"
    assert (f"a link to {chain}, which does not exist and cannot be made ({str(tmp_path / 'notes.txt')!r} is a "
            "file)") in str(caught.value), str(caught.value)
    assert str(caught.value).endswith("(remove the link or point it at a directory)"), str(caught.value)
    link.unlink()  # the advice followed
    assert baseline_path_for(NO_BASELINE_CPU, directory).parent == directory


def test_a_cpus_own_baseline_is_found_when_an_earlier_file_name_is_free(tmp_path):
    """Break-it finding (h-break14u): the first candidate file name that was free or this CPU's was
    taken, so a CPU's own perf_baseline-<cpu>.json was passed over where perf_baseline.json did not
    exist (judged against nothing; --update-baseline wrote a second file), and its hashed file where
    the plain name was free."""
    amd = _baseline_on(tmp_path / "perf_baseline-amd-epyc.json", "AMD EPYC", 0.5)
    assert baseline_path_for("AMD EPYC", tmp_path) == amd
    assert choose_baseline("AMD EPYC", tmp_path) == (amd, None)
    amd.unlink()
    hashed = _baseline_on(tmp_path / f"perf_baseline-amd-epyc-{hashlib.sha256(b'AMD EPYC').hexdigest()[:8]}.json",
                          "AMD EPYC", 0.7)
    _baseline_on(tmp_path / "perf_baseline.json", "Intel(R) Xeon(R) Processor", 2.0)
    assert baseline_path_for("AMD EPYC", tmp_path) == hashed
    assert choose_baseline("AMD EPYC", tmp_path) == (hashed, None)
    assert load_baseline(choose_baseline("AMD EPYC", tmp_path)[0]) == {"a": 0.7}


@pytest.mark.parametrize("cpu", ["é" * 300, "x" * 400, "Intel(R) Xeon(R) " * 40])
def test_a_cpu_name_too_long_for_a_file_name_gets_a_short_hashed_one(tmp_path, cpu):
    """Break-it finding: "é" * 300 gave a 600-byte file name, and exists() raised OSError (File name too long)."""
    _baseline_on(tmp_path / "perf_baseline.json", "Intel(R) Xeon(R) Processor", 2.0)
    path = baseline_path_for(cpu, tmp_path)
    assert len(path.name.encode()) <= 100 and path.name.endswith(f"-{hashlib.sha256(cpu.encode()).hexdigest()[:8]}.json")
    _baseline_on(path, cpu, 0.3)
    assert choose_baseline(cpu, tmp_path) == (path, None)
    assert baseline_path_for(cpu + "y", tmp_path) != path  # names that share the cut part stay apart


@pytest.mark.parametrize(("text", "wrong"), [
    ("", "the file is empty"),
    ('<<<<<<< HEAD\n{"benchmarks": {}}\n=======\n{}\n>>>>>>> other\n', "git conflict markers"),
    ("[1, 2]", "got a JSON list"),
    ('{"benchmarks": [1]}', '"benchmarks" is a list'),
    ('{"environment": {}}', 'no "benchmarks" object'),
    ('{"benchmarks": {"a": {"ratio": "1.5"}}}', "benchmarks.a.ratio: got '1.5'"),
    ('{"benchmarks": {"a": {"ratio": null}}}', "benchmarks.a.ratio: got None"),
    ('{"benchmarks": {"a": {"ratio": NaN}}}', "benchmarks.a.ratio: got nan"),
    ('{"benchmarks": {"a": {"ratio": -1}}}', "benchmarks.a.ratio: got -1"),
    ('{"benchmarks": {"a": 2}}', "benchmarks.a: got 2"),
    ('{"benchmarks": {}, "environment": {"device_name": 3}}', "environment.device_name: got 3"),
    ("{not json", "not JSON"),
    ('{"benchmarks": {"a": {"ratio": 1' + "0" * 400 + "}}}", "benchmarks.a.ratio: got 1000"),
    ('{"benchmarks": {"a": {"ratio": 1' + "0" * 5000 + "}}}", "not JSON that Python reads (ValueError: Exceeds"),
    ('{"benchmarks": ' + "[" * 100_000 + "]" * 100_000 + "}", "not JSON that Python reads (RecursionError: "),
    ('{"benchmarks": {"a\\nb": {"ratio": -1}}}', "benchmarks.'a\\nb'.ratio: got -1"),
    ('{"benchmarks": {"a\\rb": 2}}', "benchmarks.'a\\rb': got 2"),
], ids=["empty", "conflict", "list", "benchmarks-list", "no-benchmarks", "string", "null", "nan", "negative",
        "entry", "cpu-number", "syntax", "int-past-float", "int-past-4300-digits", "nested-deep", "name-newline",
        "name-return"])
def test_a_malformed_baseline_is_refused_in_one_line(tmp_path, text, wrong):
    """Break-it finding: each crashed the gate (pytest INTERNALERROR, KeyError, TypeError) or, with no
    CPU name it could read, passed for another CPU's file. Three more (h-break14v) were still an
    OverflowError, a ValueError not naming the file, and a RecursionError; a case name holding a
    newline split the refusal over two lines (h-break14w)."""
    path = tmp_path / "perf_baseline.json"
    path.write_text(text)
    for read in (load_baseline, baseline_cpu, lambda p: choose_baseline("AMD EPYC", p.parent)):
        with pytest.raises(ValueError) as caught:
            read(path)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"baseline {path}: ") and wrong in message, message
        assert "expected a JSON object" in message


def test_cases_a_partial_own_baseline_lacks_are_judged_against_the_default(tmp_path):
    """Break-it finding: `--update-baseline -k a` on a new CPU wrote a file with case a only, and from
    then on case b was judged against nothing, with no word; it now takes perf_baseline.json's ratio,
    with a warning naming it."""
    write_baseline({"a": 2.0, "b": 3.0}, {}, {"device_name": "Intel(R) Xeon(R) Processor"}, tmp_path / "perf_baseline.json")
    own = _baseline_on(tmp_path / "perf_baseline-amd-epyc.json", "AMD EPYC", 0.5)
    judged = judged_baseline("AMD EPYC", tmp_path)
    assert judged.ratios == {"a": 0.5, "b": 3.0}
    assert judged.files == (own, tmp_path / "perf_baseline.json")
    assert len(judged.warnings) == 1 and "no ratio for 1 case(s) (b)" in judged.warnings[0]
    assert "'Intel(R) Xeon(R) Processor'" in judged.warnings[0]
    full = judged_baseline("Intel(R) Xeon(R) Processor", tmp_path)
    assert full.ratios == {"a": 2.0, "b": 3.0} and full.warnings == ()


@pytest.mark.parametrize("corrupt", ["{not json", "<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> other\n", ""],
                         ids=["syntax", "conflict", "empty"])
def test_a_corrupt_baseline_of_another_cpu_does_not_stop_a_cpu_with_its_own(tmp_path, corrupt):
    """Break-it finding: a corrupt perf_baseline.json (the Intel Xeon's file; a merge conflict in it)
    stopped the gate of an AMD EPYC with a good file of its own, "baseline .../perf_baseline.json: not
    JSON", and --update-baseline there too; now that CPU is judged against its own file (the cases it
    lacks against nothing, with a warning), and its file is the one rewritten."""
    zen4 = cpu_identity(ZEN4, "AVX512")
    own = tmp_path / "perf_baseline-amd-epyc-family-25-model-17-avx512.json"
    write_baseline({"a": 0.7, "b": 0.9}, {}, {"device_name": "AMD EPYC", "cpu_identity": zen4}, own)
    (tmp_path / "perf_baseline.json").write_text(corrupt)
    assert baseline_path_for(zen4, tmp_path) == own
    assert choose_baseline(zen4, tmp_path, model="AMD EPYC") == (own, None)
    judged = judged_baseline(zen4, tmp_path, model="AMD EPYC")
    assert judged.ratios == {"a": 0.7, "b": 0.9} and judged.files == (own,)
    assert len(judged.warnings) == 1 and judged.warnings[0].startswith("perf_baseline.json is not read (baseline ")
    assert "\n" not in judged.warnings[0]
    # a CPU none of whose candidates is its own still stops: the corrupt file may be its
    for cpu in ("Intel(R) Xeon(R) Processor", cpu_identity(ZEN3, "AVX2")):
        with pytest.raises(ValueError, match=r"perf_baseline\.json: "):
            judged_baseline(cpu, tmp_path, model="AMD EPYC")


@pytest.mark.parametrize("corrupt", ["{not json", "<<<<<<< HEAD\n{}\n=======\n{}\n>>>>>>> other\n", ""],
                         ids=["syntax", "conflict", "empty"])
def test_a_corrupt_baseline_of_another_model_does_not_stop_a_cpu_without_its_own(tmp_path, corrupt):
    """Break-it finding (h-break16r): an Intel Xeon with no file of its own (judged against
    perf_baseline.json, its model name's) stopped with "baseline .../perf_baseline-amd-epyc.json: not JSON"
    where the AMD EPYC's file was corrupt: every file was read to find one of its model name. A file whose
    name is no Intel Xeon's is now left out, with a word; one that may be of its model still stops it."""
    xeon = cpu_identity(ZEN4.replace("AMD EPYC", "Intel(R) Xeon(R) Processor").replace("25", "6").replace(
        "17", "106"), "AVX512")
    intel = _baseline_on(tmp_path / "perf_baseline.json", "Intel(R) Xeon(R) Processor", 2.0)
    amd = tmp_path / "perf_baseline-amd-epyc.json"
    amd.write_text(corrupt)
    path, warning = choose_baseline(xeon, tmp_path, model="Intel(R) Xeon(R) Processor")
    assert path == intel and "\n" not in warning
    assert warning.endswith(" (fix the file or delete it)") and "perf_baseline-amd-epyc.json is left out" in warning
    judged = judged_baseline(xeon, tmp_path, model="Intel(R) Xeon(R) Processor")
    assert judged.ratios == {"a": 2.0} and judged.files == (intel,)
    # no same-model file at all: judged against perf_baseline.json, the corrupt file said too
    path, warning = choose_baseline("Weird CPU [AVX2]", tmp_path, model="Weird CPU")
    assert path == intel and "perf_baseline-amd-epyc.json is left out" in warning
    # an AMD EPYC of another generation: the corrupt file may have been its model's stand-in; it is left
    # out too, named, and the CPU is judged against perf_baseline.json, with a warning
    zen3 = cpu_identity(ZEN3, "AVX2")
    for name in ("perf_baseline-amd-epyc.json", "perf_baseline-amd-epyc-family-25-model-17-avx512.json"):
        if name != amd.name:
            amd = amd.rename(tmp_path / name)
        path, warning = choose_baseline(zen3, tmp_path, model="AMD EPYC")
        assert path == intel and f"{name} is left out of the search for a file of model 'AMD EPYC'" in warning
    # one of this CPU's own names stops it: it may be the file this CPU is judged against and would rewrite
    own = baseline_path_for(zen3, tmp_path)
    amd.rename(own)
    with pytest.raises(ValueError, match=re.escape(own.name)):
        judged_baseline(zen3, tmp_path, model="AMD EPYC")
    assert judged_baseline(xeon, tmp_path, model="Intel(R) Xeon(R) Processor").ratios == {"a": 2.0}


@pytest.mark.parametrize(("model", "other"), [
    ("AMD EPYC", "perf_baseline-amd-epyc-7b13.json"),
    ("AMD EPYC", "perf_baseline-amd-epyc-7b13-family-25-model-1-avx2.json"),
    ("Intel(R) Xeon(R) Processor", "perf_baseline-intel-r-xeon-r-processor-2-2ghz.json"),
    ("Intel(R) Xeon(R) Processor", "perf_baseline-intel-r-xeon-r-processor-2-2ghz-0123abcd.json"),
    # QEMU's model names: "... (Broadwell)" and "... (Broadwell, no TSX)" ("no" began "no-avx", a capability)
    ("Intel Core Processor (Broadwell)", "perf_baseline-intel-core-processor-broadwell-no-tsx-family-6-model-61-avx2.json"),
    ("Intel Core Processor (Broadwell)", "perf_baseline-intel-core-processor-broadwell-no-tsx.json"),
    ("Intel Core Processor (Broadwell)", "perf_baseline-intel-core-processor-broadwell-no-tsx-0123abcd.json"),
    ("AMD EPYC", "perf_baseline-amd-epyc-z-family-25-model-1-avx2.json"),
    ("AMD EPYC", "perf_baseline-amd-epyc-default-family-25-model-1-avx2-0123abcd.json"),
    # a model name with no letter or digit ("unknown-cpu" as a file name): its hashed name stops it (loop below)
    ("!!!", "perf_baseline-no-tsx-family-6-model-61-avx2.json"),
    # names no rule over file names tells apart (h-break16v): the model "AMD EPYC Default"'s own name (code
    # before identities) is also an "AMD EPYC [DEFAULT]"'s; "X Model 3"'s is "X [model 3, ...]"'s prefix
    ("AMD EPYC", "perf_baseline-amd-epyc-default.json"),
    ("X", "perf_baseline-x-model-3.json"),
    ("AMD EPYC", "perf_baseline-amd-epyc-0123abcd.json"),
])
def test_a_corrupt_baseline_of_a_longer_model_name_does_not_stop_a_cpu(tmp_path, model, other):
    """Break-it finding (h-break16t): a model name whose slug begins another's ("AMD EPYC" and "AMD EPYC
    7B13", "Intel(R) Xeon(R) Processor" and "... Processor @ 2.2GHz") took that model's file name as maybe its
    own: a corrupt one raised "baseline .../perf_baseline-amd-epyc-7b13.json: not JSON" where the CPU is
    judged against perf_baseline.json. Now it is left out, said in the warning; every name baseline_path_for
    gives this CPU (plain, hashed, cut and hashed) still stops it. Since h-break17 any other corrupt file is
    left out: names could not be told apart ("AMD EPYC Default"'s and "AMD EPYC [DEFAULT]"'s are one).
    h-break16u: a capability's first word after the model's slug ("no", "z", "default") was taken for an
    identity's bracketed part, so "Intel Core Processor (Broadwell)" stopped on a corrupt "...-broadwell-no-tsx-..."
    (QEMU's "(Broadwell, no TSX)"'s); and a model named "!!!" left out "perf_baseline-unknown-cpu-<hash>.json",
    its own name hashed, and was judged against perf_baseline.json."""
    intel = _baseline_on(tmp_path / "perf_baseline.json", "Somewhere Else", 2.0)
    (tmp_path / other).write_text("{")
    cpu = cpu_identity(ZEN4.replace("AMD EPYC", model), "AVX512")
    path, warning = choose_baseline(cpu, tmp_path, model=model)
    assert path == intel and f"{other} is left out" in warning and "\n" not in warning
    assert judged_baseline(cpu, tmp_path, model=model).ratios == {"a": 2.0}
    (tmp_path / other).unlink()
    # this CPU's own names (its identity's, plain, hashed, or cut to 64 bytes and hashed) still stop it
    # where corrupt: each may be the file it is judged against and rewrites
    long_model = model + " " + "k" * (60 - len(model))
    for of_model in (model, long_model):
        cpu_of_model = cpu_identity(ZEN4.replace("AMD EPYC", of_model), "AVX512")
        own = baseline_path_for(cpu_of_model, tmp_path)
        digest = hashlib.sha256(cpu_of_model.encode()).hexdigest()[:8]
        names = {own.name} if own.stem.endswith(digest) else {own.name, f"{own.stem}-{digest}.json"}
        for name in names:
            (tmp_path / name).write_text("{")
            with pytest.raises(ValueError, match=re.escape(name)):
                choose_baseline(cpu_of_model, tmp_path, model=of_model)
            (tmp_path / name).unlink()


def test_a_baseline_measured_under_another_torch_is_judged_with_a_warning(tmp_path):
    """A baseline records the torch it was measured with, and every ratio moves with torch's kernels;
    the gate judged an upgraded torch against it with no word (a read-only probe found it). Now it
    warns; the same torch, or a file that does not say, gets none."""
    write_baseline({"a": 2.0}, {}, {"device_name": "AMD EPYC", "torch": "2.13.0+cpu"}, tmp_path / "perf_baseline.json")
    same = judged_baseline("AMD EPYC", tmp_path, torch_version="2.13.0+cpu")
    assert same.warnings == ()
    other = judged_baseline("AMD EPYC", tmp_path, torch_version="2.14.1")
    assert other.ratios == {"a": 2.0} and len(other.warnings) == 1
    assert other.warnings[0].startswith("perf_baseline.json was measured with torch 2.13.0+cpu, this is torch 2.14.1")
    _baseline_on(tmp_path / "perf_baseline.json", "AMD EPYC", 2.0)  # no torch recorded: nothing to compare
    assert judged_baseline("AMD EPYC", tmp_path, torch_version="2.14.1").warnings == ()


ZEN3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: avx2\n"
ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nflags\t\t: avx512f\n"
#: an ARM /proc/cpuinfo: no "model name" line
NEOVERSE = ("processor\t: 0\nBogoMIPS\t: 243.75\n"
            "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n")


def test_a_cpu_is_named_by_its_model_its_microarchitecture_and_torchs_instruction_set():
    assert cpu_identity(ZEN4 + "processor\t: 1\ncpu family\t: 23\n", "AVX512") == "AMD EPYC [family 25, model 17, AVX512]"
    assert cpu_identity(ZEN3, "AVX2") == "AMD EPYC [family 25, model 1, AVX2]"
    # the same CPU with AVX-512 masked (a VM) dispatches torch's kernels to AVX2: another CPU to the gate
    assert cpu_identity(ZEN4, "AVX2") != cpu_identity(ZEN4, "AVX512")
    arm = cpu_identity(NEOVERSE, "SVE256")
    assert arm.endswith("[implementer 0x41, part 0xd40, variant 0x1, SVE256]") and arm != cpu_identity("", "SVE256")
    assert cpu_identity() == cpu_identity(None, torch.backends.cpu.get_cpu_capability())
    assert cpu_identity().startswith(cpu_model() + " [")


@pytest.mark.parametrize("separator", ["\x0b", "\x1c", "\u2028", "\x85"])
def test_a_model_name_holding_a_line_separator_is_kept_whole(separator):
    """h-break16v noticed: the fields of /proc/cpuinfo were read with splitlines(), which also splits at
    "\x0b", "\x1c", NEL and U+2028: "AMD EPYC<U+2028>7B13" was named "AMD EPYC", the same CPU as a plain
    "AMD EPYC" (one baseline for both). Only "\n" ends a line there; the name is kept as one printable line."""
    info = ZEN4.replace("AMD EPYC", f"AMD EPYC{separator}7B13")
    assert cpu_model(info) == "AMD EPYC 7B13"
    assert cpu_identity(info, "AVX512") == "AMD EPYC 7B13 [family 25, model 17, AVX512]"
    assert cpu_identity(ZEN4.replace("\n", "\r\n"), "AVX512") == "AMD EPYC [family 25, model 17, AVX512]"


#: /proc/cpuinfo of two POWER generations as KVM guests: the same "model" (the machine), no "model name"
POWER8_GUEST = ("processor\t: 0\ncpu\t\t: POWER8 (architected), altivec supported\nclock\t\t: 3425.000000MHz\n"
                "revision\t: 2.1 (pvr 004b 0201)\n\ntimebase\t: 512000000\nplatform\t: pSeries\n"
                "model\t\t: IBM pSeries (emulated by qemu)\nmachine\t\t: CHRP IBM pSeries (emulated by qemu)\n")
POWER9_GUEST = POWER8_GUEST.replace("POWER8", "POWER9").replace("2.1 (pvr 004b 0201)", "2.2 (pvr 004e 1202)")
#: IBM Z (a z15, machine type 8561) and RISC-V (a SiFive U74) as Linux describes them
Z15 = ("vendor_id       : IBM/S390\n# processors    : 2\nbogomips per cpu: 3241.00\nfeatures\t: esan3 zarch vx\n"
       "processor 0: version = FF,  identification = 0C3247,  machine = 8561\n"
       "processor 1: version = FF,  identification = 1C3247,  machine = 8561\n\ncpu number      : 0\n")
U74 = ("processor\t: 0\nhart\t\t: 1\nisa\t\t: rv64imafdc\nmmu\t\t: sv39\nuarch\t\t: sifive,u74-mc\n"
       "mvendorid\t: 0x489\nmarchid\t\t: 0x8000000000000007\nmimpid\t\t: 0x4210427\n")


def test_a_cpu_without_a_model_name_line_is_named_by_what_its_platform_says(monkeypatch):
    """Break-it finding (issue 14.11): where /proc/cpuinfo has no "model name" the CPU was named by
    platform.processor(): a POWER8 and a POWER9 guest were both 'ppc64le [model IBM pSeries (emulated by
    qemu), VSX]', a z14 and a z15 both 's390x [ZVECTOR]', every RISC-V board 'riscv64 [DEFAULT]', and
    every Mac 'arm [DEFAULT]' (no /proc/cpuinfo): one baseline file, judged as each one's own."""
    from fwbench.run import environment

    monkeypatch.setattr(environment.platform, "processor", lambda: "ppc64le")
    assert cpu_identity(POWER9_GUEST, "VSX") == ("POWER9 (architected), altivec supported "
                                                 "[model IBM pSeries (emulated by qemu), VSX]")
    assert cpu_model(POWER9_GUEST) == "POWER9 (architected), altivec supported"
    assert cpu_identity(POWER8_GUEST, "VSX") != cpu_identity(POWER9_GUEST, "VSX")
    monkeypatch.setattr(environment.platform, "processor", lambda: "s390x")
    assert cpu_identity(Z15, "ZVECTOR") == "s390x [machine 8561, ZVECTOR]"
    assert cpu_identity(Z15.replace("8561", "3906"), "ZVECTOR") == "s390x [machine 3906, ZVECTOR]"
    monkeypatch.setattr(environment.platform, "processor", lambda: "riscv64")
    assert cpu_identity(U74, "DEFAULT") == ("sifive,u74-mc [mvendorid 0x489, marchid 0x8000000000000007, "
                                            "mimpid 0x4210427, DEFAULT]")
    # macOS: no /proc/cpuinfo; the brand string sysctl gives, one per chip
    monkeypatch.setattr(environment.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(environment.platform, "processor", lambda: "arm")
    identities = []
    for chip in ("Apple M1", "Apple M3 Pro"):
        def sysctl(argv, chip=chip, **kwargs):
            assert argv == ["/usr/sbin/sysctl", "-n", "machdep.cpu.brand_string"]
            return subprocess.CompletedProcess(argv, 0, stdout=chip + "\n", stderr="")
        monkeypatch.setattr(environment.subprocess, "run", sysctl)
        identities.append(cpu_identity("", "DEFAULT"))
        assert cpu_model("") == chip
    assert identities == ["Apple M1 [DEFAULT]", "Apple M3 Pro [DEFAULT]"]
    # no sysctl answer: what platform says, as before
    monkeypatch.setattr(environment.subprocess, "run", lambda argv, **kwargs: subprocess.CompletedProcess(argv, 1, "", ""))
    assert cpu_identity("", "DEFAULT") == "arm [DEFAULT]"


@pytest.mark.parametrize("path", ["/usr/bin:/bin:/usr/sbin:/sbin", "/usr/bin:/bin", None],
                         ids=["login-shell", "no-sbin", "unset"])
def test_a_mac_is_named_alike_whatever_its_path(monkeypatch, path):
    """Break-it finding (h-break16r): the brand string came from a bare "sysctl", found on $PATH, and macOS
    keeps it in /usr/sbin: where PATH lacks it (`env -i`, which leaves Python /bin:/usr/bin, a pure nix shell,
    a minimal CI job) the same Mac was 'arm [DEFAULT]' instead of 'Apple M3 Pro [DEFAULT]', every Mac's name
    (the baseline of any Mac judged as its own). sysctl is simulated as macOS runs it: a bare name looked up
    in PATH (os.defpath where unset), the file at /usr/sbin/sysctl alone."""
    from fwbench.run import environment

    def run(argv, **kwargs):
        search = os.environ.get("PATH", os.defpath).split(":")
        found = argv[0] if "/" in argv[0] else next((f"{d}/{argv[0]}" for d in search if d == "/usr/sbin"), None)
        if found != "/usr/sbin/sysctl":
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        return subprocess.CompletedProcess(argv, 0, stdout="Apple M3 Pro\n", stderr="")

    monkeypatch.setattr(environment.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(environment.platform, "processor", lambda: "arm")
    monkeypatch.setattr(environment.subprocess, "run", run)
    if path is None:
        monkeypatch.delenv("PATH", raising=False)
    else:
        monkeypatch.setenv("PATH", path)
    assert cpu_identity("", "DEFAULT") == "Apple M3 Pro [DEFAULT]"
    # sysctl missing, timing out or failing: what platform says, as before
    for failure in (FileNotFoundError(2, "missing"), subprocess.TimeoutExpired("sysctl", 5)):
        def broken(argv, failure=failure, **kwargs):
            raise failure
        monkeypatch.setattr(environment.subprocess, "run", broken)
        assert cpu_identity("", "DEFAULT") == "arm [DEFAULT]"


@pytest.mark.parametrize(("printed", "model"), [
    (b"Apple M3 \xff Pro\n", "Apple M3 \ufffd Pro"),
    (b"Apple M3\nPro\n", "Apple M3 Pro"),
    (b"Apple\tM3 Pro\x1b\n", "Apple M3 Pro"),
    (b"\x1b\x07\n", "arm"),
    (b"Apple M3  Pro\n", "Apple M3  Pro"),
], ids=["not-utf8", "newline", "tab-escape", "control-only", "two-spaces-kept"])
def test_a_mac_brand_string_that_is_not_one_printable_line(monkeypatch, tmp_path, printed, model):
    """Break-it finding (h-break16t): sysctl's output was decoded strictly (text=True), so a byte that is
    not UTF-8 raised UnicodeDecodeError out of cpu_identity (and every record's describe_environment), where
    /proc/cpuinfo's are replaced; a newline or tab in the brand string was kept, 'Apple M3\nPro [DEFAULT]',
    an identity of two lines. A real program prints the bytes, so the decoding is the one run() does."""
    from fwbench.run import environment

    sysctl = tmp_path / "sysctl"
    (tmp_path / "out").write_bytes(printed)
    sysctl.write_text(f"#!/bin/sh\ncat '{tmp_path / 'out'}'\n")
    sysctl.chmod(0o755)
    monkeypatch.setattr(environment, "MACOS_SYSCTL", str(sysctl))
    monkeypatch.setattr(environment.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(environment.platform, "processor", lambda: "arm")
    assert cpu_model("") == model
    assert cpu_identity("", "DEFAULT") == f"{model} [DEFAULT]"
    # /proc/cpuinfo's name likewise; a printable one is kept as it is
    assert cpu_model("model name\t: AMD\x1bEPYC\n") == "AMD EPYC"


def _arm_core(index: int, part: str, variant: str) -> str:
    return (f"processor\t: {index}\nBogoMIPS\t: 38.40\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
            f"CPU variant\t: {variant}\nCPU part\t: {part}\nCPU revision\t: 0\n\n")


def test_a_big_little_arm_cpu_is_named_by_every_kind_of_core():
    """Break-it finding: an ARM big.LITTLE CPU was named by its first core alone, the little one: four
    Cortex-A55 (0xd05) with four A76 (0xd0b) and with four A78 (0xd41) were both 'aarch64 [implementer
    0x41, part 0xd05, variant 0x2, NEON]', one baseline for SoCs whose big cores differ."""
    little = "".join(_arm_core(i, "0xd05", "0x2") for i in range(4))
    a76 = little + "".join(_arm_core(i, "0xd0b", "0x4") for i in range(4, 8))
    a78 = little + "".join(_arm_core(i, "0xd41", "0x1") for i in range(4, 8))
    assert cpu_identity(a76, "NEON").endswith("[implementer 0x41, part 0xd05/0xd0b, variant 0x2/0x4, NEON]")
    assert cpu_identity(a76, "NEON") != cpu_identity(a78, "NEON")
    # one kind of core: as before
    assert cpu_identity(little, "NEON").endswith("[implementer 0x41, part 0xd05, variant 0x2, NEON]")
    assert cpu_identity(NEOVERSE * 2, "SVE256") == cpu_identity(NEOVERSE, "SVE256")


def test_a_cpuinfo_that_is_not_utf8_names_the_cpu(tmp_path, monkeypatch):
    """Break-it finding: /proc/cpuinfo was read as strict UTF-8, and a byte that is not (b'\\xe9' in a
    model name) raised UnicodeDecodeError out of cpu_model, cpu_identity and so every run record's
    describe_environment: neither a run nor the gate started."""
    from fwbench.run import environment

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_bytes(b"processor\t: 0\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Caf\xe9 CPU\n")
    monkeypatch.setattr(environment, "CPUINFO_PATH", cpuinfo)
    assert cpu_model() == "Caf\ufffd CPU"
    assert cpu_identity(capability="AVX2") == "Caf\ufffd CPU [family 6, model 85, AVX2]"
    assert environment.describe_environment(torch.device("cpu"))["device_name"] == "Caf\ufffd CPU"
    monkeypatch.setattr(environment, "CPUINFO_PATH", tmp_path / "missing")  # macOS, Windows: no such file
    assert cpu_identity(capability="AVX2").endswith(" [AVX2]")


def test_two_cpu_generations_of_one_model_name_keep_their_own_baselines(tmp_path):
    """Break-it finding (issue 14.11): baselines were keyed by the model name, which a VM's CPU
    generations share ('AMD EPYC'): on a family 25 model 17 EPYC the code of the commit that measured
    perf_baseline-amd-epyc.json (on another 'AMD EPYC') read 1.05-1.48x its ratios, the gate's 1.5
    0.02 away on an unchanged checkout, and it was judged as that CPU's own file with no warning."""
    zen3, zen4 = cpu_identity(ZEN3, "AVX2"), cpu_identity(ZEN4, "AVX512")
    _baseline_on(tmp_path / "perf_baseline.json", "Intel(R) Xeon(R) Processor", 2.0)
    legacy = _baseline_on(tmp_path / "perf_baseline-amd-epyc.json", "AMD EPYC", 0.5)  # no identity recorded
    # judged against the file of its model name, not as its own: with a warning saying why
    path, warning = choose_baseline(zen4, tmp_path, model="AMD EPYC")
    assert path == legacy and warning is not None
    assert "records no family, model or instruction set" in warning and repr(zen4) in warning
    own = baseline_path_for(zen4, tmp_path)
    assert own == tmp_path / "perf_baseline-amd-epyc-family-25-model-17-avx512.json" and own.name in warning
    write_baseline({"a": 0.7}, {}, {"device_name": "AMD EPYC", "cpu_identity": zen4}, own)
    assert choose_baseline(zen4, tmp_path, model="AMD EPYC") == (own, None)
    assert judged_baseline(zen4, tmp_path, model="AMD EPYC").ratios == {"a": 0.7}
    # the other generation is not judged against it as its own: the file that may be its, with the warning
    path, warning = choose_baseline(zen3, tmp_path, model="AMD EPYC")
    assert path == legacy and warning is not None and baseline_path_for(zen3, tmp_path) not in (own, legacy)
    legacy.unlink()  # only another generation's file left: judged against it, with a warning naming it
    path, warning = choose_baseline(zen3, tmp_path, model="AMD EPYC")
    assert path == own and repr(zen4) in warning and repr(zen3) in warning
    # the model name as the CPU (a caller that passes no identity) finds the files as before
    assert choose_baseline("Intel(R) Xeon(R) Processor", tmp_path) == (tmp_path / "perf_baseline.json", None)


def test_a_baseline_cpu_identity_that_is_not_a_string_is_refused(tmp_path):
    path = tmp_path / "perf_baseline.json"
    path.write_text(json.dumps({"benchmarks": {"a": {"ratio": 1.0}}, "environment": {"cpu_identity": 3}}))
    with pytest.raises(ValueError, match=r"environment\.cpu_identity: got 3; expected"):
        read_baseline(path)


#: Each hand-written autograd Function's direction and the case that times it alone.
DIRECTION_CASES = [
    ("softmax", "_FusedAttention", "softmax_parallel_train_forward_T1024", "forward"),
    ("softmax", "_FusedAttention", "softmax_parallel_backward_T1024", "backward"),
    ("fwm_rule", "_FlushedScan", "fwm_rule_kernel_train_forward_T256", "forward"),
    ("fwm_rule", "_FlushedScan", "fwm_rule_kernel_backward_T256", "backward"),
    ("delta_rule", "_DeltaWriteRead", "delta_write_read_train_forward_T1024", "forward"),
    ("delta_rule", "_DeltaWriteRead", "delta_write_read_backward_T1024", "backward"),
]


@pytest.mark.parametrize("module_name, function, name, direction", DIRECTION_CASES, ids=[c[2] for c in DIRECTION_CASES])
def test_each_direction_of_a_hand_written_kernel_has_a_case_that_times_it_alone(module_name, function, name, direction):
    """Break-it finding (issue 14.11): a kernel twice as slow in one direction only was diluted below the
    gate's 1.5 by the other direction, timed in the same case: a 2x slower softmax forward made
    softmax_parallel_fwd_bwd_T1024 1.29x slower, the delta rule's write-then-read backward
    retrieval_setting2_train_step 1.17x; the gate passed both. Each direction now has a case whose timed
    call runs it once and the other direction not at all (the backward's forward runs in ``prepare``,
    untimed), counted through the Function's own code objects."""
    import importlib
    import sys

    cls = getattr(importlib.import_module(f"fwbench.variants.kernels.{module_name}"), function)
    codes = {cls.forward.__code__: "forward", cls.backward.__code__: "backward"}
    fn = {c.name: c for c in PERF_CASES}[name].build()
    for _ in range(2):  # the second call: the state a call leaves is one the next can time
        calls = []

        def count(frame, event, arg, calls=calls):
            if event == "call" and frame.f_code in codes:
                calls.append(codes[frame.f_code])

        getattr(fn, "prepare", lambda: None)()
        sys.setprofile(count)
        try:
            fn()
        finally:
            sys.setprofile(None)
        assert calls == [direction], calls
