"""Settings reach the workers of a Ray cluster started beforehand (issue 14 item 7).

``ray start --head`` in an environment without ``FWBENCH_DATA_DIR``, then ``fwbench run GRID
--launcher ray --ray-address ... --data-dir DIR``: the Shakespeare run must find its corpus, so the
data directory (and every other run setting) has to travel with the task, not in the driver's
environment. Needs Ray and the real corpus (``FWBENCH_DATA_DIR``; CI sets it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from fwbench.run.environment import RUN_SETTINGS_ENV
from fwbench.run.store import ResultsStore
from fwbench.tasks.corpus import CACHE_DIR_ENV, DATA_DIR_ENV

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'fwbench[ray]'")
psutil = pytest.importorskip("psutil", reason="in the dev extra (pip install -e '.[dev]'); stops only this test's cluster")

REAL_DATA_DIR = os.environ.get(DATA_DIR_ENV)
#: A throw-away cluster on this machine, for the test only: no token to share between it and the driver.
UNAUTHENTICATED = {"RAY_AUTH_MODE": "disabled"}

GRID = """
name = "ray-settings"
task = "shakespeare"

[profiles.quick]
variant = "linear"
seed = 1
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 32
context = 16
batch_size = 4
max_steps = 4
eval_every = 2
eval_segments = 2
stream_eval = false
sample_tokens = 5
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_cluster(temp_dir: str) -> None:
    """Kill the processes of the cluster whose session lives in ``temp_dir``, and only those
    (``ray stop`` would stop every Ray instance of this machine, other users' included)."""
    mine = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if process.pid != os.getpid() and temp_dir in " ".join(process.info["cmdline"] or []):
                mine.append(process)
        except (psutil.Error, TypeError):
            continue
    for process in mine:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(mine, timeout=10)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass


@contextlib.contextmanager
def started_cluster(tmp_path, settings: dict[str, str] | None = None, temp_parent: str | None = None):
    """A one-CPU Ray head started by ``ray start``, with no fwbench settings in its environment but
    ``settings``, and an empty corpus cache; yields its address and stops only its own processes.
    ``temp_parent``: its session lives in ``temp_parent/ray``, where a driver whose ``TMPDIR`` is
    ``temp_parent`` finds it as Ray finds an instance ``ray start`` left on the machine (/tmp/ray)."""
    port = free_port()
    # short: Ray's socket paths have a length limit
    temp_dir = tempfile.mkdtemp(prefix="fwray", dir="/tmp") if temp_parent is None else os.path.join(temp_parent, "ray")
    env = {k: v for k, v in os.environ.items() if k not in RUN_SETTINGS_ENV and not k.startswith("RAY_")}
    env[CACHE_DIR_ENV] = str(tmp_path / "cluster-cache")
    env.update(UNAUTHENTICATED, **(settings or {}))
    started = subprocess.run(
        ["ray", "start", "--head", "--num-cpus", "1", "--include-dashboard=false", "--port", str(port),
         "--node-ip-address", "127.0.0.1", "--temp-dir", temp_dir, "--disable-usage-stats"],
        env=env, capture_output=True, text=True, timeout=180,
    )
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        stop_cluster(temp_dir)
        time.sleep(1)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def separate_cluster(tmp_path):
    """A one-CPU Ray head started by ``ray start``, with no fwbench settings in its environment and an
    empty corpus cache, so its workers can only find the corpus through what the driver sends."""
    with started_cluster(tmp_path) as address:
        yield address


@pytest.mark.slow
def test_data_dir_reaches_the_workers_of_a_separately_started_cluster(tmp_path, separate_cluster):
    if not REAL_DATA_DIR:
        pytest.skip(f"needs the real corpus ({DATA_DIR_ENV} is unset; CI sets it)")
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    driver_env = {k: v for k, v in os.environ.items() if k not in RUN_SETTINGS_ENV and not k.startswith("RAY_")}
    driver_env[CACHE_DIR_ENV] = str(tmp_path / "driver-cache")  # empty: the corpus is only in --data-dir
    driver_env.update(UNAUTHENTICATED)
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "fwbench", "run", str(grid), "--results-dir", "results", "--quiet",
         "--launcher", "ray", "--ray-address", separate_cluster, "--data-dir", REAL_DATA_DIR],
        env=driver_env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record, = ResultsStore(results).records()
    assert record["status"] == "max_steps", record.get("error")
    assert record["steps"] == 4 and record["metrics"]["val_bpc"] > 0


RETRIEVAL_GRID = """
name = "ray-switches"
task = "retrieval"

[profiles.quick]
variant = "linear"
seed = 1
S = 4
d_key = 8
batch_size = 4
max_steps = 2
eval_every = 2
eval_sequences = 2
"""


def drive(tmp_path, grid_text: str, address: str, settings: dict[str, str]) -> dict:
    """``fwbench run`` of ``grid_text`` on the cluster at ``address`` from a driver in ``tmp_path`` whose
    environment holds no fwbench settings but ``settings``; returns the one record it stored."""
    grid = tmp_path / "grid.toml"
    grid.write_text(grid_text)
    driver_env = {k: v for k, v in os.environ.items() if k not in RUN_SETTINGS_ENV and not k.startswith("RAY_")}
    driver_env.update(UNAUTHENTICATED, **settings)
    done = subprocess.run(
        [sys.executable, "-m", "fwbench", "run", str(grid), "--results-dir", "results", "--quiet",
         "--launcher", "ray", "--ray-address", address],
        env=driver_env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record, = ResultsStore(tmp_path / "results").records()
    assert record["status"] == "max_steps", record.get("error")
    return record


@pytest.mark.slow
def test_a_switch_the_driver_leaves_unset_is_unset_on_the_workers_too(tmp_path):
    """A cluster started with ``FWBENCH_MALLOC_TUNING=0`` in its environment, a driver without it (the
    default: on): the workers kept the cluster's 0, so the run trained untuned and its record said
    ``malloc_tuning: false``, though the command asked for the default. A switch travels unset too."""
    import platform

    from fwbench.run.allocator import TUNING_ENV

    with started_cluster(tmp_path, {TUNING_ENV: "0"}) as address:
        record = drive(tmp_path, RETRIEVAL_GRID, address, {})
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert record["environment"]["malloc_tuning"] is glibc


@pytest.mark.slow
def test_a_relative_data_dir_in_the_environment_reaches_the_workers_as_the_driver_meant_it(tmp_path):
    """``FWBENCH_DATA_DIR=data fwbench run … --launcher ray --ray-address …`` (no --data-dir, which is
    made absolute): the variable travelled as the word ``data`` and a worker of a cluster started in
    another directory looked for the corpus there, failing every run. Paths travel absolute."""
    if not REAL_DATA_DIR:
        pytest.skip(f"needs the real corpus ({DATA_DIR_ENV} is unset; CI sets it)")
    (tmp_path / "data").symlink_to(os.path.abspath(REAL_DATA_DIR))
    with started_cluster(tmp_path) as address:
        record = drive(tmp_path, GRID, address, {DATA_DIR_ENV: "data", CACHE_DIR_ENV: "driver-cache"})
    assert record["steps"] == 4


# RETRIEVAL_GRID's run, with a variant that only a module on the driver's PYTHONPATH registers
MODULE_GRID = RETRIEVAL_GRID.replace('task = "retrieval"', 'task = "retrieval"\nvariant_modules = ["ray_path_variants"]') \
    .replace('variant = "linear"', 'variant = "halved-relu"')

MODULE = '''
import torch
from fwbench.variants import FeatureMap, register_feature_map


class HalvedReLU(FeatureMap):
    """phi(x) = relu(x) / 2: (B, H, T, d_key) -> (B, H, T, d_key)."""

    @classmethod
    def output_size(cls, d_key):
        return d_key

    @property
    def d_dot(self):
        return self.d_key

    def forward(self, x):
        return torch.relu(x) / 2


register_feature_map("halved-relu", HalvedReLU, description="relu / 2", source="test")
'''


@pytest.mark.slow
def test_a_variant_module_on_the_drivers_python_path_is_found_on_the_workers(tmp_path):
    """``PYTHONPATH=pkgs fwbench run GRID --launcher ray --ray-address …`` with a grid naming the module
    ``ray_path_variants`` found there: the driver imported it, but the workers of a cluster started
    elsewhere had no such path, and every run failed ("No module named 'ray_path_variants'")."""
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "ray_path_variants.py").write_text(MODULE)
    path = os.pathsep.join(["pkgs", *filter(None, [os.environ.get("PYTHONPATH")])])
    with started_cluster(tmp_path) as address:
        record = drive(tmp_path, MODULE_GRID, address, {"PYTHONPATH": path})
    assert record["variant"]["spec"] == "halved-relu" and record["steps"] == 2


@pytest.mark.slow
def test_without_an_address_the_command_starts_its_own_instance_beside_a_running_one(tmp_path):
    """README: without --ray-address or RAY_ADDRESS, a local Ray instance is started for the command.
    A bare ray.init() joined the instance `ray start` had left on this machine instead: with
    ``--ray-num-cpus 1`` the command failed ('When connecting to an existing cluster, num_cpus and num_gpus
    must not be provided', exit 2), and without it the runs went to that cluster."""
    grid = tmp_path / "grid.toml"
    grid.write_text(RETRIEVAL_GRID)
    driver_env = {k: v for k, v in os.environ.items() if k not in RUN_SETTINGS_ENV and not k.startswith("RAY_")}
    temp_parent = tempfile.mkdtemp(prefix="fwtmp", dir="/tmp")
    driver_env.update(UNAUTHENTICATED, TMPDIR=temp_parent)  # the running instance is this machine's, for Ray
    with started_cluster(tmp_path, temp_parent=temp_parent):
        done = subprocess.run(
            [sys.executable, "-m", "fwbench", "run", str(grid), "--results-dir", "results", "--quiet",
             "--launcher", "ray", "--ray-num-cpus", "1"],
            env=driver_env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )
    shutil.rmtree(temp_parent, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Started a local Ray instance" in done.stderr and "existing Ray cluster" not in done.stderr
    record, = ResultsStore(tmp_path / "results").records()
    assert record["status"] == "max_steps", record.get("error")
