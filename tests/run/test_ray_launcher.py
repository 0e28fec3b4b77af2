"""The Ray launcher gives the same records as the local one, and resumes like it (issue 7).

Needs Ray (`pip install 'fwbench[ray]'`); skipped without it, since the default install does not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from helpers import comparable_records, tiny_retrieval_grid

from fwbench.cli import main
from fwbench.run.store import ResultsStore

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'fwbench[ray]'")

GRID = tiny_retrieval_grid("ray-tiny", slow_max_steps=400)


@pytest.mark.slow
def test_ray_launcher_gives_the_same_records_as_local(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["run", str(grid), "--results-dir", str(local), "--quiet"]) == 0
    assert main(["run", str(grid), "--results-dir", str(remote), "--quiet", "--launcher", "ray",
                 "--ray-num-cpus", "2"]) == 0
    local_records, ray_records = ResultsStore(local).records(), ResultsStore(remote).records()
    assert len(ray_records) == 6
    assert comparable_records(ray_records) == comparable_records(local_records)
    # the command line recorded is the driver's (here pytest's, as in the local records), not the Ray worker's
    assert {tuple(r["environment"]["argv"]) for r in ray_records} == {tuple(local_records[0]["environment"]["argv"])}


def test_a_ray_record_names_the_drivers_command_line_not_the_workers(tmp_path, monkeypatch):
    from fwbench.run.launchers import with_driver_argv

    monkeypatch.chdir(tmp_path)
    worker = {"run_id": "x", "environment": {"argv": ["--node-ip-address=192.0.2.2", "--raylet-name=/tmp/ray/s"]}}
    record = with_driver_argv(worker, ["run", "capacity", f"--results-dir={tmp_path / 'r'}", "--launcher", "ray"])
    assert record["environment"]["argv"] == ["run", "capacity", "--results-dir=r", "--launcher", "ray"]
    failed = {"run_id": "y", "status": "failed", "error": "boom"}
    assert with_driver_argv(dict(failed), ["run"]) == failed  # no environment: nothing to set


def _kill_ray_processes_of(temp_dir: str) -> None:
    """SIGKILL the processes of the Ray instance kept in ``temp_dir`` and wait (10 s at most) until they are gone,
    not every Ray process of the machine as ``ray stop --force`` would: another user's instance, or a test run
    beside this one, is left alone. Its GCS and raylet name their session directory there; its workers do not
    (Ray sets their title to ``ray::<task>``, which replaces their command line) but were given
    ``RAY_TMPDIR=temp_dir`` by the driver that started them, which is how they are found."""
    psutil = pytest.importorskip("psutil")
    ours = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        try:
            named = any(re.search(f"{re.escape(temp_dir)}(/|$)", part) for part in process.info["cmdline"] or ())
            if named or (process.info["environ"] or {}).get("RAY_TMPDIR") == temp_dir:
                process.kill()
                ours.append(process)
        except psutil.Error:  # gone already, or not ours to read
            pass
    psutil.wait_procs(ours, timeout=10)


#: A driver whose two tasks each hold a worker of the instance (its RAY_TMPDIR's) until killed.
SLEEPING_DRIVER = """
import time, ray
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
refs = [ray.remote(lambda: time.sleep(600)).remote() for _ in range(2)]
print("submitted", flush=True)
ray.get(refs)
"""


@pytest.mark.slow
def test_the_processes_of_a_killed_drivers_ray_instance_are_killed_and_no_one_elses():
    """_kill_ray_processes_of killed the processes whose command line names the instance's directory: its workers,
    titled ray::<task> (Ray overwrites their command line), were left running a task of the killed driver beside the
    next one (they quit by themselves only later, once they noticed their raylet gone)."""
    psutil = pytest.importorskip("psutil")
    temp_dir = tempfile.mkdtemp(prefix="fwray-", dir="/tmp")
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    # a process of another instance in a directory whose name begins with this one's, and one with another RAY_TMPDIR
    others = [subprocess.Popen([*sleep, f"{temp_dir}x/session"]),
              subprocess.Popen(sleep, env={**os.environ, "RAY_TMPDIR": f"{temp_dir}x"})]
    driver = subprocess.Popen([sys.executable, "-c", SLEEPING_DRIVER], start_new_session=True, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "RAY_TMPDIR": temp_dir})

    def instance() -> list[str]:
        alive = []
        for process in psutil.process_iter(["cmdline", "environ", "status"]):
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(process.info["cmdline"] or ())
            if f"{temp_dir}/" in command or (process.info["environ"] or {}).get("RAY_TMPDIR") == temp_dir:
                alive.append(command)
        return alive

    try:
        assert driver.stdout.readline().strip() == "submitted"
        deadline = time.monotonic() + 60
        while sum(command.startswith("ray::") for command in instance()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the two tasks' workers started
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        _kill_ray_processes_of(temp_dir)
        assert instance() == []
        assert all(other.poll() is None for other in others)
    finally:
        _kill_ray_processes_of(temp_dir)
        for other in others:
            other.kill()
            other.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_killed_ray_driver_resumes_only_the_missing_runs(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    results = tmp_path / "results"
    command = [sys.executable, "-m", "fwbench", "run", str(grid), "--profile", "slow", "--results-dir",
               str(results), "--quiet", "--launcher", "ray", "--ray-num-cpus", "2"]
    # the instance in a directory of its own, so that only its processes are killed; short, as Ray's sockets
    # live there (a Unix socket path holds at most 107 bytes)
    temp_dir = tempfile.mkdtemp(prefix="fwray-", dir="/tmp")
    environment = {**os.environ, "RAY_TMPDIR": temp_dir}
    driver = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=environment)
    store = ResultsStore(results)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(store.records()) < 2:
        time.sleep(0.5)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    _kill_ray_processes_of(temp_dir)  # the workers of the killed driver
    before = {r["run_id"] for r in store.records()}
    assert 2 <= len(before) < 12, "the driver should have been killed midway"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    finally:
        _kill_ray_processes_of(temp_dir)  # none where the driver ended well; a timed-out one's instance
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert f"{12 - len(before)} trained now, {len(before)} already" in done.stdout
    after = store.records()
    assert len(after) == 12 and len({r["run_id"] for r in after}) == 12


def test_a_run_larger_than_the_local_ray_instance_is_refused_before_ray_starts(tmp_path, capsys):
    """--ray-num-cpus 1 --cpus-per-run 2 hung silently for ever (Ray keeps an infeasible task pending)."""
    from fwbench.errors import FwbenchError
    from fwbench.run.launchers import LaunchOptions, check_fits_local_ray, check_ray_resources

    with pytest.raises(FwbenchError, match=r"^--cpus-per-run: got 2; expected at most 1, the CPUs of the local Ray"):
        check_ray_resources(LaunchOptions(launcher="ray", cpus_per_run=2.0, ray_num_cpus=1))
    check_ray_resources(LaunchOptions(launcher="ray", cpus_per_run=1.0, gpus_per_run=1.0, ray_num_cpus=1))  # GPUs unknown yet
    # a cluster may grow: no size is checked (--ray-num-cpus, which Ray does not apply there, is refused with an
    # address: tests/run/test_ray_local_address.py)
    check_ray_resources(LaunchOptions(launcher="ray", cpus_per_run=2.0, ray_address="auto"))
    with pytest.raises(FwbenchError, match=r"^--cpus-per-run: got 2; expected at most 1, the CPUs of the local Ray"):
        check_ray_resources(LaunchOptions(launcher="ray", cpus_per_run=2.0, ray_num_cpus=1, ray_address="local"))
    with pytest.raises(FwbenchError, match=r"^--gpus-per-run: got 0\.5; expected at most 0, the GPUs"):
        check_fits_local_ray(LaunchOptions(launcher="ray", gpus_per_run=0.5), {"CPU": 2.0, "GPU": 0.0})
    check_fits_local_ray(LaunchOptions(launcher="ray", cpus_per_run=2.0, gpus_per_run=0.5), {"CPU": 2.0, "GPU": 1.0})


@pytest.mark.slow
def test_a_run_larger_than_the_started_ray_instance_is_refused_once_it_started(tmp_path, capsys):
    """Without --ray-num-cpus the instance's size is known only once Ray runs: refused then, not a hang."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    status = main(["run", str(grid), "--results-dir", str(tmp_path / "r"), "--quiet", "--launcher", "ray",
                   "--cpus-per-run", "100000"])
    assert status == 2
    assert "--cpus-per-run: got 100000; expected at most" in capsys.readouterr().err
    assert not ray.is_initialized()


def test_a_local_ray_instance_that_fails_to_start_is_not_blamed_on_an_address(tmp_path, capsys, monkeypatch):
    """With no address given, a ConnectionError from starting the local instance was reported as
    "$RAY_ADDRESS: got None; expected a Ray cluster address", an address nobody gave."""
    def refuse(**_):
        raise ConnectionError("raylet failed to start")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", refuse)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    status = main(["run", str(grid), "--results-dir", str(tmp_path / "r"), "--quiet", "--launcher", "ray"])
    assert status == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "fwbench: error: --launcher ray: could not start a local Ray instance (Ray: raylet failed to start)")
