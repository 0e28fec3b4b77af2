"""Launchers decide where the runs of a grid execute; the results store stays the single writer.

- ``local``: one run after another in this process (the default); with ``jobs`` > 1, in that many
  worker processes (one torch thread each) whose records come back to this process, which alone
  appends them to the store, as with Ray.
- ``ray``: each unfinished run is a Ray task with its own CPU/GPU resources, on a cluster
  (``--ray-address`` or ``RAY_ADDRESS``) or on a Ray instance started for this command. Records come
  back to this process, which appends each one to the store as soon as its task finishes, so a
  driver killed midway keeps every finished run and a rerun executes only the missing ones.

A launcher yields records in completion order; a run that raises becomes a record with status
``failed`` and its error, and the other runs go on. Failed runs are retried by the next invocation.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import multiprocessing
import os
import signal
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import torch

from fwbench.errors import FwbenchError
from fwbench.run.allocator import tune_malloc
from fwbench.run.environment import apply_run_settings, portable_argv, resolve_device, run_settings
from fwbench.run.execute import execute
from fwbench.run.grid import RunSpec, stored_config
from fwbench.tasks.corpus import CorpusError

LAUNCHERS = ("local", "ray")
#: Ray counts resources in units of 1e-4 (a request in (0, 1e-4) is refused with a ValueError
#: traceback) and a node holds at most 1e14 of one ("Resource quantities must be at most 1e14", a
#: traceback for ``--ray-num-cpus 10**20``); a request of 1e300 CPUs or GPUs crashed Ray's core worker.
RAY_RESOURCE_UNIT, RAY_RESOURCE_MAX = 1e-4, 1e14


@dataclass(frozen=True)
class LaunchOptions:
    """Where and with what resources runs execute.

    Attributes:
        launcher: ``local`` or ``ray``.
        device: device string for each run (``cpu``, ``cuda``, ``auto``); resolved where it runs.
        threads: torch CPU threads per run.
        ray_address: Ray cluster address; ``None`` uses ``RAY_ADDRESS`` or starts a local instance.
        cpus_per_run, gpus_per_run: Ray resources reserved for each run.
        ray_num_cpus: CPUs of a local Ray instance started here (``None``: all of this machine's).
        checkpoint_dir: where runs whose config asks for checkpoints keep ``<run_id>.pt``
            (set by :func:`runner.run_grid` to ``<results_dir>/checkpoints``).
        jobs: worker processes of the local launcher (1: runs train in this process).
    """

    launcher: str = "local"
    device: str = "auto"
    threads: int = 1
    ray_address: str | None = None
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0
    ray_num_cpus: int | None = None
    checkpoint_dir: str | None = None
    jobs: int = 1

    def checkpoint_for(self, spec: RunSpec) -> Path | None:
        return None if self.checkpoint_dir is None else Path(self.checkpoint_dir) / f"{spec.run_id}.pt"


def failed_record(spec: RunSpec, error: BaseException | str) -> dict:
    """The record of a run that raised: kept for the report, retried on the next invocation.

    ``attempt``: a random id (32 lowercase hex digits) of this try, unique to it: a driver tells the failures stored
    since its start-up read (another driver's try of the run in this sweep) from those already there by this id,
    which every rewrite of the line (jq -c, sed, an editor) keeps as it is; see :func:`fwbench.run.store._failure_key`.
    """
    message = error if isinstance(error, str) else "".join(traceback.format_exception_only(error)).strip()
    try:
        run_id = spec.run_id
    except Exception:  # noqa: BLE001 -- a spec its task refuses (S=1, lr='x'), launched without run_grid's checks:
        # the run id validates it and raised again here, so the good runs launched with it lost their records
        run_id = _id_as_given(spec)
    return {
        "run_id": run_id, "grid": spec.grid, "task": spec.task,
        "variant": {"spec": spec.variant}, "seed": spec.seed, "config": stored_config(spec),
        "status": "failed", "error": message, "attempt": uuid.uuid4().hex,
        "metrics": {}, "curve": [], "steps": 0, "wall_s": 0.0,
    }


def _id_as_given(spec: RunSpec) -> str:
    """A key for the failed record of a spec that has no run id (16 hex digits): a hash of the spec as given, or,
    where even its repr fails (an int of over 4300 digits, a config that is no dict), of this one try."""
    try:
        text = repr((spec.task, spec.variant, spec.seed, sorted(dict(spec.config).items(), key=str)))
    except Exception:  # noqa: BLE001 -- the fallback of a fallback: the failed record must be made
        text = f"unreadable spec {uuid.uuid4().hex}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def execute_in_worker(spec: RunSpec, device: str, threads: int, checkpoint: Path | None = None,
                      settings: dict[str, str] | None = None) -> dict:
    """Run one spec where it lands (a Ray worker or this process) and return its record.

    ``settings``: the launching process's :func:`~fwbench.run.environment.run_settings` (data
    directory, corpus cache, allocator tuning), set here first, so that a worker of a cluster
    started elsewhere, with another environment, runs what the command line asked for (``None``: a
    local worker process, whose environment is the launching process's already). The allocator
    tuning is then applied as the ``fwbench`` command applies it at start-up: a worker process (``--jobs``,
    Ray) never runs that start-up, and its runs trained untuned with ``malloc_tuning: false`` recorded.
    """
    torch.set_num_threads(threads)
    try:
        if settings is not None:  # a local worker process (--jobs) inherits the launching process's environment
            apply_run_settings(settings)
        tune_malloc()  # once per process; off with FWBENCH_MALLOC_TUNING=0, as in the launching process
        return execute(spec, resolve_device(device), checkpoint=checkpoint)
    except CorpusError as exc:
        if settings is None:  # a local worker (--jobs): the grid stops, as the local launcher's does (below)
            raise
        return failed_record(spec, exc)  # a Ray worker's machine may lack what the driver's has
    except Exception as exc:  # a broken run must not take the grid down with it
        return failed_record(spec, exc)


def launch_local(specs: list[RunSpec], options: LaunchOptions,
                 on_progress: Callable[[RunSpec], Callable[[int, float], None] | None]) -> Iterator[dict]:
    """Run specs one after another in this process."""
    device = resolve_device(options.device)
    torch.set_num_threads(options.threads)
    for spec in specs:
        try:
            yield execute(spec, device, on_progress(spec), options.checkpoint_for(spec))
        except (FwbenchError, CorpusError):
            raise  # the user's setup is wrong (a path, a missing corpus): every run would fail alike
        except Exception as exc:
            yield failed_record(spec, exc)


#: prctl option that sends a signal to this process when its parent dies (Linux, <sys/prctl.h>).
_PR_SET_PDEATHSIG = 1


def _worker_start(threads: int, parent: int) -> None:
    """Initialiser of a local worker process: its torch threads, and, on Linux, death with the
    parent (``parent``: its pid). A worker left running after ``kill -9`` of the parent would train on
    for nothing (its record can only reach the store through the parent) and take a core from the
    rerun. The parent may already be gone when this runs (a worker's imports take seconds), and the
    death signal covers only a parent that dies later: so the worker also checks it is still there."""
    torch.set_num_threads(threads)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def launch_local_jobs(specs: list[RunSpec], options: LaunchOptions,
                      on_progress: Callable[[RunSpec], object] | None = None) -> Iterator[dict]:
    """Run specs in ``options.jobs`` worker processes and yield records in completion order.

    Workers are started fresh (``spawn``: no copy of this process's open files or locks, so the
    store's claims stay this process's), each with ``options.threads`` torch threads. A run that
    raises is a ``failed`` record; so is every unfinished run if a worker dies (out of memory,
    killed), and those are retried by the next invocation. Per-step progress is not shown.

    Raises:
        FwbenchError: ``jobs`` < 1.
    """
    if isinstance(options.jobs, bool) or not isinstance(options.jobs, int) or options.jobs < 1:
        raise FwbenchError(f"--jobs: got {options.jobs!r}; expected a positive integer")
    device = options.device
    context = multiprocessing.get_context("spawn")
    # no more workers than runs: the pool's queue is sized by its workers, and --jobs 2**31 raised an
    # OverflowError traceback there ("Python int too large to convert to C int")
    workers = min(options.jobs, max(len(specs), 1))
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start,
                             initargs=(options.threads, os.getpid())) as pool:
        pending = {pool.submit(execute_in_worker, spec, device, options.threads, options.checkpoint_for(spec)): spec
                   for spec in specs}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                stop = None
                for future in done:
                    spec = pending.pop(future)
                    try:
                        record = future.result()
                    except CorpusError as exc:
                        # no usable corpus here: every LM run would fail alike; --jobs 2 recorded each run failed and
                        # exited 0, where the local launcher stops (break-it pass AW). A spec its task refuses is
                        # still a failed record, and the others finish. The runs finished beside it are yielded
                        # first: a record finished in the same wait was lost (break-it pass AX)
                        stop = stop or exc
                        continue
                    except Exception as exc:  # the worker process died (BrokenProcessPool)
                        record = failed_record(spec, exc)
                    yield record
                if stop is not None:
                    raise stop
        finally:
            for future in pending:
                future.cancel()
            if pending:  # closed before the last record (the driver's store refused one): stop the runs in training
                _stop_workers(pool)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End ``pool``'s worker processes now. Its ``shutdown`` waits for every run a worker has begun, and for those
    queued to a worker (which ``cancel`` cannot take back): after the store refused a record, the driver trained
    on for nothing, silently (4-5 more runs with ``--jobs 2``), before its one line."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown lets go of them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise FwbenchError(
            "--launcher: 'ray' needs Ray, which is not installed; install it with "
            "pip install 'fwbench[ray]' (or pip install 'ray>=2.9')"
        ) from None
    return ray


def _as_given(value: float) -> str:
    """``value`` (a float or an int) in the ``:g`` style with as few digits as still read back as the same number:
    ``:g`` keeps six, so a refused 2.0000000001 GPUs read "got 2", a value the same message accepts, and an
    instance of 1234567 CPUs "at most 1.23457e+06", more than it holds; ``repr`` where it is shorter, as for
    5e-324 (``:g``: 4.94066e-324, the same number). Returns 2, 1.5, 100000, 2.0000000001, 1234568, 5e-324, 1e+16."""
    for digits in range(6, 18):  # from :g's six (100000, not 1e+05); 17 significant digits write any double exactly
        short = f"{value:.{digits}g}"
        if float(short) == value:
            return min(short, repr(value), key=len)
    return repr(value)  # nan, or an int beyond a double's 17 digits


def check_ray_resources(options: LaunchOptions) -> None:
    """Refuse Ray resources that Ray itself answers with a traceback, a crash or a hang: CPUs per run
    that are not a finite number > 0, GPUs per run not a finite number >= 0, a non-zero request
    outside [:data:`RAY_RESOURCE_UNIT`, :data:`RAY_RESOURCE_MAX`], and a local instance of fewer
    than one CPU (``--ray-num-cpus 0`` starts a Ray that can schedule nothing) or more than Ray's maximum;
    and an empty or blank ``--ray-address`` (``--ray-address "$HEAD"`` with HEAD unset), which read as
    no address and silently ran every run on a Ray instance started on this machine instead of the
    cluster; an empty or blank ``$RAY_ADDRESS`` without the option (``export RAY_ADDRESS=$HEAD``)
    likewise (a blank one reached Ray, which raised a ValueError traceback); an address whose port is
    outside 1 to 65535 (``localhost:99999``: Ray retried it for minutes); an address of a scheme other than
    ``ray://`` (``rayy://HOST:10001``, ``http://HOST:8265``, the dashboard's), which Ray answered with a traceback
    from its client builder; GPUs per run above 1 that are not whole (``--gpus-per-run 1.5``: Ray shares a GPU
    between runs or gives whole ones, not one and a half); and a ``cuda:N`` device that
    no run's worker has: Ray sets each GPU task's ``CUDA_VISIBLE_DEVICES`` to the ⌈``gpus_per_run``⌉
    GPUs it reserved, which the worker numbers from ``cuda:0``, so ``--device cuda:1 --gpus-per-run 1``
    on a 2-GPU machine (GPU 1 with the local launcher) failed every run ("expected cuda:N with N < 1").
    Without GPUs per run Ray sets nothing: ``cuda:N`` is then GPU N of the worker's node, as asked.
    Also GPUs per run for runs on the CPU (``--device cpu --gpus-per-run 1``: each run held a GPU it never
    used, and runs waited for GPUs no one used), and a ``$`` in the driver's ``PYTHONPATH``, which the
    workers are given (:func:`ray_worker_env`): Ray expands ``$NAME`` and ``${NAME}`` in a runtime
    environment's variables, with no escape, so a worker would import from another directory; likewise
    an entry that holds none but is relative (``.``, or empty) to a working directory that holds one; and an
    entry whose name is not UTF-8 (Ray's workers cannot be given it: each one crashed), nor a working directory
    whose name is not (:func:`ray_driver_directories`, which Ray sends itself), save to a Ray client's ``ray://``;
    ``--ray-num-cpus`` with the address of a cluster (:func:`starts_local_ray`), to which Ray gives no CPU count.

    Raises:
        FwbenchError: naming the option, the value and what is allowed.
    """
    if options.ray_address is not None and not options.ray_address.strip():  # '' or blanks: "$HEAD " with HEAD unset
        raise FwbenchError(f"--ray-address: got {options.ray_address!r}; expected a Ray cluster address such as auto or "
                           "HOST:6379 (leave the option out to use $RAY_ADDRESS or start a local instance)")
    environment_address = os.environ.get("RAY_ADDRESS")
    if options.ray_address is None and environment_address is not None and not environment_address.strip():
        raise FwbenchError(f"$RAY_ADDRESS: got {environment_address!r}; expected a Ray cluster address such as auto or "
                           "HOST:6379 (unset it, or leave it out, to start a local instance; --ray-address overrides it)")
    address, source = (options.ray_address, "--ray-address") if options.ray_address is not None else (
        environment_address, "$RAY_ADDRESS")
    scheme = (address or "").partition("://")[0] if "://" in (address or "") else None  # Ray's test is case-sensitive
    if scheme is not None and scheme != "ray":
        # Ray reads any other scheme as the name of a client module to import ('rayy://': a RuntimeError traceback,
        # "Module: rayy does not exist") or, for http(s), refuses it with a message cut at its first line
        dashboard = " (http:// is the dashboard's or job server's address, not the cluster's)" if scheme.lower() in (
            "http", "https") else ""
        raise FwbenchError(f"{source}: got {address!r}; expected auto, HOST:PORT (a cluster's GCS, as HOST:6379) or "
                           f"ray://HOST:PORT (its Ray client server, as ray://HOST:10001), not {scheme}://{dashboard}")
    port = (address or "").rpartition(":")[2]
    # a port no TCP connection can use (localhost:99999) passed Ray's format check and was retried for minutes
    if ":" in (address or "") and port.isascii() and port.isdigit() and not 1 <= int(port) <= 65535:
        raise FwbenchError(f"{source}: got {address!r}; expected a Ray cluster address such as auto or HOST:6379 "
                           f"(port {port} is outside 1 to 65535)")
    if not (math.isfinite(options.cpus_per_run) and options.cpus_per_run > 0) or not (
            math.isfinite(options.gpus_per_run) and options.gpus_per_run >= 0):
        raise FwbenchError(
            f"--cpus-per-run/--gpus-per-run: got {options.cpus_per_run}/{options.gpus_per_run}; "
            "expected cpus > 0 and gpus >= 0 (finite numbers)"
        )
    for name, value in (("--cpus-per-run", options.cpus_per_run), ("--gpus-per-run", options.gpus_per_run)):
        if value and not RAY_RESOURCE_UNIT <= value <= RAY_RESOURCE_MAX:
            raise FwbenchError(f"{name}: got {_as_given(value)}; expected "
                               f"{'0 or ' if name == '--gpus-per-run' else ''}a number in [{RAY_RESOURCE_UNIT:g}, "
                               f"{RAY_RESOURCE_MAX:g}] (Ray counts resources in units of "
                               f"{RAY_RESOURCE_UNIT:g})")
    if options.gpus_per_run > 1 and not float(options.gpus_per_run).is_integer():
        # a GPU is one of Ray's unit resources: a task may share one GPU or hold whole ones, never 1.5
        raise FwbenchError(f"--gpus-per-run: got {_as_given(options.gpus_per_run)}; expected a fraction of one GPU "
                           "(at most 1) or a whole number of GPUs (Ray gives a run more than one GPU only in whole GPUs)")
    index = options.device.partition(":")[2] if options.device.startswith("cuda:") else ""
    visible = math.ceil(options.gpus_per_run)
    if options.gpus_per_run > 0 and index.isascii() and index.isdigit() and int(index) >= visible:
        raise FwbenchError(f"--device: got {options.device!r} with --launcher ray --gpus-per-run "
                           f"{_as_given(options.gpus_per_run)}; "
                           f"expected cuda{' or cuda:0' if visible == 1 else f' or cuda:N with N < {visible}'} (Ray "
                           f"gives each run {visible} GPU{'s' if visible > 1 else ''} of its own, numbered from cuda:0 "
                           "in its worker, whatever their number on the machine)")
    if options.gpus_per_run > 0 and options.device.partition(":")[0] == "cpu":
        raise FwbenchError(f"--gpus-per-run: got {_as_given(options.gpus_per_run)} with --device {options.device}; "
                           "expected 0 "
                           "(a run on the CPU uses no GPU; --device cuda or auto runs on the GPUs it reserves)")
    # the workers get each entry made absolute against this working directory (ray_worker_env), so what is
    # checked is what they get: '.', a relative entry or an empty one run from /home/me/$lib reached them as
    # /home/me/$lib, which Ray expanded; from /home/me/a:b as two entries, /home/me/a and b; bytes that are not
    # UTF-8 (lone surrogates, '\udcff', in os.environ and os.getcwd()) made every worker abort, since Ray sends a
    # runtime environment as JSON, which its C++ side refuses (nlohmann parse_error, WorkerCrashedError)
    python_path = os.environ.get("PYTHONPATH", "")
    cwd = os.getcwd()
    entry_faults, cwd_faults, whose = [], [], ""
    for entry, absolute in worker_python_path(os.environ, cwd):
        # each fault is told by where it comes from, the entry's own text or the working directory, for the
        # advice: renaming the entry's directory cannot help a '$' the working directory brings in, nor running
        # elsewhere one the entry holds itself ('lib$x' from /home/me/a$b holds both: both fixes are named)
        own, base = _entry_sources(entry, cwd)
        entry_faults += [fault for fault in _path_faults(own) if fault not in entry_faults]
        from_cwd = _path_faults(base)
        cwd_faults += [fault for fault in from_cwd if fault not in cwd_faults]
        if from_cwd and not whose:
            whose = f", whose entry {entry!r} is {absolute!r} from this working directory"
    if entry_faults or cwd_faults:
        faults = [fault for fault in PATH_FAULTS if fault in entry_faults or fault in cwd_faults]
        characters = [fault for fault in faults if fault != NOT_UTF8]
        splits = " and ".join("Ray expands $NAME in its workers' environment" if c == "$" else
                              f"a {c!r} in an entry splits it in two" for c in characters)
        why = "; ".join(([f"{splits}, so they would import from elsewhere"] if characters else []) + (
            ["Ray cannot give its workers other bytes: each worker would crash"] if NOT_UTF8 in faults else []))
        fixes = []
        if entry_faults:
            fixes.append("rename the entry's directory" if cwd_faults else "rename the directory")
        # a link to the working directory is no way round a fault it brings in: os.getcwd(), which the workers'
        # entries are joined to, names it without its links (cd through one, and the same '$' was refused again)
        around = " or " + LINKED_ENTRY if cwd_faults else " or reach it through a link"
        if NOT_UTF8 in cwd_faults and "://" not in (address or ""):
            # nor is an absolute entry through a link, here: Ray sends the working directory itself to its workers
            # (ray_driver_directories), and the entry so given was refused next, as C188's working directory
            fixes.append(f"run from a directory {_without(cwd_faults, plural=False)}")
            around = (": neither a link to it nor an absolute entry through one helps (the working directory is read "
                      "with its links resolved, and Ray sends it to its workers too)")
        elif cwd_faults:
            fixes.append(f"run from a directory {_without(cwd_faults, plural=False)},")
        # an absolute entry run from a working directory not UTF-8: the entry's own fixes, followed, met the working
        # directory's refusal next (Ray sends it to its workers, C188); that is named here too
        also = ("; and run from a directory whose name is UTF-8: Ray sends the working directory to its workers "
                "too, and cannot send other bytes") if (not cwd_faults and not _is_utf8(cwd)
                                                        and "://" not in (address or "")) else ""
        raise FwbenchError(f"$PYTHONPATH: got {python_path!r} with --launcher ray{whose}; expected directories "
                           f"{_without(faults, plural=True)} ({why}; {' and '.join(fixes)}{around}{also})")
    for what, directory in ray_driver_directories() if "://" not in (address or "") else []:
        # Ray itself sends these to every worker in the job's configuration, a protobuf whose strings must be UTF-8:
        # ray.init raised UnicodeEncodeError once its instance had started, which read as a bad --ray-address
        # (a Ray client's address, ray://HOST:PORT, sends none: its driver runs on the cluster)
        if not _is_utf8(directory):
            raise FwbenchError(f"{what}: got {directory!r} with --launcher ray; expected a directory whose name is UTF-8 "
                               "(Ray sends it to its workers and cannot send other bytes; run from, or install in, a "
                               f"directory whose name is UTF-8: {LINK_NO_HELP})")
    if options.ray_num_cpus is not None and not 1 <= options.ray_num_cpus <= RAY_RESOURCE_MAX:
        raise FwbenchError(f"--ray-num-cpus: got {options.ray_num_cpus}; expected a positive integer up to "
                           f"{RAY_RESOURCE_MAX:g} (the CPUs of the local Ray instance; leave it out to use all of them)")
    if options.ray_num_cpus is not None and not starts_local_ray(address):
        # Ray is given no CPU count for a cluster it joins: the option was silently ignored
        raise FwbenchError(f"--ray-num-cpus: got {options.ray_num_cpus} with {source} {address!r}, where it has no "
                           "effect; expected it only for a Ray instance started here (no --ray-address or "
                           "$RAY_ADDRESS, or the address local), or leave it out (a cluster's CPUs are its own)")
    if options.ray_num_cpus is not None:
        check_fits_local_ray(options, {"CPU": options.ray_num_cpus})  # before Ray starts: its CPUs are known


def starts_local_ray(address: str | None) -> bool:
    """Whether ``ray.init(address=...)`` with the command's address (``--ray-address``, else ``$RAY_ADDRESS``;
    ``None`` for neither) starts a new Ray instance for this command: no address, or Ray's ``"local"`` ("start a
    new local Ray instance, even if there is already an existing local Ray instance"). Such an instance is given
    ``--ray-num-cpus`` and cannot grow, so a run larger than it is refused (:func:`check_fits_local_ray`);
    ``--ray-address local`` was taken for a cluster's address: the option was silently ignored and
    ``--cpus-per-run`` above the machine's CPUs waited for ever, printing nothing."""
    return not address or address == "local"


def check_fits_local_ray(options: LaunchOptions, resources: dict[str, float]) -> None:
    """Refuse a run that asks for more CPUs or GPUs than a local Ray instance holds (``resources``:
    its totals of ``"CPU"`` and/or ``"GPU"``; a resource not given is not checked). Ray keeps
    such a task pending for ever, and with the driver's logs off nothing is printed: ``--ray-num-cpus 1
    --cpus-per-run 2`` hung silently. Only for an instance started here: a cluster given by address
    may grow (an autoscaler adds nodes on demand).

    Raises:
        FwbenchError: naming the option, the request and what the instance holds.
    """
    for name, key, value in (("--cpus-per-run", "CPU", options.cpus_per_run),
                             ("--gpus-per-run", "GPU", options.gpus_per_run)):
        held = resources.get(key, math.inf)
        if value > held:
            raise FwbenchError(f"{name}: got {_as_given(value)}; expected at most {_as_given(held)}, the {key}s of the local Ray "
                               "instance "
                               "(no run could ever be scheduled; lower it, or start the instance with more)")


def ray_worker_env(threads: int, environ: dict[str, str] | None = None, cwd: str | None = None) -> dict[str, str]:
    """The environment variables of the Ray workers that run this command's tasks (their runtime
    environment's ``env_vars``): ``OMP_NUM_THREADS`` = ``threads`` (idle OpenMP threads fight over
    cores), and this process's ``PYTHONPATH`` (``environ``, default ``os.environ``), each entry made
    absolute against this working directory (``cwd``; an empty entry is the working directory, as for
    Python), ahead of the cluster's own (``${PYTHONPATH}``). A worker of a cluster started elsewhere
    has neither: a grid's ``variant_modules = ["my_pkg.attention"]`` found on the driver's
    ``PYTHONPATH`` failed every run there ("No module named 'my_pkg'").
    """
    variables = {"OMP_NUM_THREADS": str(threads)}
    entries = worker_python_path(os.environ if environ is None else environ, cwd)
    if entries:
        variables["PYTHONPATH"] = os.pathsep.join([*(absolute for _, absolute in entries), "${PYTHONPATH}"])
    return variables


#: Why a link to a working directory (or to the running script's) with a refused name does not help: Ray, and the
#: check, read it as os.getcwd() (os.path.realpath) gives it, with every link resolved.
LINK_NO_HELP = "a link to it does not help, it is read with its links resolved"
#: The way round a fault a working directory brings into a relative ``PYTHONPATH`` entry, besides running elsewhere.
LINKED_ENTRY = ("give the entry as an absolute path through a link (running from a link does not help: the working "
                "directory is read with its links resolved)")

#: What a PYTHONPATH entry given to Ray's workers must not hold (:func:`check_ray_resources`), in the order
#: its refusal names them: a '$' (Ray expands it), the path separator (it splits the entry), bytes that are not UTF-8.
NOT_UTF8 = "not UTF-8"
PATH_FAULTS = ("$", os.pathsep, NOT_UTF8)


def _path_faults(text: str) -> list[str]:
    """The :data:`PATH_FAULTS` that ``text`` holds, in that order."""
    return [fault for fault in PATH_FAULTS if (not _is_utf8(text) if fault == NOT_UTF8 else fault in text)]


def _without(faults: list[str], plural: bool) -> str:
    """What a directory name must be to hold none of ``faults`` (:data:`PATH_FAULTS`): "without '$' or ':'",
    "whose names are UTF-8", "without '$' and whose name is UTF-8"."""
    characters = [fault for fault in faults if fault != NOT_UTF8]
    parts = ([f"without {' or '.join(map(repr, characters))}"] if characters else []) + (
        [f"whose name{'s are' if plural else ' is'} UTF-8"] if NOT_UTF8 in faults else [])
    return " and ".join(parts)


def _entry_sources(entry: str, cwd: str) -> tuple[str, str]:
    """(what a ``PYTHONPATH`` entry's own text gives its absolute form, what the working directory ``cwd`` gives
    it), as :func:`worker_python_path` joins them: "/abs/lib" → ("/abs/lib", ""); "lib$x" → ("lib$x", cwd);
    "../lib" → ("lib", cwd's parent), whose last name, left out, brings in nothing; "." or "" → ("", cwd)."""
    if os.path.isabs(entry):
        return os.path.normpath(entry), ""
    parts = os.path.normpath(entry).split(os.sep) if entry else []
    ups = next((i for i, part in enumerate(parts) if part != os.pardir), len(parts))
    own = [part for part in parts[ups:] if part != os.curdir]
    return os.sep.join(own), os.path.normpath(os.path.join(cwd, *[os.pardir] * ups))


def _is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: a name of bytes that are not (os.environ, os.getcwd()) holds lone
    surrogates ('\\udcff')."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def ray_driver_directories() -> list[tuple[str, str]]:
    """(what, directory) for each directory Ray 2.60's ``ray.init`` adds to its workers' ``sys.path`` (the job
    configuration's ``py_driver_sys_path``): the working directory, and the running script's directory where it
    is on ``sys.path`` (the ``fwbench`` script's: its environment's ``bin``)."""
    directories = [("the working directory", os.path.abspath(os.curdir))]
    script = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    if script and script in sys.path:
        directories.append(("the directory of the running script", script))
    return directories


@contextlib.contextmanager
def _ray_address_hidden(hide: bool) -> Iterator[None]:
    """Unset ``$RAY_ADDRESS`` for the ``with`` block where ``hide`` (``--ray-address`` given), restoring it after.
    Ray 2.60's ``ray.init`` (and ``canonicalize_bootstrap_address``) replace the address ``"auto"`` by a non-empty
    ``$RAY_ADDRESS``, so ``--ray-address auto`` with ``RAY_ADDRESS=local`` started a new instance that no run was
    compared with (``--cpus-per-run`` above its CPUs waited for ever), with ``RAY_ADDRESS=HOST:6379`` ran on that
    cluster instead of the running one asked for, and with a blank one raised a ValueError that blamed ``auto``;
    ``--ray-address`` overrides ``$RAY_ADDRESS``, as the option's help and :func:`check_ray_resources` say."""
    saved = os.environ.pop("RAY_ADDRESS", None) if hide else None
    try:
        yield
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


def worker_python_path(environ: Mapping[str, str], cwd: str | None = None) -> list[tuple[str, str]]:
    """(entry as written, entry as the Ray workers are given it) for each entry of ``environ``'s
    ``PYTHONPATH``: made absolute against ``cwd`` (default this working directory; an empty entry is the
    working directory, as for Python). Empty where ``PYTHONPATH`` is unset or empty. The one source of
    :func:`ray_worker_env` and of the check of what it sends (:func:`check_ray_resources`)."""
    if not environ.get("PYTHONPATH"):
        return []
    cwd = os.getcwd() if cwd is None else cwd
    # lexically, '..' after a symbolic link included: Python's start-up makes each PYTHONPATH entry absolute so
    # (link/../pkg is CWD/pkg on the driver's sys.path, not the kernel's parent of the link's target)
    return [(entry, os.path.normpath(os.path.join(cwd, entry)) if entry else cwd)
            for entry in environ["PYTHONPATH"].split(os.pathsep)]


def launch_ray(specs: list[RunSpec], options: LaunchOptions,
               on_progress: Callable[[RunSpec], object] | None = None) -> Iterator[dict]:
    """Submit every spec as a Ray task and yield records as tasks finish."""
    check_ray_resources(options)  # before Ray starts: it would raise deep inside its scheduler (NaN, inf, 0 CPUs)
    # a task argument (the environment of a separately started cluster lacks them); read before Ray starts,
    # which a directory it refuses (~user naming no user) would otherwise follow
    settings = run_settings()
    runtime_env = {"env_vars": ray_worker_env(options.threads)}
    ray = _import_ray()
    address = options.ray_address or os.environ.get("RAY_ADDRESS")
    started_here = not ray.is_initialized()
    if started_here:
        # no address: a new instance for this command ("local"), as the README says; a bare ray.init()
        # joined any instance `ray start` had left on this machine, refusing --ray-num-cpus there
        # ("num_cpus ... must not be provided") and otherwise running on that cluster, silently
        local = starts_local_ray(address)
        init_args = {"address": "local", "num_cpus": options.ray_num_cpus} if local else {"address": address}
        try:
            with _ray_address_hidden(options.ray_address is not None):
                ray.init(**init_args, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
        # a malformed or unreachable address: Ray's own traceback (a RuntimeError where its client cannot connect,
        # or a cluster's GCS is not there: "Failed to connect to GCS", TimeoutError: a ConnectionError)
        except (ValueError, ConnectionError, RuntimeError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__  # one line: Ray's may run over several
            reason = reason if len(reason) <= 300 else reason[:299] + "…"
            if local:  # no cluster's address to blame: it said "$RAY_ADDRESS: got None" (or blamed 'local')
                raise FwbenchError(f"--launcher ray: could not start a local Ray instance (Ray: {reason})") from None
            source = "--ray-address" if options.ray_address else "$RAY_ADDRESS"
            raise FwbenchError(f"{source}: got {address!r}; expected a Ray cluster address such as auto or HOST:6379 "
                               f"of a running cluster (Ray: {reason})") from None
        if local:  # a local instance cannot grow: a run larger than it would wait for ever, silently
            try:
                totals = ray.cluster_resources()  # no "GPU" entry on a machine without GPUs
                check_fits_local_ray(options, {key: totals.get(key, 0.0) for key in ("CPU", "GPU")})
            except FwbenchError:
                ray.shutdown()
                raise
    device = options.device
    if device == "auto":
        device = "cuda" if options.gpus_per_run > 0 else "cpu"
    # the runtime environment also on each task: a Ray this process did not start has none of ours
    remote = ray.remote(num_cpus=options.cpus_per_run, num_gpus=options.gpus_per_run, max_retries=0,
                        runtime_env=runtime_env)(execute_in_worker)
    pending = {remote.remote(spec, device, options.threads, options.checkpoint_for(spec), settings): spec
               for spec in specs}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(done[0])
            try:
                yield with_driver_argv(ray.get(done[0]))
            except Exception as exc:  # the worker process died (OOM, node lost)
                yield failed_record(spec, exc)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def with_driver_argv(record: dict, argv: list[str] | None = None) -> dict:
    """``record`` with its ``environment.argv`` set to the command line of this (the driver's) process,
    ``argv`` or ``sys.argv[1:]``, made portable. A Ray worker's own argv is Ray's
    (``--node-ip-address=…``, ``--raylet-name=/tmp/ray/session_…``): recorded as it was, the record
    of a Ray run said nothing of the command that asked for it. (Local worker processes are started
    with spawn, which gives them the parent's ``sys.argv``.) A record without an environment (a
    failed run) is returned as it is."""
    if "environment" in record:
        record["environment"]["argv"] = portable_argv(sys.argv[1:] if argv is None else argv)
    return record


def launch(specs: list[RunSpec], options: LaunchOptions, on_progress) -> Iterator[dict]:
    """Dispatch to the launcher named in ``options``.

    Raises:
        FwbenchError: unknown launcher, or Ray asked for where it is not installed.
    """
    if options.launcher == "local":
        if options.jobs != 1:
            return launch_local_jobs(specs, options, on_progress)
        return launch_local(specs, options, on_progress)
    if options.launcher == "ray":
        return launch_ray(specs, options, on_progress)
    raise FwbenchError(f"--launcher: got {options.launcher!r}; expected one of {', '.join(LAUNCHERS)}")
