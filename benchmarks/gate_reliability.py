"""How reliable the performance gate is (issue 14 item 11): run ``python -m pytest benchmarks`` N
times on the unchanged checkout (every failure is a false one) and N times with a planted 2×
slowdown in a kernel (``--plant-slowdown``; the gate must fail each time, on a case of that kernel),
one after another on this machine as it is, and print each run's failed cases and the totals.

Usage: ``python benchmarks/gate_reliability.py [--runs 12] [--short] [--phases unchanged planted]
[-k EXPR] [--plant MODULE:FUNCTION] [--expect CASE ...]`` (defaults: 12 runs, every case, delta_rule_chunk planted, the
kernel's own case and the two forward-only cases that call it, of which at least one must fail). Exit status 0 when there was
no false failure and every planted run failed one of the expected cases."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

DEFAULT_PLANT = "fwbench.variants.kernels.delta_rule:delta_rule_chunk"
DEFAULT_EXPECT = ["delta_rule_chunk_kernel_T1024", "dpfp_delta_chunk_forward_T1024", "favor_delta_chunk_forward_T1024"]


def failed_cases(extra: list[str]) -> tuple[dict[str, str], float, str]:
    """Run the suite once; (failed case name → pytest's message, seconds, the last line pytest printed)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-q", "-rf", "-p", "no:cacheprovider",
                           "--benchmark-disable-gc", *extra], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "400"})  # whole failure messages in -rf
    lines = done.stdout.strip().splitlines()
    failed = dict(re.findall(r"^FAILED benchmarks/test_perf\.py::test_perf\[(\w+)\] - (.*)$", done.stdout, re.MULTILINE))
    return failed, time.perf_counter() - start, lines[-1] if lines else done.stderr.strip()[-200:]


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
    false_failures, missed = 0, 0
    phases = {"unchanged": [], "planted": ["--plant-slowdown", args.plant]}
    for label, plant in ((name, phases[name]) for name in args.phases):
        for index in range(1, args.runs + 1):
            failed, seconds, last = failed_cases(extra + plant)
            if plant:
                missed += not set(args.expect) & set(failed)  # the gate let the slowdown through
            else:
                false_failures += bool(failed)
            print(f"{label} run {index:2d} ({seconds:.0f} s): failed {sorted(failed) or 'none'} | {last}", flush=True)
            for message in failed.values():
                print(f"    {message}", flush=True)
    print(f"unchanged: {false_failures} of {args.runs} runs failed; planted: {missed} of {args.runs} runs failed "
          f"none of {args.expect}")
    return 0 if false_failures == 0 and missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
