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


@pytest.mark.parametrize("target, why", [
    # the delta rule's chunk entry: its kernels table holds the function, which no module name replaces,
    # so the plant doubled nothing the cases call and the gate stayed green
    ("fwbench.variants.rules.delta:_chunk", "is also held in a dict"),
    ("fwbench.variants.rules.fwm:_recurrent", "is also held in a dict"),
    # an autograd Function: its callers use _FlushedScan.apply, which the plant's function lacks
    ("fwbench.variants.kernels.fwm_rule:_FlushedScan", "is not a function"),
    # called only from numba-compiled loops, which bound it when compiled: the plant was accepted and
    # DPFP's scores took the same time (0.94x), the gate green (h-break14n)
    ("fwbench.variants.kernels.compiled_scores:row_score", "is also held in a compiled \\(numba\\) function fwbench\\."),
    ("fwbench.variants.kernels.compiled_scores:row_backward", "is also held in a compiled"),
])
def test_a_target_the_plant_cannot_reach_is_refused_and_left_as_it_was(target, why):
    import importlib

    from fwbench.variants.rules.delta import DELTA

    module_name, _, name = target.partition(":")
    module = importlib.import_module(module_name)
    before, table = getattr(module, name), dict(DELTA.kernels)
    with pytest.raises(ValueError, match=f"--plant-slowdown: got '{target}'; {name} {why}"):
        plant_slowdown(target)
    assert getattr(module, name) is before and DELTA.kernels == table


def test_every_kernel_the_gate_names_is_planted_and_doubles_its_case():
    """Each kernel target the gate's reliability check and the docs name is accepted, and its case
    then calls the kernel twice per call (counted through the kernel's own code object)."""
    import importlib
    import sys

    from fwbench.bench.regression import PERF_CASES

    cases = {c.name: c for c in PERF_CASES}
    for target, case in [("fwbench.variants.kernels.delta_rule:delta_rule_chunk", "delta_rule_chunk_kernel_T1024"),
                         ("fwbench.variants.kernels.sum_rule:sum_rule_chunk", "sum_rule_chunk_kernel_T1024")]:
        module_name, _, name = target.partition(":")
        code = getattr(importlib.import_module(module_name), name).__code__
        calls = []

        def count(frame, event, arg, code=code, calls=calls):
            if event == "call" and frame.f_code is code:
                calls.append(1)

        fn = cases[case].build()
        undo = plant_slowdown(target)
        sys.setprofile(count)
        try:
            fn()
        finally:
            sys.setprofile(None)
            undo()
        assert len(calls) == 2, target


def test_a_plant_doubles_the_backward_too_and_keeps_values_and_gradients():
    """A kernel twice as slow is twice as slow in its backward too. The plant returned the second
    call's result alone, so a forward+backward case ran one backward: softmax_parallel_fwd_bwd_T1024
    grew 1.29x under a planted softmax_parallel, below the gate's 1.5, and the plant went uncaught.
    Now the backward of both calls runs (counted through the hand-written backward's code object),
    and the values and gradients are those of the kernel, bit for bit."""
    import sys

    from fwbench.variants.kernels import delta_rule

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, 2, 3, 4, generator=g), torch.rand(1, 2, 9, 4, generator=g),
              torch.randn(1, 2, 9, 5, generator=g), torch.rand(1, 2, 9, generator=g)]

    def run():
        leaves = [x.clone().requires_grad_() for x in inputs]
        y = delta_rule.delta_rule_write_read(*leaves, chunk_size=4)
        (y * torch.arange(5.0)).sum().backward()
        return y.detach(), [x.grad for x in leaves]

    backward_code = delta_rule._DeltaWriteRead.backward.__code__
    calls = []

    def count(frame, event, arg):
        if event == "call" and frame.f_code is backward_code:
            calls.append(1)

    y_plain, grads_plain = run()
    undo = plant_slowdown("fwbench.variants.kernels.delta_rule:delta_rule_write_read")
    sys.setprofile(count)
    try:
        y_planted, grads_planted = run()
    finally:
        sys.setprofile(None)
        undo()
    assert len(calls) == 2
    assert torch.equal(y_planted, y_plain)
    for planted, plain in zip(grads_planted, grads_plain, strict=True):
        assert torch.equal(planted, plain)


def test_a_plant_of_a_function_returning_a_named_tuple_returns_it_whole():
    """``fla_dispatch.decide`` returns a ``Decision`` (a NamedTuple): rebuilding it from one iterable
    raised a TypeError in every chunk call of the delta and sum rules under the plant."""
    from fwbench import variants

    torch.manual_seed(0)
    attention = variants.build_attention("linear-delta", 4, form="chunk")
    q, k, v = (torch.randn(1, 1, 6, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    beta = torch.rand(1, 1, 6, generator=torch.Generator().manual_seed(3))
    plain = attention(q, k, v, beta)[0]
    undo = plant_slowdown("fwbench.variants.kernels.fla_dispatch:decide")
    try:
        assert torch.equal(attention(q, k, v, beta)[0], plain)
    finally:
        undo()


@pytest.mark.parametrize("argv, message", [
    (["--plant", "fwbench.variants.rules.delta:_chunk"], "--plant: got 'fwbench.variants.rules.delta:_chunk'; _chunk is also"),
    (["--runs", "0"], "--runs: got 0; expected a positive integer"),
    # a selection of no case: every unchanged run "passed" (exit 0) with nothing measured (h-break14n)
    (["--runs", "1", "--phases", "unchanged", "-k", "nosuchcase"],
     "-k: got 'nosuchcase'; expected a selection of at least one benchmark case"),
    # expected cases the runs never time (the default plant's, beside -k sum_rule_chunk_kernel): every
    # planted run was counted as a slowdown the gate missed (exit 1), a false verdict (h-break14n)
    (["--runs", "1"], "--expect: got delta_rule_chunk_kernel_T1024 dpfp_delta_chunk_forward_T1024 "
                      "favor_delta_chunk_forward_T1024; expected at least one of the cases the runs time: "
                      "sum_rule_chunk_kernel_T1024"),
])
def test_gate_reliability_refuses_a_plant_it_cannot_plant_before_any_run(argv, message):
    """benchmarks/gate_reliability.py ran every planted run with a target pytest then refused (each
    counted as a slowdown the gate missed: a false verdict on the gate), and ``--runs 0`` passed."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "benchmarks/gate_reliability.py", "--phases", "planted", "-k",
                           "sum_rule_chunk_kernel", *argv], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout)
    assert done.stderr.strip().splitlines()[-1].startswith(f"gate_reliability.py: error: {message}")


def test_gate_reliability_gives_no_verdict_on_a_run_pytest_ended_with_an_error(monkeypatch, capsys):
    """A run pytest ends with an error (status 2 to 5: interrupted, internal error, usage, nothing
    collected) judged no case, and was counted as an unchanged run without a false failure (exit 0)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gate_reliability.py"
    spec = importlib.util.spec_from_file_location("gate_reliability_under_test", path)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    monkeypatch.setattr(gate, "selected_cases", lambda extra: ({"delta_rule_chunk_kernel_T1024"}, ""), raising=False)
    monkeypatch.setattr(gate, "failed_cases", lambda extra: ({}, 1.0, "INTERNALERROR> boom", 3))
    monkeypatch.setattr(sys, "argv", ["gate_reliability.py", "--runs", "2", "--phases", "unchanged"])
    assert gate.main() == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "unchanged run  1: pytest exited with status 3, judging nothing: INTERNALERROR> boom"


VERDICT_LINE = ("Failed: delta_rule_chunk_kernel_T1024: time / calibration = 0.900 now vs 0.450 in the baseline "
                "(2.00× slower; threshold 1.50×)")


@pytest.mark.parametrize(("phase", "outcome", "expected", "reason"), [
    # a baseline that does not load errors every case in its fixture (pytest exits 1, no FAILED line):
    # counted as an unchanged run without a false failure, exit 0 (h-break14q)
    ("unchanged", ({}, 1.0, "13 deselected, 1 error in 4.60s", 1), 2,
     "pytest judged 0 of the 1 selected cases, judging nothing: 13 deselected, 1 error in 4.60s"),
    # a case skipped (PYTEST_ADDOPTS=--benchmark-disable) passed nothing and was counted as a pass
    ("unchanged", ({}, 1.0, "1 skipped, 13 deselected in 2.00s", 0), 2,
     "pytest judged 0 of the 1 selected cases, judging nothing: 1 skipped, 13 deselected in 2.00s"),
    # a plant that crashes the case (an exception, no ratio) was counted as the slowdown caught
    ("planted", ({"delta_rule_chunk_kernel_T1024": "TypeError: boom"}, 1.0, "1 failed, 13 deselected in 2.00s", 1), 2,
     "delta_rule_chunk_kernel_T1024 failed without a timing verdict (TypeError: boom), judging nothing: "
     "1 failed, 13 deselected in 2.00s"),
    # what is judged stays judged: a measured slowdown caught, a pass
    ("planted", ({"delta_rule_chunk_kernel_T1024": VERDICT_LINE}, 1.0, "1 failed, 13 deselected in 9.00s", 1), 0, ""),
    ("unchanged", ({}, 1.0, "1 passed, 13 deselected, 2 warnings in 9.00s", 0), 0, ""),
])
def test_gate_reliability_gives_no_verdict_where_a_case_was_not_timed(monkeypatch, capsys, phase, outcome, expected,
                                                                      reason):
    """A run whose selected cases did not all end with a timing verdict (an error, a skip, a crash) judged
    nothing: exit 2 naming why, never a pass or a caught plant."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gate_reliability.py"
    spec = importlib.util.spec_from_file_location("gate_reliability_under_test", path)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    monkeypatch.setattr(gate, "selected_cases", lambda extra: ({"delta_rule_chunk_kernel_T1024"}, ""))
    monkeypatch.setattr(gate, "failed_cases", lambda extra: outcome)
    monkeypatch.setattr(sys, "argv", ["gate_reliability.py", "--runs", "1", "--phases", phase])
    assert gate.main() == expected
    captured = capsys.readouterr()
    if expected == 2:
        assert captured.out == ""
        assert captured.err.strip() == f"{phase} run  1: {reason}"
    else:
        assert captured.err == ""


def test_gate_reliability_counts_every_test_pytest_benchmarks_judges():
    """benchmarks/ holds the perf cases and a timed check beside them (test_gate_sensitivity.py): counting only the
    perf cases, a run that judged every test read "pytest judged 21 of the 20 selected cases" and stopped, judging
    nothing, on every machine with a baseline of its own (AMD EPYC family 26, 7 December)."""
    import importlib.util
    from pathlib import Path

    from fwbench.bench.regression import PERF_CASES

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gate_reliability.py"
    spec = importlib.util.spec_from_file_location("gate_reliability_counting", path)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    selected, _ = gate.selected_cases([])
    sensitivity = "test_a_kernel_twice_as_slow_in_its_forward_alone_doubles_its_direction_case"
    assert selected == {case.name for case in PERF_CASES} | {sensitivity}
    assert gate.unjudged({}, f"{len(selected)} passed in 18.00s", selected) is None
    # a failure of the timed check beside the gate is a failure (a false one in an unchanged run), not a crash
    assert gate.unjudged({sensitivity: "AssertionError: (1.0, 1.2)"}, f"1 failed, {len(selected) - 1} passed",
                         selected) is None
