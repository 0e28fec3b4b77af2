"""How reliable the performance gate is (issue 14 item 11): run ``python -m pytest benchmarks`` N
times on the unchanged checkout (every failure is a false one) and N times with a planted 2×
slowdown in a kernel (``--plant-slowdown``; the gate must fail each time, on a case of that kernel),
one after another on this machine as it is, and print each run's failed cases and the totals.

Usage: ``python benchmarks/gate_reliability.py [--runs 12] [--short] [--phases unchanged planted]
[-k EXPR] [--plant MODULE:FUNCTION] [--expect CASE ...]`` (defaults: 12 runs, every case, delta_rule_chunk planted, the
kernel's own case and the two forward-only cases that call it, of which at least one must fail). Exit status 0 when there was
no false failure and every planted run failed one of the expected cases; 2 when the options select no case, or no expected
case for the planted runs, or pytest ends a run with an error or without a timing verdict on every selected case
(a case that errored, was skipped or crashed: nothing judged)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

DEFAULT_PLANT = "fwbench.variants.kernels.delta_rule:delta_rule_chunk"
DEFAULT_EXPECT = ["delta_rule_chunk_kernel_T1024", "dpfp_delta_chunk_forward_T1024", "favor_delta_chunk_forward_T1024"]


def failed_cases(extra: list[str]) -> tuple[dict[str, str], float, str, int]:
    """Run the suite once; (failed case name → pytest's message, seconds, the last line pytest printed,
    pytest's exit status: 0 all passed, 1 some failed, anything else nothing judged)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "-rf", "-p", "no:cacheprovider",
                           "--benchmark-disable-gc", *extra], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "400"})  # whole failure messages in -rf
    lines = done.stdout.strip().splitlines()
    failed = {case_name(node): message for node, message in
              re.findall(r"^FAILED (benchmarks/\S+::\S+) - (.*)$", done.stdout, re.MULTILINE)}
    last = lines[-1] if lines else done.stderr.strip()[-200:]
    return failed, time.perf_counter() - start, last, done.returncode


def case_name(node: str) -> str:
    """The name a run reports for pytest's node id: a perf case's own name (``test_perf[NAME]``), else the test's
    (the timed checks beside the gate, e.g. test_gate_sensitivity.py's). Counting only the perf cases, a run
    that judged every test read "pytest judged 21 of the 20 selected cases" and stopped, judging nothing."""
    perf = re.fullmatch(r"benchmarks/test_perf\.py::test_perf\[(\w+)\]", node)
    return perf.group(1) if perf else node.split("::", 1)[1]


#: How a case's timing verdict begins in pytest's -rf line (``Regression.message`` through ``pytest.fail``);
#: any other failure is a crash of the case (an exception in its body), not a measured slowdown.
VERDICT = "Failed: {name}: time / calibration = "


def unjudged(failed: dict[str, str], last: str, selected: set[str]) -> str | None:
    """Why a run that pytest ended with status 0 or 1 gave no timing verdict on every case of ``selected``
    (``None`` where it did): a case that errored (a fixture: a baseline that does not load), was skipped, or
    failed with an exception instead of a measured ratio. Each was counted before as a case that passed
    (unchanged runs: "no false failure", exit 0) or, in a planted run, the crash as the slowdown caught."""
    counts = {}
    for number, word in re.findall(r"(\d+) (\w+)", last):  # "1 failed, 12 passed, 1 error in 9.1s"
        counts[word.rstrip("s") if word in ("errors", "warnings") else word] = int(number)
    crashed = sorted(name for name, message in failed.items()
                     if not name.startswith("test_") and not message.startswith(VERDICT.format(name=name)))
    if crashed:
        return f"{', '.join(crashed)} failed without a timing verdict ({failed[crashed[0]]})"
    judged = counts.get("passed", 0) + counts.get("failed", 0)
    if judged != len(selected):
        return f"pytest judged {judged} of the {len(selected)} selected cases"
    return None


def selected_cases(extra: list[str]) -> tuple[set[str], str]:
    """The names of the cases a run with ``extra`` (``--short``, ``-k``) times (pytest's collection), and
    the last line pytest printed."""
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "--collect-only", "-p", "no:cacheprovider",
                           *extra], capture_output=True, text=True)
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    names = {case_name(node) for node in re.findall(r"^(benchmarks/\S+::\S+)$", done.stdout, re.MULTILINE)}
    return names, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--short", action="store_true", help="the CI subset (gross threshold)")
    parser.add_argument("--plant", default=DEFAULT_PLANT)
    parser.add_argument("--expect", nargs="+", default=DEFAULT_EXPECT)
    parser.add_argument("--phases", nargs="+", choices=("unchanged", "planted"), default=["unchanged", "planted"])
    parser.add_argument("-k", dest="select", help="pytest -k expression: only these cases (e.g. the planted kernel's)")
    args = parser.parse_args()
    if args.runs < 1:  # zero runs "passed" with nothing measured
        parser.error(f"--runs: got {args.runs}; expected a positive integer")
    if "planted" in args.phases:
        from fwbench.bench.plant import plant_slowdown

        try:  # a target the plant refuses failed every planted run with pytest's usage error, counted as missed
            plant_slowdown(args.plant)()
        except ValueError as exc:
            parser.error(str(exc).replace("--plant-slowdown", "--plant", 1))
    extra = (["--short"] if args.short else []) + (["-k", args.select] if args.select else [])
    # a selection of no case "passed" every unchanged run with nothing measured, and one without an
    # expected case counted every planted run as a slowdown the gate missed, on cases never timed
    selected, collected = selected_cases(extra)
    if not selected and (args.select or args.short):
        parser.error(f"-k: got {args.select!r}{' with --short' if args.short else ''}; expected a selection of at "
                     f"least one benchmark case (pytest: {collected})")
    if not selected:
        parser.error(f"benchmarks: pytest collected no case; expected the gate's cases (pytest: {collected})")
    if "planted" in args.phases and not set(args.expect) & selected:
        parser.error(f"--expect: got {' '.join(args.expect)}; expected at least one of the cases the runs time: "
                     f"{' '.join(sorted(selected))}")
    false_failures, missed = 0, 0
    phases = {"unchanged": [], "planted": ["--plant-slowdown", args.plant]}
    for label, plant in ((name, phases[name]) for name in args.phases):
        for index in range(1, args.runs + 1):
            failed, seconds, last, status = failed_cases(extra + plant)
            if status not in (0, 1):  # an error, not a verdict: no case was judged
                print(f"{label} run {index:2d}: pytest exited with status {status}, judging nothing: {last}",
                      file=sys.stderr)
                return 2
            reason = unjudged(failed, last, selected)
            if reason is not None:  # an error or a skip read as a pass, a crash as a slowdown caught
                print(f"{label} run {index:2d}: {reason}, judging nothing: {last}", file=sys.stderr)
                return 2
            if plant:
                missed += not set(args.expect) & set(failed)  # the gate let the slowdown through
            else:
                false_failures += bool(failed)
            print(f"{label} run {index:2d} ({seconds:.0f} s): failed {sorted(failed) or 'none'} | {last}", flush=True)
            for message in failed.values():
                print(f"    {message}", flush=True)
    totals = {"unchanged": f"unchanged: {false_failures} of {args.runs} runs failed",
              "planted": f"planted: {missed} of {args.runs} runs failed none of {args.expect}"}
    print("; ".join(totals[name] for name in args.phases))  # only the phases that ran
    return 0 if false_failures == 0 and missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
