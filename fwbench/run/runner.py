"""Run the cells of a grid that the store does not hold yet, one record per finished run.

A run interrupted before its record is written is simply run again next time; a finished run is
never repeated, so an interrupted grid resumes without losing anything.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from fwbench.errors import FwbenchError
from fwbench.run.distributed import DistributedContext
from fwbench.run.environment import resolve_device
from fwbench.run.execute import execute
from fwbench.run.grid import RunSpec, shown_labels
from fwbench.run.launchers import LaunchOptions, launch
from fwbench.run.pack_plan import pack_policy, plan_packs
from fwbench.run.packing import execute_packed
from fwbench.run.store import (
    LoadedRecords,
    ResultsStore,
    describe_long_name,
    describe_loop,
    is_attempt_key,
    looping_link,
    shorten,
    special_file,
)

#: Seconds between rank 0's tries of a run another process holds, under torchrun.
HELD_POLL_S = 1.0
#: Subdirectory of the results directory that holds run checkpoints (git-ignored).
CHECKPOINT_DIR = "checkpoints"


def checkpoint_path(store: ResultsStore, spec: RunSpec) -> Path:
    """Where a run's checkpoint lives: ``<results_dir>/checkpoints/<run_id>.pt``."""
    return store.directory / CHECKPOINT_DIR / f"{spec.run_id}.pt"


#: Seconds between the bar's redraws when stderr is a file or a pipe, not a terminal.
LOGGED_REFRESH_S = 30.0


def _progress_bar(total: int, quiet: bool):
    """A tqdm bar over runs, the per-step callback that shows a run's step and loss on it, and ``begin(label)``,
    which names the run now training and clears the step and loss of the run before it: a run that diverged at
    step 1 was shown with the previous run's ``loss=2.1739, step=250`` (new-user run of b1a4373).

    On a terminal the step and loss are redrawn every 50 steps; into a log (stderr redirected) at most once
    every :data:`LOGGED_REFRESH_S` seconds, since each redraw is appended there: a quick-profile log was
    179 kB of carriage-returned redraws (new-user run of 7 December)."""
    terminal = sys.stderr.isatty()
    interval = 0.1 if terminal else LOGGED_REFRESH_S
    bar = tqdm(total=total, desc="runs", unit="run", disable=quiet, file=sys.stderr, dynamic_ncols=True,
               mininterval=interval)
    last_redraw = [time.monotonic()]

    def progress(step: int, loss: float) -> None:
        if step % 50 == 0:
            due = terminal or time.monotonic() - last_redraw[0] >= interval
            bar.set_postfix(step=step, loss=f"{loss:.4f}", refresh=due)
            if due:
                last_redraw[0] = time.monotonic()

    def begin(label: str) -> None:
        bar.set_description(label, refresh=False)
        bar.set_postfix()

    return bar, progress, begin


def check_checkpoint_dir(store: ResultsStore, specs: list[RunSpec]) -> None:
    """Make ``<results_dir>/checkpoints`` where any of ``specs`` keeps checkpoints (``checkpoint_every`` > 0, the
    language model's default), or refuse it now, before any training: a file there, or a link that loops, failed
    every such run at its first checkpoint, after training that far ('FileExistsError: [Errno 17] File exists').

    Raises:
        FwbenchError: naming ``--results-dir``, the entry and why it cannot be made a directory.
    """
    if not any(getattr(spec.task_config(), "checkpoint_every", 0) for spec in specs):
        return
    entry = store.directory / CHECKPOINT_DIR
    full = os.path.realpath(entry)
    longest = os.pathconf("/", "PC_PATH_MAX") - len(f"/{'0' * 16}.pt") - 1
    if len(os.fsencode(full)) > longest:
        # a checkpoint is named by its full path (a Ray worker runs elsewhere): under a deep working directory, a
        # relative --results-dir there is short but that path is not, and every run failed at its first checkpoint,
        # after training that far, "OSError: [Errno 36] File name too long" (or, where checkpoints was missing, the
        # grid was refused as "got 'R/checkpoints', File name too long; … (move it away)", nothing being there)
        raise FwbenchError(f"--results-dir: got {str(entry)!r}, whose full path, {shorten(full, 60)!r}, is of "
                           f"{len(os.fsencode(full))} bytes; expected at most {longest} bytes where runs keep "
                           "checkpoints, named by their full path (choose a results directory nearer the root)")
    try:
        Path(os.path.realpath(entry)).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        told = describe_long_name("--results-dir", entry, entry, exc.strerror) if exc.errno == errno.ENAMETOOLONG else None
        if told is not None:
            # a link to a name too long (ln -s aaa…a R/checkpoints) ended in a traceback, "OSError: [Errno 36] File
            # name too long", from Path.is_file below
            raise FwbenchError(told.replace("expected names", "expected a directory for the runs' checkpoints, with "
                                            "names", 1)) from None
        # what the entry is, not mkdir's errno: a named pipe was "got 'R/checkpoints', File exists", and a link to a
        # file or a device "a link to 'notes.txt': File exists", neither saying what is in the way
        kind = special_file(entry) or ("a file" if entry.is_file() else None)
        if looping_link(entry) is not None:
            why = describe_loop(looping_link(entry))
        elif entry.is_symlink():
            why = f"a link to {str(entry.readlink())!r}" + (f", {kind}" if kind else f": {exc.strerror}")
        else:
            why = kind or exc.strerror
        remedy = "remove the link or point it at a directory" if entry.is_symlink() else "move it away"
        raise FwbenchError(f"--results-dir: got {str(entry)!r}, {why}; expected a directory for the runs' checkpoints, "
                           f"or no such path ({remedy})") from None


def settled_elsewhere(store: ResultsStore, read: LoadedRecords) -> set[str]:
    """Run ids that this driver must not train: those with a finished record, and those given a record, a
    ``failed`` one included, since ``read`` (the load the to-do list came from).

    The second set is another process's try of a run in this same sweep (its holder's, or a process that
    stored it and let go before this one claimed it): trained again here, a run that failed there ran twice in
    one sweep and its failure went unreported; a failed record already stored when the driver started is
    retried, as ever. A failed record counts as given since ``read`` where its try's ``attempt`` id was not in
    ``read`` (a record without one, written before 2026-12-07 or by hand: where the file now holds more failed
    records of its run with its error message than ``read`` did), whatever file the records file is now: the same
    one grown, the same lines rewritten in place or by rename (sed -i, jq -c, an editor; 0cbd59d took every line of
    a file with another inode as new, and a run failed in an earlier sweep was never retried), or another store's
    file a re-pointed link leads to (ln -sfn ../C/runs.jsonl B/runs.jsonl: a run failed in C, by its driver or in an
    earlier sweep, is left to C's driver; a copy of the store read keeps its ids, and its failures are retried).
    """
    loaded = store.load()
    # counted over every line, not over load's records (one per run id, the last): a run that had a failed
    # record before the read and was tried again elsewhere since, and failed again, read as one record as before
    fresh = {run_id for (run_id, key), count in loaded.lines.items()
             if count > read.lines[run_id, key] and _new_try(run_id, key, loaded, read)}
    return loaded.finished_ids() | fresh


def _new_try(run_id: str, key: bytes, loaded: LoadedRecords, read: LoadedRecords) -> bool:
    """Whether a :func:`~fwbench.run.store._failure_key` that ``loaded`` holds more often than ``read`` is another
    try: an ``attempt`` id is; a message without an id only where the run's failed records with that message (ids
    or not) grew too. A rewrite that dropped a record's id (jq 'del(.attempt)') changed its key from the id to the
    message, and the failure stored before the read counted as another driver's try: its run was not retried."""
    return is_attempt_key(key) or loaded.messages[run_id, key] > read.messages[run_id, key]


def released_by_holders(store: ResultsStore, held: list[RunSpec]) -> Iterator[list[RunSpec]]:
    """Wait for the runs in ``held`` (claimed by another process when this one tried) and yield them in
    batches as their holders let go, this process holding each batch's claims until the caller asks for
    the next batch. A batch may hold runs that were stored meanwhile: the caller skips those and runs the
    rest, whose holder died or let go without a record (else no one would ever run them).

    Blocks on one claim at a time while holding none, so two processes waiting on each other's runs
    cannot deadlock; any other held run already free joins that batch (one launch, not one per run).
    Call it with no claim of this process held.
    """
    waiting = list(held)
    while waiting:
        with ExitStack() as claims:
            claims.enter_context(store.claim(waiting[0].run_id, wait=True))
            free = [waiting[0], *(spec for spec in waiting[1:]
                                  if claims.enter_context(store.claim(spec.run_id, wait=False)))]
            taken = {spec.run_id for spec in free}
            waiting = [spec for spec in waiting if spec.run_id not in taken]
            yield free


def store_trained(store: ResultsStore, record: dict) -> bool:
    """:meth:`ResultsStore.append` of the record of a run this driver trained. Returns whether it was written.

    Raises:
        FwbenchError: the store's refusal (a records file's link re-pointed while the run trained, to a name too long,
            a loop, a directory …), saying that this run's record was not stored and the run is trained again by
            the next ``fwbench run``: the refusal alone (or the traceback before it) left the run's loss unsaid.
    """
    try:
        return store.append(record)
    except FwbenchError as exc:
        label = record.get("variant", {}).get("spec") if isinstance(record.get("variant"), dict) else None
        named = f"{record['run_id']} ({label})" if label else record["run_id"]
        raise FwbenchError(f"{exc}; run {named} finished ({record.get('status')}) but its record was not stored: "
                           "it is trained again by the next fwbench run on this store") from None


def refused_on_every_rank(word):
    """Rank 0's broadcast ``word``, or its store's refusal (a :class:`FwbenchError` it sent) raised on every rank of a
    ``torchrun`` group: raised on rank 0 alone, the others waited in their next broadcast until rank 0 exited, and
    each printed gloo's 'Connection closed by peer' traceback below rank 0's one line.

    Raises:
        FwbenchError: the refusal rank 0 met (the records file's link re-pointed to a name too long, a loop …)."""
    if isinstance(word, FwbenchError):
        raise FwbenchError(str(word)) from None
    return word


def count_stored(summary: dict, stored: bool, record: dict) -> bool:
    """Count a run this driver trained in ``summary``: ``ran`` (with ``diverged`` and ``failed`` by its status) where
    its record was ``stored``, else ``discarded``, its record refused because another driver stored that run first
    (its claim was on a claims file this driver did not see: the records file's link re-pointed while both ran).
    Such a run was counted as trained and its record said stored ("12 trained now") while the store kept the other
    driver's. Returns ``stored``."""
    if not stored:
        summary["discarded"] += 1
        return False
    summary["ran"] += 1
    summary["diverged"] += record["status"] == "diverged"
    summary["failed"] += record["status"] == "failed"
    return True


def run_grid(specs: list[RunSpec], store: ResultsStore, options: LaunchOptions | None = None,
             quiet: bool = False, pack: bool = True) -> dict:
    """Run every spec whose run_id is not finished in ``store``, appending each record as it arrives.

    Safe to run in several processes on one store: each run is claimed while it trains
    (:meth:`ResultsStore.claim`); a run another process holds is left for the end, then waited for
    (:func:`released_by_holders`) and skipped if that process stored it, or run here if it died or let
    go without a record, with every launcher alike. With the Ray launcher this process claims every
    run it submits and stays the only writer of their records; so it does with the local launcher's
    worker processes (``options.jobs`` > 1).
    ``pack``: on the local launcher with one process, runs that share shapes train as one packed
    model where that pays (:mod:`fwbench.run.packing`; ``FWBENCH_PACK`` forces or disables it); a pack trains only its
    runs that are neither stored nor held by another process.
    Summary keys: ``total``, ``ran`` (trained and stored here), ``skipped`` (already stored, here or by another
    process), ``discarded`` (trained here, but another process stored the run first: its record was not kept),
    ``diverged``, ``failed`` (of the runs stored here).

    Raises:
        FwbenchError: the store cannot be written (checked before any training), or ``pack`` or ``quiet`` is not
            a bool (``pack="off"`` packed: a non-empty string is true).
    """
    for name, value in (("pack", pack), ("quiet", quiet)):
        if not isinstance(value, bool):
            raise FwbenchError(f"{name}: got {value!r}; expected True or False")
    # absolute: a Ray worker runs in another working directory. realpath, not Path.resolve, which raised
    # "RuntimeError: Symlink loop" (a traceback, whatever the grid) where R/checkpoints is a link that loops
    options = replace(options or LaunchOptions(),
                      checkpoint_dir=os.path.realpath(store.directory / CHECKPOINT_DIR))
    store.check_writable()
    loaded = store.load()  # one read: the to-do list and the counts later checks compare against
    read, done = loaded, loaded.finished_ids()
    todo = [s for s in specs if s.run_id not in done]
    check_checkpoint_dir(store, todo)
    labels = shown_labels(specs)
    summary = {"total": len(specs), "skipped": len(specs) - len(todo), "ran": 0, "discarded": 0, "diverged": 0,
               "failed": 0}
    if not todo:
        return summary
    bar, progress, begin = _progress_bar(len(todo), quiet)

    def not_settled(claimed: list[RunSpec]) -> list[RunSpec]:
        """``claimed`` but for the runs another process stored since the to-do list was read (counted skipped)."""
        settled = settled_elsewhere(store, read)
        fresh = [spec for spec in claimed if spec.run_id not in settled]
        summary["skipped"] += len(claimed) - len(fresh)
        bar.update(len(claimed) - len(fresh))
        return fresh

    def progress_for(spec: RunSpec):
        if quiet:
            return None
        begin(labels[spec.run_id])
        return progress

    def store_record(record: dict) -> None:
        bar.update(1)
        if not count_stored(summary, store_trained(store, record), record):
            return
        if record["status"] == "failed":
            bar.write(f"run {record['run_id']} ({record['variant']['spec']}) failed: {record['error']}")

    def store_each(records: Generator[dict, None, None], specs: list[RunSpec], unstored: str) -> None:
        """Store each of ``records`` (of ``specs``, trained together: a pack, or one launch's worker pool) as it
        comes; on a store refusal, close ``records`` (a pool's workers end) and name every run of ``specs`` not
        stored after ``unstored``: the refusal named the one it came on, and the others, trained with it, went
        unsaid (a pool trained on for nothing before the error)."""
        given = set()
        try:
            for record in records:
                given.add(record["run_id"])
                try:
                    store_record(record)
                except FwbenchError as exc:
                    records.close()
                    rest = [f"{spec.run_id} ({spec.label})" for spec in specs if spec.run_id not in given]
                    if not rest:
                        raise
                    raise FwbenchError(f"{exc}; {unstored}: {', '.join(rest)}") from None
        finally:
            records.close()

    def run_launched(specs: list[RunSpec]) -> None:
        store_each(launch(specs, options, progress_for), specs,
                   "the runs launched with it and not stored were stopped, and are trained by the next fwbench run too")

    def run_claimed(spec: RunSpec) -> None:
        if not not_settled([spec]):
            return
        for record in launch([spec], options, progress_for):
            store_record(record)

    def run_pack(specs: list[RunSpec]) -> None:
        if len(specs) < 2:
            for spec in specs:
                run_claimed(spec)
            return
        device = resolve_device(options.device)
        torch.set_num_threads(options.threads)
        store_each(execute_packed(specs, device, progress_for(specs[0])), specs,
                   "so are the runs packed with it, trained with it and not stored either")

    held_elsewhere: list[RunSpec] = []
    try:
        if options.launcher == "local" and options.jobs == 1:
            for group in plan_packs(todo, pack_policy(pack), resolve_device(options.device)):
                with ExitStack() as claims:
                    mine = []
                    for spec in group:
                        claimed = claims.enter_context(store.claim(spec.run_id, wait=False))
                        (mine if claimed else held_elsewhere).append(spec)
                    if len(mine) < 2:
                        for spec in mine:
                            run_claimed(spec)
                        continue
                    run_pack(not_settled(mine))
        else:
            with ExitStack() as claims:
                mine = []
                for spec in todo:
                    (mine if claims.enter_context(store.claim(spec.run_id, wait=False)) else held_elsewhere).append(spec)
                # a run another process stored and let go of between the read and the claim: it was trained again
                run_launched(not_settled(mine))
        # a held run is stored only if its holder gets that far: it may die or let go without a record, after
        # this driver's own runs are done; so wait for each, and run here what was not stored
        for released in released_by_holders(store, held_elsewhere):
            fresh = not_settled(released)
            if fresh:
                run_launched(fresh)
    finally:
        bar.close()
        store.close()
    return summary


def run_grid_distributed(specs: list[RunSpec], store: ResultsStore, context: DistributedContext,
                         device: torch.device, quiet: bool = False) -> dict:
    """:func:`run_grid` for one process of a ``torchrun`` group: every rank trains each run together.

    Rank 0 reads the store, claims each run and tells the others (a broadcast) which runs to train,
    so all ranks walk the same list; only rank 0 writes records and checkpoints and shows progress.
    A run another process holds is waited for after the others, and trained here unless its holder
    stored it (rank 0 polls its claim every :data:`HELD_POLL_S` seconds).
    A run that raises stops every rank (torchrun ends the group when one worker fails); finished
    runs are kept. Summary keys as :func:`run_grid`'s.

    Raises:
        FwbenchError: the store cannot be written (checked on every rank before any training).
    """
    store.check_writable()  # on every rank, so that all of them fail alike, not rank 0 alone
    check_checkpoint_dir(store, specs)
    if context.is_main:
        loaded = store.load()  # one read: the to-do list and the counts later checks compare against
        read, done = loaded, loaded.finished_ids()
        todo_ids = [s.run_id for s in specs if s.run_id not in done]
    todo_ids = context.broadcast(todo_ids if context.is_main else None)
    todo = [s for s in specs if s.run_id in set(todo_ids)]
    labels = shown_labels(specs)
    summary = {"total": len(specs), "skipped": len(specs) - len(todo), "ran": 0, "discarded": 0, "diverged": 0,
               "failed": 0}
    show = context.is_main and not quiet
    bar, progress, begin = _progress_bar(len(todo), quiet=not show)

    def decide(spec: RunSpec, claims: ExitStack) -> str:
        """Rank 0's word for ``spec``, on every rank: ``train`` (claimed here, not stored), ``stored`` (by another
        group since the to-do list was read) or ``held`` (another process is training it)."""
        if context.is_main:
            try:
                if not claims.enter_context(store.claim(spec.run_id, wait=False)):
                    decision = "held"
                else:
                    decision = "stored" if spec.run_id in settled_elsewhere(store, read) else "train"
            except FwbenchError as exc:
                decision = exc
        return refused_on_every_rank(context.broadcast(decision if context.is_main else None))

    def settle(spec: RunSpec, decision: str) -> None:
        if decision == "stored":
            summary["skipped"] += 1
            bar.update(1)
            return
        begin(labels[spec.run_id])
        record = execute(spec, device, progress if show else None, checkpoint_path(store, spec), distributed=context)
        # only rank 0 writes, and only its summary is told: the other ranks count the run as stored
        stored = True
        if context.is_main:
            try:
                stored = store_trained(store, record)
            except FwbenchError as exc:
                stored = exc
        refused_on_every_rank(context.broadcast(stored if context.is_main else None))
        count_stored(summary, stored, record)
        bar.update(1)

    def try_each(specs: list[RunSpec]) -> list[RunSpec]:
        """Decide and settle each of ``specs`` in turn; the ones another process holds, left to wait."""
        held = []
        for spec in specs:
            with ExitStack() as claims:
                decision = decide(spec, claims)
                if decision == "held":
                    held.append(spec)
                else:
                    settle(spec, decision)
        return held

    try:
        waiting = try_each(todo)
        # a held run is stored only if its holder gets that far: it may die or let go without a record after this
        # group's own runs are done; so wait for each and train here what was not stored. Rank 0 polls (each
        # poll a broadcast): a blocking wait would leave the other ranks in a broadcast that times out
        while waiting:
            still = try_each(waiting)
            if len(still) == len(waiting):
                time.sleep(HELD_POLL_S)
            waiting = still
    finally:
        bar.close()
        if context.is_main:
            store.close()
    return summary
