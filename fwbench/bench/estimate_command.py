"""The ``fwbench estimate`` subcommand: predicted wall time and core-hours of a grid profile
(:mod:`fwbench.bench.estimate`).

    fwbench estimate GRID [--profile quick] [--seeds 1 2 3] [--steps 5] [--jobs 2] [--threads 1] [--data-dir DIR]
    fwbench estimate reproduce --profile paper     # every grid `fwbench reproduce` runs for that profile

A cell that fails (its model cannot be built, its task refuses it) is marked failed in the table, as
``fwbench run`` records it; a setup error that every cell would hit (a missing corpus) ends the
command in one line (exit 2).
"""

from __future__ import annotations

import argparse
import sys

import torch

from fwbench.bench.estimate import estimate, format_estimate, measure_step_seconds
from fwbench.errors import FwbenchError
from fwbench.run.environment import use_data_dir

#: The grid name that stands for every grid ``fwbench reproduce`` runs.
REPRODUCE = "reproduce"


def add_estimate_parser(sub) -> None:
    """Register ``estimate`` on the CLI's subparsers."""
    p = sub.add_parser("estimate", help="predicted wall time and core-hours of a grid profile on this machine")
    p.add_argument("grid", help="bundled grid name, path to a .toml grid file, or `reproduce`: every grid that "
                   "`fwbench reproduce --profile P` runs, a run shared by two grids counted once")
    p.add_argument("--profile", default="quick", help="grid profile (default quick)")
    p.add_argument("--seeds", type=int, nargs="+", help="replace the profile's seeds")
    p.add_argument("--steps", type=int, default=5, help="training steps timed per step shape, after one warm-up (default 5)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes the wall time is shown for (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the timed steps (default 1, as runs use)")
    p.add_argument("--data-dir", default=None,
                   help="directory holding datasets, e.g. DIR/tinyshakespeare/input.txt, as for fwbench run "
                   "(default: $FWBENCH_DATA_DIR, then the user cache, then a download)")
    p.set_defaults(func=run_estimate_command)


def run_estimate_command(args: argparse.Namespace) -> int:
    from fwbench.run.grid import expand, load_grid, paper_grids_with

    for name in ("steps", "jobs", "threads"):
        if getattr(args, name) < 1:
            raise FwbenchError(f"--{name}: got {getattr(args, name)}; expected a positive integer")
    torch.set_num_threads(args.threads)
    use_data_dir(args.data_dir)
    if args.grid == REPRODUCE:
        names = paper_grids_with(args.profile)
        title = f"reproduce [{args.profile}] ({', '.join(names)})"
    else:
        names = [args.grid]
        title = f"{load_grid(args.grid).name} [{args.profile}]"
    specs = list({spec.run_id: spec for name in names for spec in expand(load_grid(name), args.profile, args.seeds)
                  }.values())

    def show(cell) -> None:
        timed = f"failed: {cell.error}" if cell.error is not None else f"{cell.step_s * 1e3:.1f} ms/step"
        print(f"  measured {cell.variant} {cell.config.get('S', '')}: {timed}", file=sys.stderr, flush=True)

    cells = estimate(specs, lambda spec: measure_step_seconds(spec, args.steps), on_cell=show)
    print(format_estimate(cells, f"{title}: {len(specs)} runs", jobs=args.jobs))
    return 0
