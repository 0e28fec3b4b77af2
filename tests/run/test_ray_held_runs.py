"""Runs that another process holds when a grid starts (the store's claim on a run it is training) are
waited for and, where their holder lets go without a record, run by this driver, with every launcher.

With ``--launcher ray`` or ``--jobs N`` they were counted as stored ("N already in runs.jsonl") and run
by no one when the holder died or let go without storing them; the serial launcher waited for them.
One Ray instance for the file, started in a private temporary directory and stopped at its end.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import tiny_retrieval_grid

from fwbench.run.grid import expand, load_grid
from fwbench.run.launchers import LaunchOptions
from fwbench.run.runner import run_grid
from fwbench.run.store import ResultsStore

ROOT = Path(__file__).resolve().parents[2]

#: Holds one run's claim as the runner does (ResultsStore.claim, from another process: claims of one
#: process never conflict) until a line arrives on stdin; with "store", appends its record first.
HOLDER = """
import sys
from fwbench.run.store import ResultsStore

store = ResultsStore(sys.argv[1])
with store.claim(sys.argv[2]):
    print("held", flush=True)
    line = sys.stdin.readline().strip()
    if line in ("store", "store failed"):
        store.append({"run_id": sys.argv[2], "status": "failed" if line == "store failed" else "ok",
                      "stored_by": "holder"})
"""


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance (1 CPU) for the file's Ray cases; launch_ray uses it and leaves it running."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'fwbench[ray]'")
    temp_dir = tempfile.mkdtemp(prefix="ray-held-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def options_for(launcher: str, request) -> LaunchOptions:
    if launcher == "ray":
        request.getfixturevalue("ray_instance")
        return LaunchOptions(launcher="ray", device="cpu")
    return LaunchOptions(device="cpu", jobs=2 if launcher == "jobs" else 1)


@pytest.mark.parametrize("holder_ends", ["dies", "stores"])
@pytest.mark.parametrize("launcher", ["serial", "jobs", "ray"])
def test_a_run_held_elsewhere_is_waited_for_and_run_here_unless_its_holder_stored_it(
        launcher, holder_ends, tmp_path, request):
    options = options_for(launcher, request)
    (tmp_path / "g.toml").write_text(tiny_retrieval_grid("held", slow_max_steps=20))
    specs = expand(load_grid(tmp_path / "g.toml"), "quick")[:3]
    held, others = specs[0].run_id, {spec.run_id for spec in specs[1:]}
    store = ResultsStore(tmp_path / "r")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.directory), held], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    watching = True

    def end_the_hold_once_the_others_are_stored() -> None:
        # the hold outlasts this driver's own runs: the old code then returned, the held run unrun
        deadline = time.monotonic() + 300
        while watching and time.monotonic() < deadline and not others <= ResultsStore(store.directory).finished_ids():
            time.sleep(0.1)
        if holder_ends == "dies":
            holder.send_signal(signal.SIGKILL)  # the kernel drops its claim; no record
        else:
            holder.stdin.write("store\n")
            holder.stdin.flush()

    watcher = threading.Thread(target=end_the_hold_once_the_others_are_stored, daemon=True)
    watcher.start()
    try:
        summary = run_grid(specs, store, options, quiet=True)
    finally:
        watching = False
        watcher.join()
        holder.communicate()
    records = {record["run_id"]: record for record in ResultsStore(store.directory).records()}
    assert set(records) == {spec.run_id for spec in specs}
    assert all(record["status"] != "failed" for record in records.values())
    if holder_ends == "dies":
        assert "stored_by" not in records[held] and records[held]["steps"] > 0  # trained by this driver
        assert summary == {"total": 3, "skipped": 0, "ran": 3, "discarded": 0, "diverged": 0, "failed": 0}
    else:
        assert records[held]["stored_by"] == "holder"  # waited for, not trained again
        assert summary == {"total": 3, "skipped": 1, "ran": 2, "discarded": 0, "diverged": 0, "failed": 0}


def test_a_run_held_elsewhere_is_trained_by_a_torchrun_group_once_its_holder_dies(tmp_path):
    """Under torchrun the held run was skipped ("rerun the command once it is done"): the group exited with it
    unrun when its holder died later. Rank 0 now polls the claim, and the group trains the run."""
    import os

    (tmp_path / "g.toml").write_text(tiny_retrieval_grid("held", slow_max_steps=20))
    specs = expand(load_grid(tmp_path / "g.toml"), "quick")
    held, others = specs[0].run_id, {spec.run_id for spec in specs[1:]}
    results = tmp_path / "r"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(results), held], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    group = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "fwbench", "run",
         str(tmp_path / "g.toml"), "--results-dir", str(results), "--quiet", "--device", "cpu"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while group.poll() is None and time.monotonic() < deadline and not others <= ResultsStore(results).finished_ids():
            time.sleep(0.2)
        holder.send_signal(signal.SIGKILL)  # after the group's own runs: its claim dropped, no record
        out, err = group.communicate(timeout=300)
    finally:
        holder.kill()
        holder.communicate()
        if group.poll() is None:
            group.kill()
    assert group.returncode == 0, err[-3000:]
    records = {record["run_id"]: record for record in ResultsStore(results).records()}
    assert set(records) == {spec.run_id for spec in specs}
    assert records[held]["distributed"]["world_size"] == 2
    assert f"{len(specs)} trained now, 0 already" in out


class StoredByAnotherAfterTheRead(ResultsStore):
    """A store on which another process stores ``run_id`` (with ``status``) and lets go of it between this
    driver's read of the store and its claim of the run: the record appears as the claim is asked for."""

    def __init__(self, directory, run_id: str, status: str):
        super().__init__(directory)
        self.pending = {"run_id": run_id, "status": status, "stored_by": "another"}

    def claim(self, run_id, wait=True):
        if self.pending and run_id == self.pending["run_id"]:
            ResultsStore(self.directory).append(self.pending)
            self.pending = None
        return super().claim(run_id, wait)


@pytest.mark.parametrize("status", ["ok", "failed"])
@pytest.mark.parametrize("launcher", ["serial", "jobs"])
def test_a_run_stored_elsewhere_after_the_read_is_not_trained_again(launcher, status, tmp_path, request):
    """--jobs N (and Ray) launched every run it claimed without looking at the store again: a run another process
    stored and let go of after this driver read the store was trained twice and counted as trained here
    ({'skipped': 0, 'ran': 3}). A failed record so stored is that process's try in this sweep, not one to repeat
    (every launcher retried it at once, its failure unreported)."""
    (tmp_path / "g.toml").write_text(tiny_retrieval_grid("after", slow_max_steps=20))
    specs = expand(load_grid(tmp_path / "g.toml"), "quick")[:3]
    store = StoredByAnotherAfterTheRead(tmp_path / "r", specs[1].run_id, status)
    summary = run_grid(specs, store, options_for(launcher, request), quiet=True, pack=False)
    records = ResultsStore(store.directory).records()
    assert [record.get("stored_by") for record in records if record["run_id"] == specs[1].run_id] == ["another"]
    assert len(records) == 3
    assert summary == {"total": 3, "skipped": 1, "ran": 2, "discarded": 0, "diverged": 0, "failed": 0}


@pytest.mark.parametrize("launcher", ["serial", "jobs"])
def test_a_held_run_its_holder_stored_as_failed_is_not_trained_again(launcher, tmp_path, request):
    """The holder's failed record of a held run was read as no record: the run was trained a second time here, in
    the same sweep ({'ran': 3}, two records of it), and the holder's failure went unreported."""
    options = options_for(launcher, request)
    (tmp_path / "g.toml").write_text(tiny_retrieval_grid("held", slow_max_steps=20))
    specs = expand(load_grid(tmp_path / "g.toml"), "quick")[:3]
    held, others = specs[0].run_id, {spec.run_id for spec in specs[1:]}
    store = ResultsStore(tmp_path / "r")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.directory), held], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"

    def store_failed_once_the_others_are_stored() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not others <= ResultsStore(store.directory).finished_ids():
            time.sleep(0.1)
        holder.stdin.write("store failed\n")
        holder.stdin.flush()

    watcher = threading.Thread(target=store_failed_once_the_others_are_stored, daemon=True)
    watcher.start()
    try:
        summary = run_grid(specs, store, options, quiet=True)
    finally:
        watcher.join()
        holder.communicate()
    records = ResultsStore(store.directory).records()
    assert [(record["status"], record.get("stored_by")) for record in records if record["run_id"] == held] == [
        ("failed", "holder")]
    assert summary == {"total": 3, "skipped": 1, "ran": 2, "discarded": 0, "diverged": 0, "failed": 0}


def test_a_torchrun_group_does_not_train_again_a_run_another_process_stored_as_failed(tmp_path, monkeypatch):
    """run_grid_distributed read a failed record that another process stored after the group's read as no record,
    and trained that run again (one rank, the broadcast its identity, stands for the group)."""
    from fwbench.run import runner
    from fwbench.run.distributed import DistributedContext

    class Alone(DistributedContext):
        def broadcast(self, value):
            return value

    trained = []

    def fake_execute(spec, *args, **kwargs):
        trained.append(spec.run_id)
        return {"run_id": spec.run_id, "status": "ok"}

    monkeypatch.setattr(runner, "execute", fake_execute)
    (tmp_path / "g.toml").write_text(tiny_retrieval_grid("group", slow_max_steps=20))
    specs = expand(load_grid(tmp_path / "g.toml"), "quick")[:3]
    store = StoredByAnotherAfterTheRead(tmp_path / "r", specs[1].run_id, "failed")
    summary = runner.run_grid_distributed(specs, store, Alone(0, 0, 1, "gloo"), device=None, quiet=True)
    assert trained == [specs[0].run_id, specs[2].run_id]
    assert summary == {"total": 3, "skipped": 1, "ran": 2, "discarded": 0, "diverged": 0, "failed": 0}


@pytest.mark.parametrize("status", ["failed", "ok"])
@pytest.mark.parametrize("launcher", ["serial", "jobs", "ray", "torchrun"])
def test_a_run_failed_before_the_read_and_stored_again_elsewhere_since_is_not_trained_again(
        launcher, status, tmp_path, request, monkeypatch):
    """A run with a failed record from before this driver's read, tried again by another process since: the store's
    records keep one record per run id (the last), so counting them read two records of it as one, as at the read,
    and the run was trained a third time in this sweep ({'skipped': 0, 'ran': 3}, three lines of it)."""
    from fwbench.run import runner
    from fwbench.run.distributed import DistributedContext

    (tmp_path / "g.toml").write_text(tiny_retrieval_grid("again", slow_max_steps=20))
    specs = expand(load_grid(tmp_path / "g.toml"), "quick")[:3]
    retried = specs[1].run_id
    ResultsStore(tmp_path / "r").append({"run_id": retried, "status": "failed", "stored_by": "an earlier command"})
    store = StoredByAnotherAfterTheRead(tmp_path / "r", retried, status)
    if launcher == "torchrun":
        class Alone(DistributedContext):
            def broadcast(self, value):
                return value

        def fake_execute(spec, *args, **kwargs):
            return {"run_id": spec.run_id, "status": "ok"}

        monkeypatch.setattr(runner, "execute", fake_execute)
        summary = runner.run_grid_distributed(specs, store, Alone(0, 0, 1, "gloo"), device=None, quiet=True)
    else:
        summary = run_grid(specs, store, options_for(launcher, request), quiet=True, pack=False)
    lines = [json.loads(line) for line in (store.path).read_text().splitlines()]
    assert [line.get("stored_by") for line in lines if line["run_id"] == retried] == ["an earlier command", "another"]
    assert len(lines) == 4
    assert summary == {"total": 3, "skipped": 1, "ran": 2, "discarded": 0, "diverged": 0, "failed": 0}
