"""The ``fwbench`` command line.

    fwbench variants [--d-key 64]                 list the attention variants and their d_dot
    fwbench grids                                 list the bundled grids and their profiles
    fwbench run GRID [--profile quick] [--device auto] [--results-dir results] [--seeds 1 2]
                     [--launcher local|ray] [--jobs N] [--no-pack] [--ray-address ADDR] [--cpus-per-run 1] [--gpus-per-run 0]
    fwbench report [--results-dir results] [--out reports]
    fwbench reproduce [--profile quick|paper|full] [--jobs N]   every paper grid, the probe, then the report
    fwbench capacity [--profile quick]            the capacity-vs-ν grid, its figure and a CSV with CIs
    fwbench probe [--out reports]                 training-free capacity probe (seconds)
    fwbench sample --checkpoint PATH [--prompt "It is"] [--tokens 500] [--temperature 0.8]
                                                  text from a trained language model
    fwbench bench [--profile quick|full] [--device auto]   speed and memory of every variant and form
    fwbench estimate GRID [--profile full] [--steps 5]      predicted wall time and core-hours of a profile
    fwbench estimate GRID --profile P --against DIR         the same beside the runs DIR's records measured

``variants``, ``report``, ``bench`` and ``probe`` take ``--variant-module PATH_OR_MODULE`` (repeatable):
the user's own variant modules, imported first (a grid names its own with ``variant_modules``).

Bad input (unknown variant, grid, profile or device; a malformed grid file) prints one line
``fwbench: error: …`` and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fwbench.bench.command import add_bench_parser
from fwbench.bench.estimate_command import add_estimate_parser
from fwbench.errors import FwbenchError, check_seed, refuse_empty_path
from fwbench.run.allocator import tune_malloc
from fwbench.run.environment import DEVICE_CHOICES, check_device_name, resolve_device, set_torch_threads, use_data_dir
from fwbench.run.grid import paper_grids_with
from fwbench.run.launchers import LAUNCHERS, LaunchOptions, check_ray_resources
from fwbench.tasks.corpus import DATA_DIR_ENV, CorpusError
from fwbench.variants import VariantError, d_dot_of, import_variant_modules, list_variants, parse_spec
from fwbench.variants.errors import MAX_SIZE
from fwbench.variants.kernels.fla_dispatch import fla_enabled

#: The grid ``fwbench capacity`` runs.
CAPACITY_GRID = "capacity_nu"
EXIT_USAGE = 2
#: Exit status when the reader of stdout went away (``fwbench grids | head -1``): 128 + SIGPIPE, what
#: a tool killed by the signal reports, so a pipeline sees the same status as for ``cat``.
EXIT_BROKEN_PIPE = 141
#: Commands that accept ``--variant-module`` (``run`` reads the grid's ``variant_modules`` instead, so
#: that every worker process imports the same modules).
VARIANT_MODULE_COMMANDS = ("variants", "report", "bench", "probe")


def _cmd_variants(args: argparse.Namespace) -> int:
    if args.d_key < 1:
        raise FwbenchError(f"--d-key: got {args.d_key}; expected a positive integer")
    if args.d_key > MAX_SIZE:  # the table's header was printed, then refused as d_key (not --d-key)
        raise FwbenchError(f"--d-key: got {args.d_key}; expected at most {MAX_SIZE} (2**63 - 1)")
    d_dot_header = f"d_dot (d_key={args.d_key})"
    print(f"{'variant':<20} {'rule':<8} {d_dot_header:<18} parameters (defaults)  description")
    for info in list_variants():
        spec = parse_spec(info.name)
        d_dot = d_dot_of(spec, args.d_key)
        params = ", ".join(f"{k}={v}" for k, v in info.params.items()) or "-"
        print(f"{info.name:<20} {info.rule:<8} {str(d_dot if d_dot else '-'):<18} {params:<22} {info.description}")
    return 0


def _cmd_grids(args: argparse.Namespace) -> int:
    from fwbench.run.grid import available_grids, expand, load_grid

    for name in available_grids():
        grid = load_grid(name)
        profiles = ", ".join(f"{p} ({len(expand(grid, p))} runs)" for p in grid.profiles)
        print(f"{name:<12} task={grid.task:<10} {profiles}\n{'':<12} {grid.description}")
    return 0


def _run_grids(args: argparse.Namespace, names: list[str], before_training: Callable[[], None] | None = None) -> list:
    """Load, validate and expand every grid of ``names``, call ``before_training`` (a command's own setup: made
    after every option and grid was checked, so that a refusal leaves nothing behind), then train them in turn."""
    from fwbench.run import distributed
    from fwbench.run.grid import expand, load_grid
    from fwbench.run.pack_plan import pack_policy
    from fwbench.run.runner import run_grid, run_grid_distributed
    from fwbench.run.store import ResultsStore

    set_torch_threads(args.threads)
    use_data_dir(args.data_dir)
    profile, seeds, quiet, results_dir = args.profile, args.seeds, args.quiet, args.results_dir
    launcher = getattr(args, "launcher", "local")
    jobs = getattr(args, "jobs", 1)
    if jobs < 1:
        raise FwbenchError(f"--jobs: got {jobs}; expected a positive integer")
    # Fail on a bad --device before any run starts; Ray workers check availability where they run.
    device = resolve_device(args.device) if launcher == "local" else check_device_name(args.device)
    context = distributed.context_from_environment()
    if context is not None:
        if launcher != "local":
            raise FwbenchError(
                f"--launcher: got {launcher!r} under torchrun; data-parallel training runs with the local "
                "launcher only (torchrun starts the processes)"
            )
        if jobs != 1:
            raise FwbenchError(f"--jobs: got {jobs} under torchrun; expected 1 (torchrun starts the processes)")
        context, device = distributed.start(context, device)
        quiet = quiet or not context.is_main
    if launcher == "local":  # Ray's options would be silently ignored, as --jobs would be under Ray (below)
        given = [name for name, value, default in (
            ("--ray-address", getattr(args, "ray_address", None), None),
            ("--cpus-per-run", getattr(args, "cpus_per_run", 1.0), 1.0),
            ("--gpus-per-run", getattr(args, "gpus_per_run", 0.0), 0.0),
            ("--ray-num-cpus", getattr(args, "ray_num_cpus", None), None)) if value != default]
        if given:
            raise FwbenchError(f"{given[0]}: given with --launcher local, where it has no effect; expected "
                               "--launcher ray (it is one of Ray's options), or leave it out")
    if jobs != 1 and launcher != "local":
        raise FwbenchError(f"--jobs: got {jobs} with --launcher {launcher}; expected 1 (worker processes are the "
                           "local launcher's; Ray sizes its own with --cpus-per-run)")
    options = LaunchOptions(
        launcher=launcher, device=str(device), threads=args.threads,
        ray_address=getattr(args, "ray_address", None), cpus_per_run=getattr(args, "cpus_per_run", 1.0),
        gpus_per_run=getattr(args, "gpus_per_run", 0.0), ray_num_cpus=getattr(args, "ray_num_cpus", None),
        jobs=jobs,
    )
    if launcher == "ray":
        check_ray_resources(options)  # one line before any progress bar or Ray start
    pack_policy(getattr(args, "pack", True))  # a bad $FWBENCH_PACK fails before any training
    fla_enabled()  # so does a bad $FWBENCH_FLA (VariantError: one line, exit 2)
    store = ResultsStore(results_dir)
    grids = [load_grid(name) for name in names]  # validate every grid before running any
    for note in (note for grid in grids for note in grid.warnings):
        print(f"fwbench: warning: {note}", file=sys.stderr)
    for problem in store.load().problems:
        print(f"fwbench: warning: {problem}", file=sys.stderr)
    plans = [(grid, expand(grid, profile, seeds)) for grid in grids]
    if context is not None:  # every rank fails alike, before any training
        for _, specs in plans:
            for spec in specs:
                context.check_batch_size(spec.task_config().batch_size)
    if before_training is not None:
        before_training()
    for grid, specs in plans:
        started = time.perf_counter()
        if context is None:
            summary = run_grid(specs, store, options, quiet=quiet, pack=getattr(args, "pack", True))
        else:
            summary = run_grid_distributed(specs, store, context, device, quiet=quiet)
            if not context.is_main:
                continue
            launcher = f"torchrun, {context.world_size} processes, {context.backend}"
        # a run trained here whose record another driver stored first is no run trained now: said so, not counted
        discarded = summary.get("discarded", 0)
        also = (f", {discarded} trained here but discarded (another driver stored {'it' if discarded == 1 else 'them'} "
                "first)") if discarded else ""
        print(
            f"grid {grid.name} [{profile}] on {device} ({launcher}): {summary['ran']} trained now, {summary['skipped']} "
            f"already in {_one_line(store.path)}{also}, {summary['diverged']} diverged, {summary['failed']} failed "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    return [spec for _, specs in plans for spec in specs]


def _cmd_run(args: argparse.Namespace) -> int:
    _run_grids(args, [args.grid])
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from fwbench.bench.suite import BENCH_RECORDS
    from fwbench.report.render import render_report
    from fwbench.run.store import RECORDS_FILE, ResultsStore

    store = ResultsStore(args.results_dir)  # refuses --results-dir '' (the working directory) before --out is created
    if not Path(args.results_dir).is_dir():
        store.refuse_unreachable("the directory that fwbench run wrote to")
        raise FwbenchError(
            f"--results-dir: got {args.results_dir!r}, which is not a directory; expected the directory "
            "that fwbench run wrote to"
        )
    # --out is judged before the store, but created only after it: an existing --out (a file, or '',
    # the working directory) is refused here with nothing created; a new one waits for the store
    if Path(args.out).exists():
        _make_out_dir(args.out)
    for records_file in (RECORDS_FILE, BENCH_RECORDS):  # a link to nothing was read as an empty file, unnamed
        ResultsStore(args.results_dir, records_file).refuse_dangling_records_file()
    _refuse_empty_store(args.results_dir, args.out)
    _make_out_dir(args.out)
    try:
        path = render_report(args.results_dir, args.out, echo=print)
    except VariantError as exc:
        if not str(exc).startswith("variant: got"):  # not a name the registry lacks: --variant-module cannot help
            raise FwbenchError(f"cannot render the report of {_one_line(args.results_dir)}: {exc}") from None
        raise FwbenchError(f"{exc} (a record in {_one_line(args.results_dir)} names a variant this process does not know: "
                           "if your own module registers it, pass --variant-module PATH_OR_MODULE)") from None
    print(f"report written to {path}")
    return 0


def _refuse_empty_store(results_dir: str | Path, out: str | Path) -> None:
    """Refuse a results directory that holds neither run nor bench records: its report says only
    "no runs yet" in every section, and it overwrote the report already in ``out`` (a mistyped
    ``--results-dir`` replaced reports/REPORT.md and exited 0).

    Raises:
        FwbenchError: no record in ``results_dir``'s runs.jsonl or bench.jsonl; where lines were
            skipped as corrupt, their number and the first one's place (PATH:LINE) are named; where
            records were skipped as no run record or no benchmark record (a field missing or mistyped),
            their number, the first one's run id and its fields; benchmark cases none of them measured (status
            oom or skipped), their number.
    """
    from fwbench.analysis.records import run_record_faults
    from fwbench.bench.suite import BENCH_RECORDS
    from fwbench.bench.summary import SUMMARY_KIND, bench_record_faults
    from fwbench.run.store import RECORDS_FILE, ResultsStore

    runs_store, bench_store = ResultsStore(results_dir), ResultsStore(results_dir, BENCH_RECORDS)
    runs, benches = runs_store.load(), bench_store.load()
    no_run_record = [(record["run_id"], fields) for record in runs.records if (fields := run_record_faults(record))]
    # a bench.jsonl line such as {"run_id": "b"} is no benchmark record either: it let a store of nothing
    # readable through, to a report of "no runs yet" in every section over the one in --out
    bench_faults = [(record, bench_record_faults(record)) for record in benches.records]  # each checked once
    no_bench_record = [(record["run_id"], fields) for record, fields in bench_faults if fields]
    readable_benches = [record for record, fields in bench_faults if not fields]
    # a session's summary alone is no measurement: the speed section draws only cases ("bench" records), and of
    # those only the measured ones (status ok): a store of oom or skipped cases drew an empty figure, no table
    cases = [record for record in readable_benches if record.get("kind") == "bench"]
    measured = [record for record in cases if record["status"] == "ok"]
    if len(no_run_record) < len(runs.records) or measured:
        return
    summaries = [record for record in readable_benches if record.get("kind") == SUMMARY_KIND]
    # a store of corrupt lines only is told apart from an empty one: the user's records may be there, unreadable;
    # a record that parsed but is no run record is no corrupt line, and what is wrong with it is named, as in the
    # report. Built from the parts, not read back out of the problems' text: a --results-dir holding ': ' was cut
    # there, and a run id holding " skipped: no run record" lost it, the marker left in the message
    # the places are written on the error's one line: a newline in --results-dir split it in two
    runs_path, bench_path = _one_line(runs_store.path), _one_line(bench_store.path)
    corrupt = ([f"{runs_path}:{number}" for number in runs.skipped_lines] +
               [f"{bench_path}:{number}" for number in benches.skipped_lines])
    found = "".join([
        f"; {len(corrupt)} corrupt or truncated line(s) skipped, the first {corrupt[0]}" if corrupt else "",
        f"; {len(no_run_record)} record(s) skipped as no run record, the first {runs_path}: record "
        f"{no_run_record[0][0]!r} (missing or mistyped: {', '.join(no_run_record[0][1])})" if no_run_record else "",
        f"; {len(no_bench_record)} record(s) skipped as no benchmark record, the first {bench_path}: record "
        f"{no_bench_record[0][0]!r} (missing or mistyped: {', '.join(no_bench_record[0][1])})" if no_bench_record else "",
        f"; {len(cases)} benchmark case(s) in {bench_path}, none measured (status oom or skipped)" if cases else "",
        f"; {len(summaries)} session summary record(s) in {bench_path} but no measured case" if summaries else ""])
    raise FwbenchError(
        f"--results-dir: {str(results_dir)!r} holds no run records (no record in {RECORDS_FILE} or {BENCH_RECORDS}"
        f"{found}); expected the directory that fwbench run, reproduce or bench wrote to; "
        f"nothing was written to {str(out)!r}"
    )


def _one_line(path: str | Path) -> str:
    """``path`` as text for a one-line message (:func:`fwbench.errors.one_line`)."""
    from fwbench.errors import one_line

    return one_line(path)


def _make_out_dir(out: str | Path) -> Path:
    """Create ``--out`` before any run trains: a path that cannot be a directory (an existing file)
    would otherwise fail only after hours of training, when the report or CSV is written.

    Raises:
        FwbenchError: ``out`` is empty (``Path("")`` is the working directory: ``--out "$UNSET"`` wrote
            there) or cannot be created as a directory.
    """
    refuse_empty_path("--out", out, "a directory path")
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FwbenchError(f"--out: cannot create {str(out)!r}: {exc.strerror}") from None
    return Path(out)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from fwbench.report.render import render_report
    from fwbench.tasks.corpus import locate_corpus

    grids = paper_grids_with(args.profile)

    def prepare() -> None:  # after the seeds and grids are checked: --seeds 2**32 + 1 tried a download first
        _make_out_dir(args.out)
        if "shakespeare" in grids:  # the LM grid runs last: find its corpus before the synthetic grids' minutes
            locate_corpus(args.data_dir)

    _run_grids(args, grids, before_training=prepare)
    _write_probe(Path(args.out))
    path = render_report(args.results_dir, args.out, echo=print)
    print(f"report written to {path}")
    return 0


def _write_probe(out: Path, d_key: int = 64, trials: int = 4, seed: int = 0) -> None:
    from fwbench.report.probe import write_probe

    try:
        csv, figure, seconds = write_probe(out, d_key=d_key, trials=trials, seed=seed)
    except OSError as exc:
        raise FwbenchError(f"--out: cannot write the probe into {str(out)!r}: {exc}") from None
    print(f"probe written to {csv} and {figure} ({seconds:.1f} s)", flush=True)


def _check_probe_variants(d_key: int) -> None:
    """Refuse a ``--d-key`` a probed variant cannot be built at (``--d-key 1``: DPFP ν = 2 needs
    ν < 2·d_key), before the output directory is made; it was refused part-way through the probe
    with a line that did not name the option.

    Raises:
        FwbenchError: naming ``--d-key`` and the variant's reason.
    """
    from fwbench.report.probe import PROBE_VARIANTS
    from fwbench.variants.registry import check_spec

    for spec in PROBE_VARIANTS:
        try:
            check_spec(spec, d_key)
        except VariantError as exc:
            raise FwbenchError(f"--d-key: got {d_key}; expected a key size every probed variant takes ({spec}: {exc})") from None


def _check_probe_fits(d_key: int, trials: int) -> None:
    """Refuse a probe whose tensors cannot fit in this machine's memory: ``--trials 10**14`` or
    ``--d-key 10**8`` raised an allocation traceback ("DefaultCPUAllocator: can't allocate memory")
    after the output directory was made.

    Raises:
        FwbenchError: :func:`~fwbench.report.probe.probe_bytes` exceeds the physical memory.
    """
    import torch

    from fwbench.bench.suite import device_memory_bytes
    from fwbench.report.probe import probe_bytes

    needed, held = probe_bytes(d_key, trials), device_memory_bytes(torch.device("cpu"))
    if needed > held:
        raise FwbenchError(f"--d-key, --trials: got {d_key}, {trials}; expected smaller values (the probe's keys, "
                           f"features and values, at least {needed / 2**30:.3g} GiB in fp32, would not fit in this "
                           f"machine's {held / 2**30:.3g} GiB of memory)")


def _cmd_probe(args: argparse.Namespace) -> int:
    import torch

    for option, value in (("--d-key", args.d_key), ("--trials", args.trials)):
        if value < 1:
            raise FwbenchError(f"{option}: got {value}; expected a positive integer")
    check_seed(args.seed, "--seed")  # as fwbench run and sample check it
    _check_probe_variants(args.d_key)
    _check_probe_fits(args.d_key, args.trials)
    torch.set_num_threads(1)
    _write_probe(_make_out_dir(args.out), args.d_key, args.trials, args.seed)
    return 0


def _cmd_capacity(args: argparse.Namespace) -> int:
    from fwbench.analysis.capacity import capacity_intervals, describe, write_capacity_csv
    from fwbench.analysis.claims import (
        claim_dpfp_capacity_grows_with_nu,
        claim_sum_rule_failure_scales_with_d_dot,
        without_failed_runs,
    )
    from fwbench.analysis.records import readable_run_records, records_frame
    from fwbench.analysis.verdicts import leaning_note
    from fwbench.report.interval_figures import capacity_vs_d_dot_figure, official_capacities
    from fwbench.run.grid import expand, load_grid
    from fwbench.run.store import ResultsStore

    if not 0 < args.threshold < math.inf:  # inf would call every memory retrieving, whatever its loss
        raise FwbenchError(f"--threshold: got {args.threshold}; expected a finite loss > 0")
    grid = load_grid(args.grid)
    if grid.task != "retrieval":  # refused before its runs train, not after, for want of a capacity
        raise FwbenchError(f"--grid: got {args.grid!r}, a grid of task {grid.task}; expected a retrieval grid "
                           "(capacity, capacity_nu, or a Setting 1 grid of your own)")
    settings = sorted({spec.task_config().setting for spec in expand(grid, args.profile, args.seeds)})
    if settings != [1]:  # the curves would mix settings' losses, beside Setting 1's official capacities
        raise FwbenchError(f"--grid: got {args.grid!r}, whose runs are of setting {', '.join(map(str, settings))}; "
                           "expected Setting 1 runs only (capacity is read from Setting 1's loss against S)")
    _make_out_dir(args.out)
    name = grid.name
    specs = _run_grids(args, [args.grid])
    wanted = {spec.run_id for spec in specs}
    store = ResultsStore(args.results_dir)
    records, unreadable = readable_run_records([r for r in store.records() if r["run_id"] in wanted], store.path)
    for problem in unreadable:  # a run id of this grid held by a record that is no run record
        print(f"fwbench: warning: {problem}", file=sys.stderr)
    frame = records_frame(records)
    rows = frame[frame["d_dot"].notna()] if not frame.empty else frame
    if rows.empty:
        # a run whose record is skipped is not retrained (its run id is stored): say so, or the message
        # reads as if the grid had no fast-weight variant
        why = (f" ({len(unreadable)} of its runs {'has' if len(unreadable) == 1 else 'have'} a record skipped as no "
               "run record, named above; delete those lines from the store to retrain them)" if unreadable else "")
        raise FwbenchError(f"grid {name}: no fast-weight runs to estimate a capacity from{why}")
    table = capacity_intervals(rows, threshold=args.threshold)
    table.insert(0, "setting", int(rows["setting"].iloc[0]))
    out = Path(args.out)
    csv = write_capacity_csv(table, out / f"{name}.csv")
    figure = capacity_vs_d_dot_figure(table, out / f"{name}.png", official_capacities(args.threshold))
    for _, row in table.iterrows():
        print(f"{row['variant']:<18} d_key {int(row['d_key']):<4} d_dot {int(row['d_dot']):<5} "
              f"capacity {describe(row)}")
    print(f"capacities written to {csv}, figure to {figure}")
    for claim in (claim_dpfp_capacity_grows_with_nu, claim_sum_rule_failure_scales_with_d_dot):
        result = claim(without_failed_runs(frame))  # a run that raised is no evidence, as in the report
        print(f"{result.id} {result.verdict}{leaning_note(result)}: {result.measured}\n    evidence: {result.evidence}")
    return 0


def _cmd_sample(args: argparse.Namespace) -> int:
    from fwbench.run.sampling import sample_from_checkpoint

    set_torch_threads(args.threads)
    text, info = sample_from_checkpoint(args.checkpoint, args.prompt, args.tokens, args.temperature, args.seed,
                                        resolve_device(args.device), top_k=args.top_k)
    temperature = args.temperature + 0.0  # -0.0 samples as 0.0 and is shown so
    print(f"# {info['variant']}, step {info['step']}, temperature {temperature}, seed {args.seed}",
          file=sys.stderr)
    print(text)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, reading every negative number as a value: before Python 3.13 it read only ``-1`` and
    ``-0.5`` so, and ``--temperature -1e-5`` (or ``-inf``) was answered "expected one argument" instead of the
    option's own range (break-it pass AU). The subcommands' parsers are of this class too."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(
            r"^-(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:e[-+]?\d[\d_]*)?$|^-(?:inf|infinity|nan)$", re.IGNORECASE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
            "--data-dir", default=None,
            help=f"directory holding datasets, e.g. DIR/tinyshakespeare/input.txt (default: ${DATA_DIR_ENV}, "
            "then the user cache, then a download)",
        )
        p.add_argument(
            "--threads", type=int, default=1,
            help="CPU threads for torch (default 1: the retrieval models are too small to gain from more, "
            "and idle OpenMP threads fighting other processes for 2 cores slow a run down 40x)",
        )

    def add_local_launcher_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--jobs", type=int, default=1,
                       help="local launcher: worker processes, each with --threads torch threads (default 1: "
                       "runs train in this process); the store is written by this process only")
        p.add_argument("--no-pack", dest="pack", action="store_false",
                       help="train every run alone (default: retrieval runs of one shape train as one packed "
                       "model where that pays, on the local launcher with --jobs 1; FWBENCH_PACK=0 also turns it off)")

    p = sub.add_parser("run", help="run a grid (skipping runs already in the store)")
    p.add_argument("grid", help="bundled grid name or path to a .toml grid file")
    add_run_options(p)
    p.add_argument("--launcher", default="local", choices=LAUNCHERS,
                   help="local: runs in this process (default); ray: one Ray task per run")
    add_local_launcher_options(p)
    p.add_argument("--ray-address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray instance)")
    p.add_argument("--cpus-per-run", type=float, default=1.0, help="Ray CPUs reserved per run (default 1)")
    p.add_argument("--gpus-per-run", type=float, default=0.0, help="Ray GPUs reserved per run (default 0)")
    p.add_argument("--ray-num-cpus", type=int, help="CPUs of a local Ray instance started here (default: all)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("report", help="render REPORT.md and figures from the store")
    p.add_argument("--results-dir", default="results", help="results store directory (default results)")
    p.add_argument("--out", default="reports", help="output directory (default reports)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("reproduce", help="run every paper grid for a profile, then the report")
    add_run_options(p)
    add_local_launcher_options(p)
    p.add_argument("--out", default="reports", help="report directory (default reports)")
    p.set_defaults(func=_cmd_reproduce)

    p = sub.add_parser("capacity", help="run the capacity-vs-ν grid; write its figure and a CSV with 95%% CIs")
    add_run_options(p)
    p.add_argument("--grid", default=CAPACITY_GRID, help=f"grid to run (default {CAPACITY_GRID})")
    p.add_argument("--threshold", type=float, default=0.01,
                   help="best eval loss at or below which a memory retrieves (default 0.01)")
    p.add_argument("--out", default="reports", help="output directory (default reports)")
    p.set_defaults(func=_cmd_capacity)

    p = sub.add_parser("probe", help="training-free capacity probe (random keys, every φ and rule; seconds)")
    p.add_argument("--out", default="reports", help="output directory for probe.csv and probe.png (default reports)")
    p.add_argument("--d-key", type=int, default=64, help="key size (default 64)")
    p.add_argument("--trials", type=int, default=4, help="random memories per point (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random keys and values (default 0)")
    p.set_defaults(func=_cmd_probe)
    p = sub.add_parser("sample", help="generate text from a trained language-model checkpoint")
    p.add_argument("--checkpoint", required=True, help="a run checkpoint, e.g. results/checkpoints/RUN_ID.pt")
    p.add_argument("--prompt", default="It is", help='text to continue (default "It is")')
    p.add_argument("--tokens", type=int, default=500, help="characters to generate (default 500, at most 1000000)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely characters only")
    p.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    p.add_argument("--device", default="cpu", help="device to run on (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    p.set_defaults(func=_cmd_sample)

    add_bench_parser(sub)
    for command in VARIANT_MODULE_COMMANDS:
        sub.choices[command].add_argument(
            "--variant-module", action="append", default=[], metavar="PATH_OR_MODULE",
            help="a .py file or module name that registers your own variants (repeatable; see README)",
        )
    add_estimate_parser(sub)
    return parser


def refuse_outside_run(command: str) -> None:
    """Under torchrun only ``fwbench run`` makes sense: every other command would run once per process
    (two processes writing one report, two benchmarks fighting over the CPU).

    Raises:
        FwbenchError: ``command`` is not ``run`` and torchrun started this process.
    """
    from fwbench.run.distributed import context_from_environment

    if command != "run" and context_from_environment() is not None:
        raise FwbenchError(
            f"torchrun: got 'fwbench {command}'; only 'fwbench run GRID' trains data-parallel "
            "(torchrun --nproc_per_node=N -m fwbench run GRID); run other commands without torchrun"
        )


def _silence_stdout() -> None:
    """Point stdout at the null device: the reader of the pipe has gone (``| head``), and Python's
    final flush of the unwritten rest would otherwise report a second BrokenPipeError at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a descriptor
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fwbench`` console command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        tune_malloc()  # before the first large tensor: freed CPU memory is reused instead of re-faulted
        refuse_outside_run(args.command)
        import_variant_modules(getattr(args, "variant_module", None) or [], Path.cwd(), "--variant-module")
        status = args.func(args)
        sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit (where it would print)
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (FwbenchError, VariantError, CorpusError) as exc:
        print(f"fwbench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fwbench: interrupted; finished runs are kept, rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        from fwbench.run.distributed import stop

        stop()  # leave a torchrun process group, if this command joined one


if __name__ == "__main__":
    sys.exit(main())
