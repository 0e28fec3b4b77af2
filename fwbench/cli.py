"""The ``fwbench`` command line.

    fwbench variants [--d-key 64]                 list the attention variants and their d_dot
    fwbench grids                                 list the bundled grids and their profiles
    fwbench run GRID [--profile quick] [--device auto] [--results-dir results] [--seeds 1 2]
    fwbench report [--results-dir results] [--out reports]
    fwbench reproduce [--profile quick]           every paper grid, then the report
    fwbench bench [--profile quick|full] [--device auto]   speed and memory of every variant and form

Bad input (unknown variant, grid, profile or device; a malformed grid file) prints one line
``fwbench: error: …`` and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from variants import VariantError, d_dot_of, list_variants, parse_spec

from .bench_command import add_bench_parser
from .environment import DEVICE_CHOICES, resolve_device
from .errors import FwbenchError

#: The grids ``fwbench reproduce`` runs, in order: together they regenerate the paper's claims.
PAPER_GRIDS = ["capacity"]
EXIT_USAGE = 2


def _cmd_variants(args: argparse.Namespace) -> int:
    print(f"{'variant':<18} {'rule':<8} {'d_dot (d_key=' + str(args.d_key) + ')':<18} parameters (defaults)  description")
    for info in list_variants():
        spec = parse_spec(info.name)
        d_dot = d_dot_of(spec, args.d_key)
        params = ", ".join(f"{k}={v}" for k, v in info.params.items()) or "-"
        print(f"{info.name:<18} {info.rule:<8} {str(d_dot if d_dot else '-'):<18} {params:<22} {info.description}")
    return 0


def _cmd_grids(args: argparse.Namespace) -> int:
    from .grid import available_grids, expand, load_grid

    for name in available_grids():
        grid = load_grid(name)
        profiles = ", ".join(f"{p} ({len(expand(grid, p))} runs)" for p in grid.profiles)
        print(f"{name:<12} task={grid.task:<10} {profiles}\n{'':<12} {grid.description}")
    return 0


def _run_grids(args: argparse.Namespace, names: list[str]) -> None:
    import torch

    from .grid import expand, load_grid
    from .runner import run_grid
    from .store import ResultsStore

    if args.threads < 1:
        raise FwbenchError(f"--threads: got {args.threads}; expected a positive integer")
    torch.set_num_threads(args.threads)
    profile, seeds, quiet, results_dir = args.profile, args.seeds, args.quiet, args.results_dir
    device = resolve_device(args.device)
    store = ResultsStore(results_dir)
    grids = [load_grid(name) for name in names]  # validate every grid before running any
    plans = [(grid, expand(grid, profile, seeds)) for grid in grids]
    for grid, specs in plans:
        started = time.perf_counter()
        summary = run_grid(specs, store, device, quiet=quiet)
        print(
            f"grid {grid.name} [{profile}] on {device}: {summary['ran']} run, {summary['skipped']} already in "
            f"{store.path}, {summary['diverged']} diverged ({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


def _cmd_run(args: argparse.Namespace) -> int:
    _run_grids(args, [args.grid])
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import render_report

    path = render_report(args.results_dir, args.out)
    print(f"report written to {path}")
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .report import render_report

    _run_grids(args, PAPER_GRIDS)
    path = render_report(args.results_dir, args.out)
    print(f"report written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fwbench", description="Benchmark and reproduce fast-weight attention (Schlag et al. 2021)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("variants", help="list the attention variants and their d_dot")
    p.add_argument("--d-key", type=int, default=64, help="key size used to compute d_dot (default 64)")
    p.set_defaults(func=_cmd_variants)

    p = sub.add_parser("grids", help="list the bundled grids and their profiles")
    p.set_defaults(func=_cmd_grids)

    def add_run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--profile", default="quick", help="grid profile (default quick)")
        p.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICE_CHOICES)} or cuda:N (default auto)")
        p.add_argument("--results-dir", default="results", help="results store directory (default results)")
        p.add_argument("--seeds", type=int, nargs="+", help="override the profile's seeds")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument(
            "--threads", type=int, default=1,
            help="CPU threads for torch (default 1: the retrieval models are too small to gain from more, "
            "and idle OpenMP threads fighting other processes for 2 cores slow a run down 40x)",
        )

    p = sub.add_parser("run", help="run a grid (skipping runs already in the store)")
    p.add_argument("grid", help="bundled grid name or path to a .toml grid file")
    add_run_options(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("report", help="render REPORT.md and figures from the store")
    p.add_argument("--results-dir", default="results", help="results store directory (default results)")
    p.add_argument("--out", default="reports", help="output directory (default reports)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("reproduce", help="run every paper grid for a profile, then the report")
    add_run_options(p)
    p.add_argument("--out", default="reports", help="report directory (default reports)")
    p.set_defaults(func=_cmd_reproduce)

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fwbench`` console command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (FwbenchError, VariantError) as exc:
        print(f"fwbench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fwbench: interrupted; finished runs are kept, rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
