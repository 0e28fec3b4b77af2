"""The local launcher's worker processes (``fwbench run … --jobs N``, issue 16 item 3): the same
records as one process, the store still written by the parent alone, and a parent killed with
``kill -9`` resumes with no lost and no duplicated record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import comparable_records, tiny_retrieval_grid

from fwbench.cli import main
from fwbench.run.grid import RunSpec
from fwbench.run.launchers import LaunchOptions, launch_local_jobs
from fwbench.run.store import ResultsStore

GRID = tiny_retrieval_grid("jobs-tiny", slow_max_steps=300)


@pytest.mark.slow
def test_two_jobs_give_the_same_records_as_one_process(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["run", str(grid), "--results-dir", str(one), "--quiet"]) == 0
    assert main(["run", str(grid), "--results-dir", str(two), "--quiet", "--jobs", "2"]) == 0
    records = ResultsStore(two).records()
    assert len(records) == 6
    assert comparable_records(records) == comparable_records(ResultsStore(one).records())


@pytest.mark.slow
def test_more_jobs_than_a_pool_can_size_run_on_one_worker_per_run():
    """--jobs 2**31: the process pool's call queue (its workers + 1 slots) raised an OverflowError
    traceback; the launcher starts no more workers than runs."""
    spec = RunSpec(grid="g", task="retrieval", variant="linear", seed=1,
                   config={"setting": 1, "S": 4, "batch_size": 4, "d_key": 8, "max_steps": 2, "eval_every": 2,
                           "eval_sequences": 4})
    record, = launch_local_jobs([spec], LaunchOptions(jobs=2**31))
    assert record["status"] != "failed" and record["steps"] == 2
    assert list(launch_local_jobs([], LaunchOptions(jobs=2**31))) == []


@pytest.mark.slow
def test_a_run_that_raises_in_a_worker_is_a_failed_record_and_the_others_finish(tmp_path):
    good = RunSpec(grid="g", task="retrieval", variant="linear", seed=1,
                   config={"setting": 1, "S": 4, "batch_size": 8, "d_key": 8, "max_steps": 3, "eval_every": 3,
                           "eval_sequences": 4})
    bad = RunSpec(grid="g", task="no-such-task", variant="linear", seed=1, config={})
    records = list(launch_local_jobs([bad, good], LaunchOptions(jobs=2, device="cpu")))
    by_id = {r["run_id"]: r for r in records}
    assert by_id[bad.run_id]["status"] == "failed" and "no-such-task" in by_id[bad.run_id]["error"]
    assert by_id[good.run_id]["status"] != "failed" and by_id[good.run_id]["steps"] == 3


@pytest.mark.slow
def test_killed_parent_of_two_jobs_resumes_with_no_lost_or_duplicated_record(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    results = tmp_path / "results"
    command = [sys.executable, "-m", "fwbench", "run", str(grid), "--profile", "slow", "--results-dir",
               str(results), "--quiet", "--jobs", "2"]
    parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = ResultsStore(results)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(store.records()) < 2 and parent.poll() is None:
        time.sleep(0.2)
    os.kill(parent.pid, signal.SIGKILL)  # the parent only: its workers must end with it
    parent.wait()
    before = {r["run_id"] for r in store.records()}
    assert 2 <= len(before) < 12, "the parent should have been killed midway"
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{12 - len(before)} trained now, {len(before)} already" in done.stdout
    after = store.records()
    assert len(after) == 12 and len({r["run_id"] for r in after}) == 12
    assert before <= {r["run_id"] for r in after}
