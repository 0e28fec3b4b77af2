"""The ``fwbench bench`` subcommand: run a benchmark profile, store the records, print the tables
and the acceptance ratios.

    fwbench bench [--profile quick|full] [--device auto|cpu|cuda] [--results-dir results]
                  [--variants dpfp-delta linear ...] [--lengths 256 1024 ...] [--threads 1] [--quiet]
"""

from __future__ import annotations

import argparse

import torch

from fwbench.bench.suite import BENCH_RECORDS, FORWARD, FORWARD_BACKWARD, PROFILES, run_bench
from fwbench.bench.summary import (
    acceptance_ratios,
    bench_frame,
    format_ratios,
    summary_record,
    sweep_table,
    throughput_table,
    time_table,
)
from fwbench.run.environment import DEVICE_CHOICES, describe_environment, resolve_device, set_torch_threads
from fwbench.run.store import ResultsStore


def add_bench_parser(sub) -> None:
    """Register ``bench`` on the CLI's subparsers."""
    p = sub.add_parser("bench", help="time and peak memory of every variant and form against T, with anchors")
    p.add_argument("--profile", default="quick",
                   help=f"one of {', '.join(f'{k} ({v.description})' for k, v in PROFILES.items())}; default quick")
    p.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICE_CHOICES)} or cuda:N (default auto)")
    p.add_argument("--results-dir", default="results", help=f"store directory; records go to {BENCH_RECORDS}")
    p.add_argument("--variants", nargs="+", help="variant specs to measure (default: every family)")
    p.add_argument("--lengths", type=int, nargs="+", help="sequence lengths T (default: the profile's)")
    p.add_argument("--no-extras", action="store_true",
                   help="only the variant × form × T grid: no chunk sweep, fla comparison, precision or training")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1: timings on a shared machine are steadier)")
    p.add_argument("--quiet", action="store_true", help="no line per case while running (stderr)")
    p.set_defaults(func=run_bench_command)


def _print_table(title: str, table) -> None:
    if table is None or table.empty:
        return
    print(f"\n{title}")
    print(table.to_string(index=False))


def run_bench_command(args: argparse.Namespace) -> int:
    set_torch_threads(args.threads)
    device = resolve_device(args.device)
    # run_bench checks the store is writable after the options, before the matmul peak is timed
    store = ResultsStore(args.results_dir, records_file=BENCH_RECORDS)
    result = run_bench(args.profile, device, store=store, variants=args.variants, lengths=args.lengths,
                       quiet=args.quiet, extras=not args.no_extras)
    frame = bench_frame(result.records)
    where = f"{device}, {torch.get_num_threads()} thread(s), B=2 H=8 d_head=64 fp32"
    _print_table(f"forward: median ms [peak MiB] ({where})", time_table(frame, FORWARD))
    _print_table(f"forward+backward: median ms [peak MiB] ({where})", time_table(frame, FORWARD_BACKWARD))
    _print_table(f"forward throughput and achieved GFLOP/s (fp32 matmul peak {result.extras['matmul_peak_gflops']:.1f} "
                 "GFLOP/s at the start; the GFLOP/s acceptance ratio divides a case's figure by the peak timed "
                 "right before that case)", throughput_table(frame))
    _print_table("chunk-size sweep (median ms)", sweep_table(frame))
    skipped = frame[frame["status"] == "skipped"] if not frame.empty else frame
    if not skipped.empty:
        print("\nnot measured (a cap of the profile, or a missing optional dependency):")
        for reason, group in skipped.groupby("reason"):
            lengths = ", ".join(str(T) for T in sorted(set(group["T"])))
            cases = ", ".join(sorted(set(group["variant"] + " " + group["form"])))
            print(f"  {reason}: {len(group)} case(s) at T = {lengths}: {cases}")
    ratios = acceptance_ratios(frame, result.extras)
    print("\nacceptance ratios (measured in this run; the machine may be shared, so compare ratios only):")
    print(format_ratios(ratios))
    steps = result.extras.get("step_times") or []
    if steps:
        print("\ntraining step times (loss, backward, Adam; batch 32, one fixed batch; "
              f"{torch.get_num_threads()} thread(s)):")
        for row in steps:
            print(f"  {row['variant']:<16} Setting {row['setting']} S={row['S']:<4} {row['step_s'] * 1e3:9.1f} ms "
                  f"({row['repeats']} timed)")
    store.append(summary_record(result.session, result.extras, ratios, describe_environment(device)))
    print(f"\n{len(result.records)} records appended to {store.path} (session {result.session})")
    return 0
