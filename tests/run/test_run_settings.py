"""The settings a run takes from the command line and the environment travel with it to another
process (issue 14 item 7; the end-to-end test against a separately started Ray cluster is
``test_ray_cluster.py``)."""

from __future__ import annotations

import pytest

from fwbench.errors import FwbenchError
from fwbench.run.environment import RUN_SETTINGS_ENV, apply_run_settings, run_settings
from fwbench.run.launchers import execute_in_worker
from fwbench.tasks.corpus import CACHE_DIR_ENV, DATA_DIR_ENV


def test_the_settings_set_here_are_applied_in_a_worker(monkeypatch, tmp_path):
    for name in RUN_SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    settings = run_settings()
    assert settings == {DATA_DIR_ENV: str(tmp_path / "data"), CACHE_DIR_ENV: str(tmp_path / "cache")}
    monkeypatch.delenv(DATA_DIR_ENV)  # a worker started elsewhere, without them
    monkeypatch.delenv(CACHE_DIR_ENV)
    apply_run_settings(settings)
    assert run_settings() == settings


def test_a_worker_applies_the_settings_before_the_run(monkeypatch, tmp_path):
    import os

    import fwbench.run.launchers as launchers

    seen = {}

    def execute(spec, device, checkpoint=None):  # what the run would read
        seen["data_dir"] = os.environ.get(DATA_DIR_ENV)
        return {"run_id": "x"}

    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(launchers, "execute", execute)
    execute_in_worker(None, "cpu", 1, None, {DATA_DIR_ENV: str(tmp_path)})
    assert seen == {"data_dir": str(tmp_path)}


def test_an_unknown_setting_is_refused_in_one_line():
    with pytest.raises(FwbenchError, match=r"^settings: got 'HOME'; expected names among FWBENCH_DATA_DIR, "):
        apply_run_settings({"HOME": "/"})


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["1", "0"])
def test_a_worker_process_tunes_the_allocator_as_the_command_does(monkeypatch, setting):
    """``fwbench run … --jobs 2`` (and Ray) trains in worker processes that never ran the command's
    start-up: their records said ``malloc_tuning: false`` and their runs trained untuned, while the
    same grid in one process recorded true. A worker applies the tuning as the command does, and
    leaves it off where ``FWBENCH_MALLOC_TUNING=0`` asks for that."""
    import platform

    from fwbench.run.grid import RunSpec
    from fwbench.run.launchers import LaunchOptions, launch_local_jobs

    monkeypatch.setenv("FWBENCH_MALLOC_TUNING", setting)  # a spawned worker inherits this environment
    spec = RunSpec(grid="g", task="retrieval", variant="linear", seed=1,
                   config={"setting": 1, "S": 4, "batch_size": 4, "d_key": 8, "max_steps": 1, "eval_every": 1,
                           "eval_sequences": 4})
    record, = launch_local_jobs([spec], LaunchOptions(jobs=2, device="cpu"))
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert record["status"] == "max_steps"
    assert record["environment"]["malloc_tuning"] is (glibc and setting == "1")


def test_a_switch_left_unset_here_is_removed_in_a_worker_and_the_directories_are_kept(monkeypatch, tmp_path):
    """A worker of a cluster started with FWBENCH_MALLOC_TUNING=0 and FWBENCH_FLA=0 in its environment,
    for a driver that sets neither (the defaults: on): the worker ran with both off."""
    import os

    from fwbench.run.environment import SWITCH_ENV

    for name in SWITCH_ENV:
        monkeypatch.setenv(name, "0")  # the worker's own environment
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    apply_run_settings({})
    assert [os.environ.get(name) for name in SWITCH_ENV] == [None, None]
    assert os.environ[DATA_DIR_ENV] == str(tmp_path)  # kept: a corpus found there is checked by its checksum
    apply_run_settings({SWITCH_ENV[0]: "0"})
    assert os.environ.get(SWITCH_ENV[0]) == "0"


def test_a_local_worker_process_keeps_the_environment_it_inherited(monkeypatch):
    """``--jobs``: the worker's environment is the launching process's; no settings, nothing removed."""
    import os

    import fwbench.run.launchers as launchers
    from fwbench.run.environment import SWITCH_ENV

    seen = {}
    monkeypatch.setattr(launchers, "execute", lambda spec, device, checkpoint=None: seen.update(
        {name: os.environ.get(name) for name in SWITCH_ENV}) or {"run_id": "x"})
    for name in SWITCH_ENV:
        monkeypatch.setenv(name, "0")
    execute_in_worker(None, "cpu", 1, None)
    assert seen == {name: "0" for name in SWITCH_ENV}


def test_directories_travel_as_absolute_paths(monkeypatch, tmp_path):
    """A relative FWBENCH_DATA_DIR (or FWBENCH_CACHE_DIR) means the launching process's working
    directory; a worker elsewhere resolved it against its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DATA_DIR_ENV, "data")
    monkeypatch.setenv(CACHE_DIR_ENV, "~/cache")
    settings = run_settings()
    assert settings[DATA_DIR_ENV] == str(tmp_path.resolve() / "data")
    assert settings[CACHE_DIR_ENV] == str((tmp_path.home() / "cache").resolve())


def test_a_cache_dir_with_a_tilde_is_the_one_a_worker_receives(monkeypatch, tmp_path):
    """This process read FWBENCH_CACHE_DIR=~/cache as ./~/cache, a Ray worker as ~/cache: two caches."""
    from fwbench.tasks.corpus import cache_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CACHE_DIR_ENV, "~/cache")
    assert cache_dir() == tmp_path.home() / "cache"
    assert str(cache_dir().resolve()) == run_settings()[CACHE_DIR_ENV]


def test_a_directory_of_a_user_that_does_not_exist_is_one_line_naming_the_variable(monkeypatch, tmp_path):
    """``~user`` naming no user: pathlib's "RuntimeError: Could not determine home directory." named
    neither the variable nor its value (every LM run failed with it; under Ray, a traceback)."""
    from fwbench.tasks.corpus import CorpusError, cache_dir, data_dir_candidates

    monkeypatch.setenv(CACHE_DIR_ENV, "~nosuchuser-fwbench/cache")
    expected = ("$FWBENCH_CACHE_DIR: got '~nosuchuser-fwbench/cache'; expected a directory path ('~nosuchuser-fwbench' "
                "names no user's home directory on this machine)")
    with pytest.raises(CorpusError) as raised:
        cache_dir()
    assert str(raised.value) == expected
    with pytest.raises(FwbenchError) as raised:
        run_settings()
    assert str(raised.value) == expected
    monkeypatch.setenv(DATA_DIR_ENV, "~nosuchuser-fwbench")
    with pytest.raises(CorpusError, match=r"^\$FWBENCH_DATA_DIR: got '~nosuchuser-fwbench'"):
        data_dir_candidates(None)
    with pytest.raises(CorpusError, match=r"^--data-dir: got '~nosuchuser-fwbench/x'"):
        data_dir_candidates("~nosuchuser-fwbench/x")


def test_a_ray_worker_gets_the_drivers_python_path_made_absolute(tmp_path):
    """``PYTHONPATH=pkgs`` on the driver, where a grid's ``variant_modules = ["my_pkg.attention"]`` is
    found: a worker of a cluster started elsewhere lacked it and failed every run ("No module named").
    Each entry travels absolute (an empty one is the driver's working directory, as for Python), ahead
    of the cluster's own."""
    import os

    from fwbench.run.launchers import ray_worker_env

    cwd = str(tmp_path)
    path = os.pathsep.join(["pkgs", "", "/abs/lib", "../up"])
    assert ray_worker_env(3, {"PYTHONPATH": path}, cwd) == {
        "OMP_NUM_THREADS": "3",
        "PYTHONPATH": os.pathsep.join([f"{cwd}/pkgs", cwd, "/abs/lib", str(tmp_path.parent / "up"), "${PYTHONPATH}"]),
    }
    assert ray_worker_env(1, {}, cwd) == ray_worker_env(1, {"PYTHONPATH": ""}, cwd) == {"OMP_NUM_THREADS": "1"}



def test_a_python_path_entry_through_a_link_and_up_is_the_directory_python_uses(tmp_path):
    """``PYTHONPATH=link/../pkg`` with ``link`` a symbolic link to ``elsewhere/dir``: the kernel would read it as
    ``elsewhere/pkg``, but Python (3.10 to 3.13) puts ``CWD/pkg`` on ``sys.path`` (its start-up makes each entry
    absolute lexically), and that is what the driver imports from; the Ray workers must be given the same
    directory, not the kernel's (resolving ``link/..`` for them would send them where the driver never looks)."""
    import os
    import subprocess
    import sys

    from fwbench.run.launchers import worker_python_path

    cwd, elsewhere = tmp_path / "cwd", tmp_path / "elsewhere"
    for directory in (cwd / "pkg", elsewhere / "dir", elsewhere / "pkg"):
        directory.mkdir(parents=True)
    (cwd / "link").symlink_to(elsewhere / "dir")
    for entry, python_reads in (("link/../pkg", cwd / "pkg"), ("./link/../pkg/", cwd / "pkg"), ("link", cwd / "link")):
        shown = subprocess.run([sys.executable, "-c", "import sys; print(sys.path[1])"], cwd=cwd, check=True,
                               env={**os.environ, "PYTHONPATH": entry}, capture_output=True, text=True).stdout.strip()
        assert shown == str(python_reads)  # Python's own reading, not the kernel's (elsewhere/pkg)
        assert worker_python_path({"PYTHONPATH": entry}, str(cwd)) == [(entry, shown)]


@pytest.mark.parametrize("name", [DATA_DIR_ENV, CACHE_DIR_ENV])
def test_a_directory_that_is_a_looping_link_is_sent_as_it_is_not_a_traceback(monkeypatch, tmp_path, name):
    """Break-it finding (h-breakH): $FWBENCH_DATA_DIR (or $FWBENCH_CACHE_DIR) a link that loops (``ln -s loop loop``):
    ``fwbench run GRID --launcher ray`` ended in a traceback, "RuntimeError: Symlink loop from …" (run_settings'
    Path.resolve), before Ray started. The directory is sent as the driver reads it; the worker's corpus lookup names
    it in one line, as the local launcher's does."""
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    monkeypatch.setenv(name, str(loop))
    if name == DATA_DIR_ENV:  # break-it pass AV: refused in one line before Ray starts (the cache is made on use)
        with pytest.raises(FwbenchError, match=r"^\$FWBENCH_DATA_DIR: got '.*/loop', which is not a directory; "):
            run_settings()
        return
    assert run_settings()[name] == str(loop)
