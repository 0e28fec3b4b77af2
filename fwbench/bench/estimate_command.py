"""The ``fwbench estimate`` subcommand: predicted wall time and core-hours of a grid profile
(:mod:`fwbench.bench.estimate`).

    fwbench estimate GRID [--profile quick] [--seeds 1 2 3] [--steps 5] [--jobs 2] [--threads 1] [--data-dir DIR]
    fwbench estimate reproduce --profile paper     # every grid `fwbench reproduce` runs for that profile
    fwbench estimate reproduce --profile paper --against results/paper   # beside the runs it measured

A cell that fails (its model cannot be built, its task refuses it) is marked failed in the table, as
``fwbench run`` records it; a setup error that every cell would hit (a missing corpus) ends the
command in one line (exit 2).
"""

from __future__ import annotations

import argparse
import sys

from fwbench.bench.estimate import (
    check_estimate_steps,
    estimate,
    format_estimate,
    measure_eval_seconds,
    measure_step_seconds,
    run_seconds,
)
from fwbench.bench.estimate_against import compare, format_cells, format_comparison, total
from fwbench.bench.schedule import grids_wall_seconds
from fwbench.errors import FwbenchError, one_line, refuse_empty_path
from fwbench.run.environment import set_torch_threads, use_data_dir

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
    p.add_argument("--no-eval", action="store_true", help="leave evaluations out (a training-only estimate)")
    p.add_argument("--against", metavar="RESULTS_DIR", default=None,
                   help="also print, per grid and per cell, the estimate beside the finished records of the "
                   "profile's runs in RESULTS_DIR (Σ wall_s, first start → last end, ratios measured / predicted)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the timed steps (default 1, as runs use)")
    p.add_argument("--data-dir", default=None,
                   help="directory holding datasets, e.g. DIR/tinyshakespeare/input.txt, as for fwbench run "
                   "(default: $FWBENCH_DATA_DIR, then the user cache, then a download)")
    p.set_defaults(func=run_estimate_command)


def run_estimate_command(args: argparse.Namespace) -> int:
    from fwbench.run.grid import load_grid, paper_grids_with

    check_estimate_steps(args.steps)  # before minutes of timing
    if args.jobs < 1:
        raise FwbenchError(f"--jobs: got {args.jobs}; expected a positive integer")
    set_torch_threads(args.threads)
    use_data_dir(args.data_dir)
    records = None if args.against is None else _finished_records(args.against)  # before minutes of timing
    if args.grid == REPRODUCE:
        names = paper_grids_with(args.profile)
        title = f"reproduce [{args.profile}] ({', '.join(names)})"
    else:
        names = [args.grid]
        title = f"{load_grid(args.grid).name} [{args.profile}]"
    grid_specs = _grid_specs(names, args.profile, args.seeds)
    specs = [spec for _, part in grid_specs for spec in part]

    def show(cell) -> None:
        timed = (f"failed: {cell.error}" if cell.error is not None else
                 f"{cell.step_s * 1e3:.1f} ms/step, {cell.eval_s * 1e3:.1f} ms/evaluation")
        print(f"  measured {cell.variant} {cell.config.get('S', '')}: {timed}", file=sys.stderr, flush=True)

    cells = estimate(specs, lambda spec: measure_step_seconds(spec, args.steps), on_cell=show,
                     eval_timer=None if args.no_eval else measure_eval_seconds)
    wall_s = grids_wall_seconds((run_seconds(part, cells) for _, part in grid_specs), args.jobs)
    print(format_estimate(cells, f"{title}: {len(specs)} runs", jobs=args.jobs, wall_s=wall_s))
    if records is not None:
        parts = [compare(name, part, cells, records, args.jobs) for name, part in grid_specs]
        print()
        print(format_comparison(parts, total("total", parts, specs, records), args.jobs, args.against))
        print()
        print(format_cells(grid_specs, cells, records))
    return 0


def _grid_specs(names: list[str], profile: str, seeds: list[int] | None) -> list[tuple[str, list]]:
    """(grid name, its runs in grid order) for each grid, a run shared with an earlier grid left to
    that grid (``fwbench reproduce`` trains it there and skips it later)."""
    from fwbench.run.grid import expand, load_grid

    seen: set[str] = set()
    parts = []
    for name in names:
        grid = load_grid(name)
        part = [spec for spec in expand(grid, profile, seeds) if spec.run_id not in seen]
        seen.update(spec.run_id for spec in part)
        parts.append((grid.name, part))
    return parts


#: What ``--against`` reads of a record (:mod:`fwbench.bench.estimate_against`), with its type.
COMPARED_FIELDS = {"status": str, "steps": int, "wall_s": (int, float)}
#: The fields of :data:`COMPARED_FIELDS` that the comparison sums over records, read as floats.
FLOAT_SUMMED_FIELDS = ("steps", "wall_s")
#: What it reads where present: each absent, null or of its type (a start or end that is no ISO 8601
#: timestamp leaves the measured wall of its grid n/a).
OPTIONAL_COMPARED_FIELDS = {"steps_per_s": (int, float), "started_at": str, "ended_at": str}


def _finished_records(results_dir: str) -> dict[str, dict]:
    """run_id → record of the store in ``results_dir``, each holding what the comparison reads
    (:data:`COMPARED_FIELDS`, :data:`OPTIONAL_COMPARED_FIELDS`; :data:`FLOAT_SUMMED_FIELDS` as floats); every
    other line is named in a warning.

    Raises:
        FwbenchError: it is empty (which would read the working directory) or holds no records file, or one
            that cannot be read (:meth:`ResultsStore.load`).
    """
    from fwbench.analysis.records import is_of_kind
    from fwbench.run.store import ResultsStore

    refuse_empty_path("--against", results_dir, "a results directory that fwbench run wrote")

    store = ResultsStore(results_dir, option="--against")
    # read first: a records file that is a directory or a link looping back to itself is named as it is
    # (ResultsStore.load), not called missing
    loaded = store.load()
    if not store.path.is_file():
        store.refuse_unreachable("a results directory that fwbench run wrote")
        store.refuse_dangling_records_file()
        raise FwbenchError(f"--against: no records file {str(store.path)!r}; expected a results directory "
                           "that fwbench run wrote")
    for problem in loaded.problems:
        print(f"fwbench: warning: {problem}", file=sys.stderr)
    readable = {}
    for record in loaded.records:
        # a record missing a field the comparison sums, or holding it as another type (a hand-edited
        # wall_s of "3"), made the comparison a traceback; it is left out and named
        wrong = [name for name, kind in COMPARED_FIELDS.items() if not is_of_kind(record.get(name), kind)]
        wrong += [name for name, kind in OPTIONAL_COMPARED_FIELDS.items()
                  if record.get(name) is not None and not is_of_kind(record[name], kind)]
        if wrong:
            print(f"fwbench: warning: {one_line(store.path)}: record {record['run_id']!r} left out of the comparison "
                  f"(missing or mistyped: {', '.join(wrong)})", file=sys.stderr)
        else:
            # summed as floats: each int within a float's range (is_of_kind), the sum of two of 308 digits was not,
            # and the ratios raised OverflowError (int too large to convert to float), a traceback
            readable[record["run_id"]] = {**record, **{name: float(record[name]) for name in FLOAT_SUMMED_FIELDS}}
    return readable
