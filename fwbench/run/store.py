"""The results store: one JSON line per finished run in ``<results_dir>/runs.jsonl``.

Appends are serialised and all-or-nothing: a record is written while an exclusive ``flock`` on
``runs.lock`` is held, on a file opened with O_APPEND, then fsync'ed; a short or failed write is
cut back off, so the file never keeps half a record from a live process. A process killed in the
middle of a write (``kill -9``, power loss) can still leave an unterminated last line: readers
report it like any corrupt line, and the next append, under the lock, moves the fragment to
``runs.jsonl.torn`` (beside the records file as it really is) before writing, so the store is clean
again. Readers take a shared lock when they can, so they never see a record being written.

Two processes may run grids on the same directory: besides the lock that makes each append
atomic and refuses a second record for a run_id, :meth:`ResultsStore.claim` lets a runner hold a
run while training it (a POSIX byte-range lock on ``claims.lock``, one byte per run id, released
by the kernel if the process dies), so the other process waits for that run instead of repeating it.
Both lock files live beside the records file as it really is, looked up at each use: where ``runs.jsonl`` is a
link into another results directory, the drivers of the two directories share one lock and one set of claims, and
where that link is re-pointed while they run, they follow it.

Reading tolerates a corrupt or truncated line anywhere: it is reported with its line number and
the rest is still read.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fwbench.errors import FwbenchError, one_line, refuse_empty_path
from fwbench.run.strict_json import strict_dumps

RECORDS_FILE = "runs.jsonl"
LOCK_FILE = "runs.lock"
CLAIMS_FILE = "claims.lock"
#: Where the next append moves an unterminated last line left by a process killed mid-write.
TORN_FILE = "runs.jsonl.torn"


def link_chain(path: Path) -> tuple[list[str], str]:
    """(the targets of the links from ``path`` on, as each link names it, the last one no link; the path of that last
    one as a command run anywhere reaches it: a relative target is read from its link's directory, ``ls -l``'s
    'gone' in results/ is results/gone, and the links of its directories resolved: 'd/sub', d a link to 'gone', is
    gone/sub). ``path`` is a link that does not loop (:func:`looping_link`)."""
    hops, current = [], Path(path)
    while current.is_symlink():
        target = current.readlink()
        hops.append(str(target))
        # the link's directory with its own links resolved, so that '..' in a target climbs from where it lives
        current = target if target.is_absolute() else Path(os.path.realpath(current.parent)) / target
    # the end with the links of its directories resolved: mkdir -p of d/sub, d a link to nothing, says 'File exists'
    return hops, os.path.realpath(current)


def reachable(path: str) -> str:
    """``path`` (absolute, as :func:`os.path.realpath` gives it) as the system can look it up: relative to the working
    directory where it is longer than the system's path limit, as it is under a deep working directory (a relative
    --results-dir there is short; its records file's target made absolute is not, and a store whose runs.jsonl is a
    link ended in a traceback, "OSError: [Errno 36] File name too long")."""
    if len(os.fsencode(path)) < os.pathconf("/", "PC_PATH_MAX"):
        return path
    return os.path.relpath(path)


def spelled_target(path: Path) -> Path:
    """Where the links from ``path`` on lead, each relative target joined to the path its link was reached by, not
    resolved ('R/X2/../X1/runs.jsonl' for R/X2/runs.jsonl a link to ../X1/runs.jsonl): the system resolves it as it
    would the links, yet it stays as short as they are where the resolved path is past the system's limit."""
    current = Path(path)
    for _ in range(40):  # the kernel's limit: past it the links loop, which is told where they are used
        if not os.path.islink(current):
            break
        current = current.parent / current.readlink()
    return current


def blocking_file(path: str | Path) -> Path | None:
    """The nearest directory above ``path`` (a path that does not exist) that exists and is no directory (a file),
    so that ``path`` can never be made (``mkdir -p`` says 'Not a directory'); None where it can be."""
    for parent in Path(os.path.realpath(path)).parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def dangling_link(path: Path) -> Path | None:
    """The first of ``path`` and the directories above it, from the root down, that is a link leading to nothing
    (``ln -s gone R``, or a chain of links ending there); None where none is. Loops are :func:`looping_link`'s."""
    for candidate in (*reversed(path.parents), path):
        if candidate.is_symlink() and not candidate.exists():
            return candidate
    return None


def looping_link(path: Path) -> Path | None:
    """The first of ``path`` and the directories above it, from the root down, that is a link whose links never end
    (``ln -s R R``, or two links to each other: ELOOP); None where none is."""
    for candidate in (*reversed(path.parents), path):
        try:
            os.stat(candidate)
        except OSError as exc:
            if exc.errno == errno.ELOOP and candidate.is_symlink():
                return candidate
            if exc.errno != errno.ELOOP:
                return None  # a missing or unreadable path: nothing below it is reached through a loop
    return None


def loop_entry(link: Path) -> tuple[list[str], Path | None]:
    """(the targets of the links from ``link`` on, as each link names it, up to the first link of a loop they reach;
    that link, or None where ``link`` is itself one of the loop's links: ``ln -s R R``, or two links to each other).
    ``link`` is a link whose links never end (:func:`looping_link`); a loop may also be reached as a directory above
    a target (``ln -s loop/sub R; ln -s loop loop``: the loop is 'loop', R only leads into it)."""
    def absolute(path: Path) -> Path:
        # its directory's links resolved, so that one link reached by two routes is seen as one
        return Path(os.path.realpath(path.parent)) / path.name

    hops: list[str] = []  # hops[i]: the target of visited[i]
    visited: list[Path] = []
    cut = None  # len(hops) where the walk left link's own chain for a looping directory above a target
    current = absolute(Path(link))
    while len(visited) <= 64:  # past the kernel's 40 links the walk is no longer worth following
        if current.is_symlink():
            if current in visited:
                first = visited.index(current)
                return hops[:first if cut is None else min(first, cut)], None if first == 0 else current
            visited.append(current)
            target = current.readlink()
            hops.append(str(target))
            # spelled as reached (ln -s /via/R R, via a link; ln -s ../real/S S), R was not found among the visited
            # and was said to lead into '/via/R', another link, not back to itself
            current = absolute(target if target.is_absolute() else Path(os.path.realpath(current.parent)) / target)
            continue
        above = looping_link(current)
        if above is None:
            break
        # the target lies under a looping link (ln -s loop/sub R): that link's own loop is the one reached, and
        # R's links end here; iterative, since the link may be R itself (ln -s R/x R)
        cut = len(hops) if cut is None else cut
        current = absolute(above)
    return hops, None


def describe_loop(link: Path) -> str:
    """What ``link`` (a link whose links never end, :func:`looping_link`) is, for a refusal: 'a link that leads back
    to itself (a loop)', or, for a link that only leads into another's loop, each of its links to that one, 'a link
    to 'loop/sub', which leads into '…/loop', a link that leads back to itself (a loop)' (it was called a loop
    itself, and the link to mend went unnamed)."""
    hops, entry = loop_entry(link)
    if entry is None:
        return "a link that leads back to itself (a loop)"
    named = ", a link to ".join(repr(hop) for hop in hops)
    return f"a link to {named}, which leads into {str(entry)!r}, a link that leads back to itself (a loop)"


#: What a path that is no regular file, no directory and no link is, by its st_mode's file type.
SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                 (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def special_file(path: Path) -> str | None:
    """What ``path`` (its links followed) is where it is a named pipe, a socket or a device (``mkfifo R/runs.jsonl``,
    ``ln -s /dev/null R/runs.jsonl``), e.g. 'a named pipe (FIFO)'; None for a regular file, a directory or no file.
    Opening a FIFO blocks until another process opens its other end: ``fwbench run``, ``report`` and ``estimate``
    hung there, with no word; and a run's records written to /dev/null were lost while it said they were stored."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((what for test, what in SPECIAL_FILES if test(mode)), None)


def shorten(text: str, longest: int = 40) -> str:
    """``text`` whole where it is at most ``longest`` characters, else its first 20 and last 10 around an ellipsis."""
    return text if len(text) <= longest else f"{text[:20]}…{text[-10:]}"


def link_to_long_name(path: Path) -> tuple[Path, list[str], str] | None:
    """(the first of ``path`` and the directories above it, from the root down, that is a link whose links lead to a
    name longer than the file system allows; the targets of its links as each names them, up to the one holding that
    name; the name), or None where none is. Such a link cannot be followed: ENAMETOOLONG, though ``path`` as spelled
    is short (``ln -s aaa…a R``, 300 bytes)."""
    limit = os.pathconf("/", "PC_NAME_MAX")
    for candidate in (*reversed(path.parents), path):
        hops, current = [], candidate
        while os.path.islink(current) and len(hops) < 40:  # past the kernel's 40 links it is a loop, not this
            target = current.readlink()
            hops.append(str(target))
            long = next((part for part in target.parts if len(os.fsencode(part)) > limit), None)
            if long is not None:
                return candidate, hops, long
            # joined, not resolved: the kernel reads a relative target from the link's directory as reached
            current = current.parent / target
    return None


def describe_long_name(option: str, path: Path, subject: Path, why: str) -> str | None:
    """The refusal of ``subject`` (``path`` or a directory above it) where a link on the way to ``path`` leads to a
    name too long (:func:`link_to_long_name`): naming the link, its targets, the name and the limit; None where no
    link does."""
    found = link_to_long_name(path)
    if found is None:
        return None
    link, hops, long = found
    where = "" if link == subject else f" under {str(link)!r},"
    named = ", a link to ".join(repr(shorten(hop, 60)) for hop in hops)
    return (f"{option}: got {str(subject)!r},{where} a link to {named}, holding the name {shorten(long)!r}, of "
            f"{len(os.fsencode(long))} bytes: {why}; expected names of at most {os.pathconf('/', 'PC_NAME_MAX')} bytes "
            "(point the link at a shorter path)")


def _refuse_too_long(option: str, path: Path) -> None:
    """Refuse ``path`` (a store's records file) where the system cannot even look it up: a name in it longer than its
    file system allows (255 bytes on most), or the whole longer than the system's path limit, or a link on the way to
    it (the results directory, one above it, the records file itself) whose target holds such a name. Every command
    (``run``, ``report``, ``estimate --against``, ``bench``) ended in a traceback, "OSError: [Errno 36] File name too
    long", from the first look at it.

    Raises:
        FwbenchError: naming ``option``, the first name too long (or the whole path, or the link) and the limit.
    """
    try:
        os.stat(path)  # followed: a link to a name too long is refused here, not at its first use in a traceback
        return
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            return  # missing, a loop, no permission …: each is told where the store is used
        why = exc.strerror
    directory = path.parent
    limit = os.pathconf("/", "PC_NAME_MAX")
    for part in directory.parts:
        if len(os.fsencode(part)) > limit:
            raise FwbenchError(f"{option}: got a directory path holding the name {shorten(part)!r}, of "
                               f"{len(os.fsencode(part))} bytes: {why}; expected names of at most {limit} "
                               "bytes (shorten it)") from None
    if len(os.fsencode(path)) < os.pathconf("/", "PC_PATH_MAX"):
        # the path as spelled is short: a link on the way leads to the long name ('got a directory path of 1 bytes:
        # …; expected at most 4084 bytes' was said of ln -s aaa…a R)
        subject = path if os.path.islink(path) and link_to_long_name(directory) is None else directory
        told = describe_long_name(option, path, subject, why)
        if told is not None:
            raise FwbenchError(told)
    raise FwbenchError(f"{option}: got a directory path of {len(os.fsencode(directory))} bytes: {why}; "
                       f"expected at most {os.pathconf('/', 'PC_PATH_MAX') - len(path.name) - 2} bytes (shorten it)")


@dataclass
class LoadedRecords:
    """Records read from a store, with a message for each line that could not be parsed."""

    records: list[dict]
    problems: list[str] = field(default_factory=list)
    #: the number (from 1) of each line that could not be parsed, in the order of ``problems``: a caller that
    #: names a line reads it here, not back out of the message (whose path may hold ": ")
    skipped_lines: list[int] = field(default_factory=list)
    #: how many parseable lines hold each run id (any status): ``records`` keeps one record per run id (the
    #: last), so a run tried again after a failed record reads there as one record, however many lines it has
    counts: Counter = field(default_factory=Counter)
    #: the ``failed`` records of each run id, keyed (run_id, :func:`_failure_key`): 1 for each try's ``attempt`` id,
    #: and for a record without one the number of failures with its error message. A later read tells the failures
    #: stored since from those already there by these keys, not by the file's (device, inode), which a rewrite by
    #: rename (sed -i, an editor, a link re-pointed to a copy) changes with the same lines kept, nor by their text
    #: or full content, which a re-serialisation changes (jq -c: other separators and key order, and 0.0 written 0)
    lines: Counter = field(default_factory=Counter)
    #: the ``failed`` records of each run id with each error message, with an ``attempt`` id or not, keyed (run_id,
    #: :func:`error_digest`): a record whose id a rewrite dropped (jq 'del(.attempt)') is no new failure
    messages: Counter = field(default_factory=Counter)

    def finished_ids(self) -> set[str]:
        """Run ids with a finished record, never run again (a ``failed`` record is retried)."""
        return {r["run_id"] for r in self.records if r.get("status") != "failed"}


class ResultsStore:
    """Append-only JSONL store of run records, keyed by ``run_id`` (``records_file`` in ``directory``;
    ``fwbench bench`` keeps its records in ``bench.jsonl`` beside the runs).

    Raises:
        FwbenchError: ``directory`` is empty (``Path("")`` is the working directory), or the
            directory cannot be created or written.
    """

    def __init__(self, directory: str | Path, records_file: str = RECORDS_FILE, *, option: str = "--results-dir"):
        # option: the argument that named ``directory``, for the refusals of :meth:`load` (--against reads a store)
        self.option = option
        refuse_empty_path(option, directory, "a directory path")
        self.directory = Path(directory)
        self.path = self.directory / records_file
        _refuse_too_long(option, self.path)
        # one lock per records file: runs.jsonl → runs.lock (as before), bench.jsonl → bench.lock
        self._lock_name = LOCK_FILE if records_file == RECORDS_FILE else f"{Path(records_file).stem}.lock"
        # the claims files opened, by (device, inode): one per file the records file has led to (see claim)
        self._claims_fds: dict[tuple[int, int], int] = {}
        self._spare_fds: list[int] = []

    @property
    def home(self) -> Path:
        """Where the lock and claims files (and the torn lines' file) live: beside the records file as it really is,
        where it is a link into another directory that exists, else :attr:`directory`. Looked up at each use, not
        once: a link re-pointed while a driver ran (ln -sf ../R3/runs.jsonl R2/runs.jsonl) had it lock R1's lock
        while it wrote R3's file, beside another driver that held R3's, and take that driver's line, half written,
        for a torn one.

        Two results directories whose runs.jsonl lead to one file (ln -s ../R1/runs.jsonl R2/runs.jsonl) each locked
        and claimed in their own: two drivers trained every run twice, and one of them dropped its records while
        saying it had trained them. Only a link to a records file (a regular file, or none yet) moves them: beside a
        link's device, pipe or directory they were made in a directory never named (/dev/runs.lock for ln -s
        /dev/null R/runs.jsonl; P/runs.lock for ln -s ../P/sub R/…) before the records file was refused.

        Raises:
            FwbenchError: the records file (or a link on the way to it) now leads to a name longer than the file
                system allows, refused as at start-up (:func:`_refuse_too_long`): a link re-pointed so while a driver
                ran ended it in a traceback, "OSError: [Errno 36] File name too long", from the lock, claim or
                append that looked it up.
        """
        _refuse_too_long(self.option, self.path)
        real = Path(reachable(os.path.realpath(self.path)))
        if len(os.fsencode(real)) >= os.pathconf("/", "PC_PATH_MAX"):
            # past the limit from the working directory too (R a link into a deep tree): its links as spelled, each
            # target read from where its link is reached, are short, and lead to the same file
            real = spelled_target(self.path)
        if self.path.is_symlink() and real.parent.is_dir() and (real.is_file() or not os.path.lexists(real)):
            return real.parent
        return self.directory

    @property
    def lock_path(self) -> Path:
        """The records file's lock (``runs.lock`` for ``runs.jsonl``, ``bench.lock`` for ``bench.jsonl``) in
        :attr:`home`."""
        return self.home / self._lock_name

    def _ensure_writable(self) -> None:
        loop = looping_link(self.directory)
        if loop is not None:
            # mkdir said 'File exists' (the link), which no directory named by --results-dir can mend
            where = "" if loop == self.directory else f" under {str(loop)!r},"
            raise FwbenchError(f"--results-dir: got {str(self.directory)!r},{where} {describe_loop(loop)}; expected a "
                               "directory (or a new path) (remove the link or point it at a directory)")
        if self.directory.exists() and not self.directory.is_dir():
            raise FwbenchError(
                f"--results-dir: got {str(self.directory)!r}, which is a file; expected a directory (or a new path)"
            )
        candidate = dangling_link(self.directory)
        if candidate is not None:
            # mkdir said 'File exists' (the link): a directory is made at a link's target, not in its place
            where = "" if candidate == self.directory else f" under {str(candidate)!r},"
            # each link is named to the missing end: 'a link to 'mid', which does not exist' was false for a
            # link to a link to nothing (mid is there, a link)
            hops, end = link_chain(candidate)
            named = ", a link to ".join(repr(hop) for hop in hops)
            blocked = blocking_file(end)
            if blocked is not None:
                # 'create …/notes.txt/sub', followed, failed: no directory can be made under a file
                raise FwbenchError(f"--results-dir: got {str(self.directory)!r},{where} a link to {named}, which "
                                   f"does not exist and cannot be made ({str(blocked)!r} is a file); expected a "
                                   "directory (or a new path) (remove the link or point it at a directory)")
            raise FwbenchError(f"--results-dir: got {str(self.directory)!r},{where} a link to {named}, which does "
                               f"not exist; expected a directory (or a new path) (create {end!r} or remove the "
                               f"link{'s' if len(hops) > 1 else ''})")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FwbenchError(f"--results-dir: cannot create {str(self.directory)!r}: {exc.strerror}") from None
        if not os.access(self.directory, os.W_OK):
            raise FwbenchError(f"--results-dir: {str(self.directory)!r} is not writable; choose a writable directory")
        # the lock and claims files live beside the records file a link leads to (one set for every directory sharing
        # it): where they are missing and cannot be made there, it was told as "cannot open '…/R1/runs.lock':
        # Permission denied; expected a lock file", with no word of why a lock is wanted in R1 nor of a mend
        wanted = [self.lock_path] + ([self.home / CLAIMS_FILE] if self.lock_path.name == LOCK_FILE else [])
        if (self.home != self.directory and not os.access(self.home, os.W_OK)
                and not all(os.path.lexists(path) for path in wanted)):
            # bench.jsonl has a lock and no claims file: 'its lock and claims files' named one never made
            files = "lock and claims files" if len(wanted) > 1 else "lock file"
            raise FwbenchError(f"--results-dir: got {str(self.path)!r}, a link to {str(self.path.readlink())!r}, in "
                               f"a directory that is not writable ({str(self.home)!r}); expected a records file whose "
                               f"directory can take its {files}, shared by every results directory "
                               f"linked to it (make {str(self.home)!r} writable, or put a copy of the file in place of "
                               "the link)")

    def refuse_unreachable(self, expected: str) -> None:
        """Refuse a directory to read (``fwbench report``, ``estimate --against``) that is, or lies under, a link
        looping back to itself or leading to nothing: they were called "not a directory" and "no records file
        'R/runs.jsonl'", the link unnamed. ``expected`` says what the option names.

        Raises:
            FwbenchError: naming :attr:`option`, the link and where it leads; nothing where no link is at fault.
        """
        loop = looping_link(self.directory)
        link = loop if loop is not None else dangling_link(self.directory)
        if link is None:
            return
        where = "" if link == self.directory else f" under {str(link)!r},"
        if loop is not None:
            why = describe_loop(loop)
        else:
            why = f"a link to {', a link to '.join(repr(hop) for hop in link_chain(link)[0])}, which does not exist"
        raise FwbenchError(f"{self.option}: got {str(self.directory)!r},{where} {why}; expected {expected} (point the "
                           "link at it)")

    def refuse_dangling_records_file(self) -> None:
        """Refuse a records file to read (``fwbench report``, ``estimate --against``) that is a link leading to nothing
        (``ln -s gone.jsonl R/runs.jsonl``: a moved or unmounted store, or a chain of links ending there): read as no
        file, the report called the directory empty, "holds no run records", and estimate "no records file
        'R/runs.jsonl'", the link there and unnamed. (``fwbench run`` writes through such a link, making its target.)

        Raises:
            FwbenchError: naming :attr:`option`, the file and each of its links; nothing where it is no such link
                (a link that loops: :meth:`load` names it).
        """
        if not self.path.is_symlink() or self.path.exists() or looping_link(self.path) is not None:
            return
        hops = ", a link to ".join(repr(hop) for hop in link_chain(self.path)[0])
        raise FwbenchError(f"{self.option}: cannot read {str(self.path)!r}, a link to {hops}, which does not exist; "
                           "expected a file of records, one JSON line each (point the link at the records file or "
                           "remove it)")

    def _refuse_special(self, path: Path, what: str) -> None:
        """Refuse ``path``, a file of the store (``what``: 'a file of records, one JSON line each', 'a lock file' …),
        where it is a named pipe, a socket or a device (:func:`special_file`), before it is opened.

        Raises:
            FwbenchError: naming :attr:`option`, the path (and its link's target) and what it is.
        """
        kind = special_file(path)
        if kind is None:
            return
        link = f", a link to {str(path.readlink())!r}," if path.is_symlink() else ","
        remedy = "remove the link or point it at a regular file" if path.is_symlink() else "move it away"
        raise FwbenchError(f"{self.option}: got {str(path)!r}{link} {kind}; expected {what} ({remedy})")

    def check_writable(self, claims: bool = True) -> None:
        """Fail now, before any training, if records could not be stored here.

        Creates the directory if needed and opens the lock and records files for appending
        (writing nothing), and with ``claims`` (a store whose runs are claimed, :meth:`claim`) the claims file.
        Raises :class:`FwbenchError` naming ``--results-dir`` otherwise.
        """
        with self._locked():
            self._refuse_special(self.path, "a file of records, one JSON line each")
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
            except OSError as exc:
                raise self._unwritable(exc) from None
            # claims.lock is opened at the first claim, after the grid is read: a directory or a broken link there
            # ended the run in a traceback (an OSError from os.open)
            if claims:
                os.close(self._open_claims())
            if self._torn_tail(terminate=False) is not None:
                # the next append sets the torn line aside: a torn-lines file that cannot take it is told now
                self._open_torn().close()

    @contextmanager
    def _locked(self, shared: bool = False) -> Iterator[None]:
        """Hold the records file's lock (``runs.lock`` for ``runs.jsonl``): exclusively to write, shared
        to read (readers skip it where they cannot create the lock file, e.g. a read-only copy of a
        results directory)."""
        while True:
            lock_path = self.lock_path
            self._refuse_special(lock_path, "a lock file")  # opened for writing, a FIFO blocks
            if shared:
                try:
                    lock = open(lock_path, "a")
                except OSError:
                    yield
                    return
            else:
                self._ensure_writable()
                try:
                    lock = open(lock_path, "a")
                except OSError as exc:
                    # a lock file linked into a missing directory said only "No such file or directory", R being there
                    raise self._unwritable(exc, lock_path, "open", "a lock file") from None
            with lock:
                fcntl.flock(lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
                if self.lock_path != lock_path:
                    # the records file's link was re-pointed while this waited: the lock held is no longer its own
                    fcntl.flock(lock, fcntl.LOCK_UN)
                    continue
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                return

    def load(self) -> LoadedRecords:
        """Every parseable record in file order; a later record with the same run_id wins.

        A line that is not a JSON object with a ``run_id`` (corrupt, or truncated by a crash) is
        skipped and reported in ``problems`` as ``PATH:LINE: corrupt or truncated record skipped``.

        Raises:
            FwbenchError: the records file exists but cannot be opened (a directory, no permission, a link
                that loops).
        """
        if not self._records_file_exists():
            return LoadedRecords([])
        with self._locked(shared=True):
            return self._load_unlocked()

    def _records_file_exists(self) -> bool:
        """Whether the records file is there (a link to nothing is not: a write creates its target).

        Raises:
            FwbenchError: it cannot be looked at, a link that loops back to itself (``Path.exists`` says False
                for it, and the report called such a store empty, "holds no run records", its bench.jsonl
                "No benchmark records yet", without naming the link).
        """
        try:
            os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise self._unreadable(exc) from None
        self._refuse_special(self.path, "a file of records, one JSON line each")
        return True

    def _unreadable(self, exc: OSError) -> FwbenchError:
        loop = None if self.path.is_symlink() else looping_link(self.directory)
        if loop is not None:
            # the results directory (or a directory above it) loops, not the records file: 'move the directory or
            # file away' named R/runs.jsonl, which is neither, and left the link as it was
            remedy = f"{str(loop)!r} is {describe_loop(loop)}: remove it or point it at a directory"
        elif self.path.is_symlink():
            remedy = "remove the link or point it at the records file"
        else:
            remedy = "move the directory or file away"
        return FwbenchError(f"{self.option}: cannot read {str(self.path)!r}: {exc.strerror}; expected a file of "
                            f"records, one JSON line each ({remedy})")

    def _unwritable(self, exc: OSError, path: Path | None = None, verb: str = "write",
                    what: str = "a records file") -> FwbenchError:
        """The refusal of a records file (or ``path``, another file of the store: the lock file, claims.lock, the
        torn lines' file, ``verb`` 'open', ``what`` 'a lock file') that cannot be opened for appending. One that is a
        link to nothing is written through (a run creates its target); where the target's directory is missing, the
        error said only "cannot write 'R/runs.jsonl': No such file or directory", R being there: the link and its
        target are named."""
        path = self.path if path is None else path
        if exc.errno == errno.ENAMETOOLONG:
            # a store file that is a link to a name too long (ln -s aaa…a R/claims.lock) ended in a traceback,
            # "OSError: [Errno 36] File name too long", from Path.exists below
            told = describe_long_name("--results-dir", path, path, exc.strerror)
            if told is not None:
                return FwbenchError(told.replace(f"got {str(path)!r},", f"cannot {verb} {str(path)!r},", 1)
                                    .replace("expected names", f"expected {what}, with names", 1))
        if path.is_symlink() and not os.path.exists(path) and exc.errno == errno.ENOENT:
            target = Path(os.path.realpath(path))
            return FwbenchError(f"--results-dir: cannot {verb} {str(path)!r}, a link to {str(path.readlink())!r}: "
                                f"{exc.strerror}; expected {what} or a link to one that can be made (create "
                                f"{str(target.parent)!r} or point the link elsewhere)")
        # other failures were told by their errno alone ('Is a directory', 'Too many levels of symbolic links'), with
        # no word of what the file must be nor how to mend it
        named, why, remedy = repr(str(path)), exc.strerror, ""
        if exc.errno == errno.EISDIR and path.is_symlink():
            # a link to a directory: "move the directory away" named the link's target, perhaps a directory of the
            # user's own, as the thing to move
            named = f"{named}, a link to {str(path.readlink())!r}"
            remedy = " (remove the link or point it at a file)"
        elif exc.errno == errno.EISDIR:
            remedy = " (move the directory away)"
        elif exc.errno == errno.ELOOP and path.is_symlink():
            remedy = " (remove the link or point it at a file)"
        elif exc.errno == errno.ENOTDIR and path.is_symlink() and (blocked := blocking_file(path)) is not None:
            named = f"{named}, a link to {str(path.readlink())!r}"
            why = f"{why} ({str(blocked)!r} is a file)"
            remedy = " (remove the link or point it elsewhere)"
        return FwbenchError(f"--results-dir: cannot {verb} {named}: {why}; expected {what}{remedy}")

    def _load_unlocked(self) -> LoadedRecords:
        if not self._records_file_exists():
            return LoadedRecords([])
        records: dict[str, dict] = {}
        counts: Counter = Counter()
        lines: Counter = Counter()
        messages: Counter = Counter()
        problems, skipped_lines = [], []
        try:
            handle = open(self.path, "rb")
        except OSError as exc:
            # a records file that is a directory (mkdir -p R/runs.jsonl) or cannot be opened: fwbench report
            # ended in a traceback (IsADirectoryError) from its check of an empty store
            raise self._unreadable(exc) from None
        with handle:
            for number, raw in enumerate(handle, start=1):
                text = _line_text(raw, first=number == 1)
                if not text:
                    continue
                try:
                    record = json.loads(text)
                    run_id = record["run_id"]
                    if not isinstance(run_id, str):
                        raise TypeError(run_id)
                # ValueError: an integer of more than 4300 digits (JSONDecodeError is one too); RecursionError:
                # arrays nested past the recursion limit; both are lines that are not records, and raised a traceback
                except (ValueError, RecursionError, KeyError, TypeError):
                    problems.append(f"{one_line(self.path)}:{number}: corrupt or truncated record skipped")
                    skipped_lines.append(number)
                    continue
                records[run_id] = record
                counts[run_id] += 1
                if record.get("status") == "failed":  # a run with any other record is settled whatever its lines
                    key = _failure_key(record)
                    attempt = is_attempt_key(key)
                    # a try's id counts once: a line duplicated since the read (cat f f, a merge) is no new try
                    lines[run_id, key] = 1 if attempt else lines[run_id, key] + 1
                    messages[run_id, error_digest(record) if attempt else key] += 1
        return LoadedRecords(list(records.values()), problems, skipped_lines, counts, lines, messages)

    def records(self) -> list[dict]:
        return self.load().records

    def finished_ids(self) -> set[str]:
        """Run ids with a finished record, never run again (a ``failed`` record is retried)."""
        return self.load().finished_ids()

    def append(self, record: dict) -> bool:
        """Append ``record`` unless its run_id is already stored. Returns whether it was written.

        All or nothing: if the write fails part-way (disk full, quota), what was written is cut
        off again and :class:`FwbenchError` is raised. The line is strict JSON: a NaN or infinite
        value is written as ``null`` and listed in the record's ``non_finite``
        (:func:`fwbench.run.strict_json.sanitize_record`).
        """
        line = (strict_dumps(record, sort_keys=True) + "\n").encode()
        with self._locked():
            finished = {r["run_id"] for r in self._load_unlocked().records if r.get("status") != "failed"}
            if record["run_id"] in finished:
                return False  # another process finished this run first
            try:
                self._set_aside_torn_tail()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:
                raise self._unwritable(exc) from None
            try:
                size_before = os.fstat(fd).st_size
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError as exc:
                    os.ftruncate(fd, size_before)  # no half record left behind
                    raise FwbenchError(
                        f"--results-dir: cannot write a record to {str(self.path)!r}: {exc.strerror}"
                    ) from None
            finally:
                os.close(fd)
        return True

    def _torn_tail(self, terminate: bool = True) -> int | None:
        """Where the records file's unterminated last line starts (a write cut short by a killed process), or None
        where it has none; one complete but for its newline is kept, not set aside (``terminate``: it gets its
        newline here).

        Called with the exclusive lock held, so no live writer can be mid-line.
        """
        if not self.path.exists() or self.path.stat().st_size == 0:
            return None
        with open(self.path, "rb+") as handle:
            end = handle.seek(0, os.SEEK_END)
            handle.seek(end - 1)
            if handle.read(1) == b"\n":
                return None
            start = end
            while start > 0:  # find the start of the last line, reading backwards in blocks
                block = min(65536, start)
                handle.seek(start - block)
                chunk = handle.read(block)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    start = start - block + newline + 1
                    break
                start -= block
            handle.seek(start)
            if _is_record(handle.read(), first=start == 0):  # complete but for its newline: keep it
                if not terminate:
                    return None
                handle.write(b"\n")
                handle.flush()
                os.fsync(handle.fileno())
                return None
        return start

    def _open_torn(self):
        """``runs.jsonl.torn`` opened for appending (binary).

        Raises:
            FwbenchError: it cannot be opened (a directory, a link to nothing in a missing directory, a loop): it
                was called "cannot write 'R/runs.jsonl'", the records file, which was fine, and only at the first
                append, after a run had trained.
        """
        # beside the records file as it really is, as the lock is: through a link (ln -s ../R1/runs.jsonl
        # R2/runs.jsonl) a line torn in R1's file went to R2/runs.jsonl.torn, and vanished from R1 for its user
        torn = self.home / TORN_FILE
        self._refuse_special(torn, "a file for torn lines")
        try:
            return open(torn, "ab")
        except OSError as exc:
            raise self._unwritable(exc, torn, "open", "a file for torn lines") from None

    def _set_aside_torn_tail(self) -> None:
        """Move an unterminated last line (a write cut short by a killed process) to ``runs.jsonl.torn``.

        Called with the exclusive lock held, so no live writer can be mid-line.
        """
        start = self._torn_tail()
        if start is None:
            return
        with self._open_torn() as torn, open(self.path, "rb+") as handle:
            handle.seek(start)
            torn.write(handle.read() + b"\n")
            torn.flush()
            os.fsync(torn.fileno())
            handle.truncate(start)
            handle.flush()
            os.fsync(handle.fileno())

    @contextmanager
    def claim(self, run_id: str, wait: bool = True) -> Iterator[bool]:
        """Hold ``run_id`` while training it, so that another process on this store skips or waits.

        Yields True once held; with ``wait=False`` yields False at once if another process holds
        it. Claims are POSIX byte-range locks (one byte of ``claims.lock`` per run id): the kernel
        drops them when the process exits or is killed, so a crash never leaves a run claimed.
        Within one process claims never conflict (one runner runs one cell at a time).

        The claims file is the one beside the records file where it leads at this claim (:attr:`home`), as the
        lock is: a records file's link re-pointed while a driver ran (ln -sfn ../C/runs.jsonl B/runs.jsonl) had it
        go on claiming in the old target's claims.lock, opened once, unseen by the drivers of the new one, so
        both trained every cell. A claim taken while the link moved is let go and taken again where it now leads.
        A claim already held when the link moves stays on the old file: that run may be trained by a driver of
        the new target too, and only the first of the two records is stored (:meth:`append`).

        Raises:
            FwbenchError: the claims file cannot be opened (a directory, a link into a missing directory, a loop).
        """
        offset = int(hashlib.sha256(run_id.encode()).hexdigest()[:15], 16)  # stable across processes
        while True:
            fd, key = self._claims_descriptor()
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), 1, offset)
            except OSError as exc:
                if wait or exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                yield False
                return
            if self._claims_key() == key:
                break
            # the link was re-pointed while this claimed (or waited): the byte held is no longer this store's claim
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)
        try:
            yield True
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)

    def _claims_key(self) -> tuple[int, int] | None:
        """(device, inode) of the claims file where :attr:`home` now puts it; None where there is none yet."""
        try:
            found = os.stat(self.home / CLAIMS_FILE)
        except OSError:
            return None
        return found.st_dev, found.st_ino

    def _claims_descriptor(self) -> tuple[int, tuple[int, int]]:
        """(a descriptor of the claims file where :attr:`home` now puts it, that file's (device, inode)).

        One descriptor per file, kept until :meth:`close`: closing any descriptor of a file drops every POSIX lock
        this process holds on it, so a second one, opened and closed again, would let go of the claims held through
        the first.
        """
        key = self._claims_key()
        if key in self._claims_fds:
            return self._claims_fds[key], key
        self._ensure_writable()
        fd = self._open_claims()
        found = os.fstat(fd)
        key = (found.st_dev, found.st_ino)
        if key in self._claims_fds:
            # made meanwhile and opened already through another path: keep this one open too (see above)
            self._spare_fds.append(fd)
            return self._claims_fds[key], key
        self._claims_fds[key] = fd
        return fd, key

    def _open_claims(self) -> int:
        """A descriptor of ``claims.lock`` in :attr:`home`, opened for reading and writing (created where missing).

        Raises:
            FwbenchError: it cannot be opened (a directory, a link to nothing in a missing directory, a loop).
        """
        path = self.home / CLAIMS_FILE
        self._refuse_special(path, "a claims file")
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._unwritable(exc, path, "open", "a claims file") from None

    def close(self) -> None:
        """Release the claims files (and with them any claim still held)."""
        for fd in [*self._claims_fds.values(), *self._spare_fds]:
            os.close(fd)
        self._claims_fds.clear()
        self._spare_fds.clear()


def _failure_key(record: dict) -> bytes:
    """What tells one failed record from another through any rewrite of its line (jq -c, sorted keys, escapes, sed):
    ``attempt:`` and the record's ``attempt`` id, which :func:`~fwbench.run.launchers.failed_record` draws for each
    try (32 hex digits, which every rewriter keeps as they are); for a record without one (written before 2026-12-07,
    or by hand), the SHA-256 of its error message (its string as JSON decodes it; ``b""`` where it holds none).
    The message alone did not survive every rewrite: jq 1.6 swallows up to two bytes after a lead byte whose sequence
    runs past the string's end ('data/caf\\xe9\''), so the key changed and the earlier failure read as a new one (its
    run not retried, break-it pass W); and two messages differing only in undecodable bytes shared a key.
    A failed record's other fields are the run's own (fwbench stores its wall time as 0.0): a digest of the whole
    content took a rewrite by jq, which writes 0.0 as 0, for a failure stored since the read, and that run was not
    retried; it also re-encoded every failed line (a second each 100k lines) and raised RecursionError on lines
    nested one level short of the decoder's limit."""
    attempt = record.get("attempt")
    if isinstance(attempt, str) and _ATTEMPT_ID.fullmatch(attempt):
        return _ATTEMPT + attempt.encode("ascii")
    return error_digest(record)


def error_digest(record: dict) -> bytes:
    """The SHA-256 of a failed record's error message, through any rewrite of its line (:func:`_failure_key`)."""
    error = record.get("error")
    if not isinstance(error, str):
        return b""
    # bytes no decoder agrees on: a lone surrogate (an escape json.loads keeps, from an undecodable file name), which
    # jq writes back as U+FFFD and errors="replace" gave as '?'; invalid UTF-8 that this read replaces with one
    # U+FFFD per byte and jq with one per sequence ('\xed\xa0\x80': 3 against 1). Either changed the key on a jq
    # rewrite and the earlier failure read as a new one: every run of them counts as one U+FFFD
    if "\ufffd" in error or not error.isascii():
        error = _UNDECODED.sub("\ufffd", error)
    return hashlib.sha256(error.encode("utf-8")).digest()


_ATTEMPT = b"attempt:"  # an id's key has 40 bytes, an error's digest 32: the two kinds never meet
_ATTEMPT_ID = re.compile("[0-9a-f]{32}")
_UNDECODED = re.compile("[\ud800-\udfff\ufffd]+")  # json.loads joins a valid surrogate pair into one character


def is_attempt_key(key: bytes) -> bool:
    """Whether a :func:`_failure_key` is an ``attempt`` id's (else it is an error message's digest, or ``b""``)."""
    return len(key) == len(_ATTEMPT) + 32


def _line_text(raw: bytes, first: bool) -> str:
    """One line of the records file as text, without surrounding whitespace (CRLF included) and, on the
    file's first line, without a UTF-8 byte order mark: an editor that saves UTF-8 with one (Windows
    Notepad did) left the first record unreadable to json ("Unexpected UTF-8 BOM"), so it was skipped as
    corrupt and its run trained again (RFC 8259 8.1: a parser may ignore the mark)."""
    text = raw.decode("utf-8", errors="replace")
    return (text.removeprefix("\ufeff") if first else text).strip()


def _is_record(raw: bytes, first: bool = False) -> bool:
    """Whether ``raw`` is one whole record: a JSON object with a string ``run_id`` (``first``: the file's
    first line, whose byte order mark :func:`_line_text` ignores)."""
    try:
        text = raw.decode("utf-8")
        record = json.loads(text.removeprefix("\ufeff") if first else text)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors; see _load_unlocked
        return False
    return isinstance(record, dict) and isinstance(record.get("run_id"), str)
