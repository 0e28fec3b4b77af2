"""The results store: one JSON line per finished run in ``<results_dir>/runs.jsonl``.

Appends are atomic and serialised: each record is written with a single ``write`` on a file opened
with O_APPEND while an exclusive ``flock`` is held, then fsync'ed, so a crash never leaves half a
line and two processes on the same directory never interleave or duplicate a run. Reading tolerates
a corrupt or truncated line: it is reported with its line number and the rest is still read.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FwbenchError

RECORDS_FILE = "runs.jsonl"
LOCK_FILE = "runs.lock"


@dataclass
class LoadedRecords:
    """Records read from a store, with a message for each line that could not be parsed."""

    records: list[dict]
    problems: list[str] = field(default_factory=list)


class ResultsStore:
    """Append-only JSONL store of run records, keyed by ``run_id`` (``records_file`` in ``directory``;
    ``fwbench bench`` keeps its records in ``bench.jsonl`` beside the runs).

    Raises:
        FwbenchError: the directory cannot be created or written.
    """

    def __init__(self, directory: str | Path, records_file: str = RECORDS_FILE):
        self.directory = Path(directory)
        self.path = self.directory / records_file
        # one lock per records file: runs.jsonl → runs.lock (as before), bench.jsonl → bench.lock
        lock = LOCK_FILE if records_file == RECORDS_FILE else f"{Path(records_file).stem}.lock"
        self.lock_path = self.directory / lock

    def _ensure_writable(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FwbenchError(f"--results-dir: cannot create {str(self.directory)!r}: {exc.strerror}") from None
        if not os.access(self.directory, os.W_OK):
            raise FwbenchError(f"--results-dir: {str(self.directory)!r} is not writable; choose a writable directory")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._ensure_writable()
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def load(self) -> LoadedRecords:
        """Every parseable record in file order; a later record with the same run_id wins."""
        if not self.path.exists():
            return LoadedRecords([])
        records: dict[str, dict] = {}
        problems = []
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                text = raw.decode("utf-8", errors="replace").strip()
                if not text:
                    continue
                try:
                    record = json.loads(text)
                    run_id = record["run_id"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    problems.append(f"{self.path}:{number}: corrupt or truncated record skipped")
                    continue
                records[run_id] = record
        return LoadedRecords(list(records.values()), problems)

    def records(self) -> list[dict]:
        return self.load().records

    def finished_ids(self) -> set[str]:
        """Run ids that already have a record (and so are never run again)."""
        return {r["run_id"] for r in self.records()}

    def append(self, record: dict) -> bool:
        """Append ``record`` unless its run_id is already stored. Returns whether it was written."""
        line = (json.dumps(record, sort_keys=True, allow_nan=True) + "\n").encode()
        with self._locked():
            if record["run_id"] in self.finished_ids():
                return False
            self._repair_tail()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        return True

    def _repair_tail(self) -> None:
        """End a truncated last line (from a crash in another tool) so the next record starts clean."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
