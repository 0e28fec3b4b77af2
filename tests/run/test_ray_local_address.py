"""Ray's address ``local`` starts a new instance for the command, as no address does (issue 14).

Ray itself is never started here: ``launch_ray`` is given a stand-in for the ``ray`` module that records
what ``ray.init`` is asked for and reports an instance of 2 CPUs, so these tests run where a Ray instance
(a CI run's, a colleague's) must not be disturbed.
"""

from __future__ import annotations

import os

import pytest

from fwbench.errors import FwbenchError
from fwbench.run import launchers
from fwbench.run.launchers import LaunchOptions, check_ray_resources, launch_ray, starts_local_ray


class FakeRay:
    """The part of the ``ray`` module ``launch_ray`` uses before its first task: an instance of 2 CPUs."""

    def __init__(self):
        self.init_kwargs: dict | None = None
        self.shut_down = False

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs) -> None:
        self.init_kwargs = kwargs

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0}

    def shutdown(self) -> None:
        self.shut_down = True

    def remote(self, **_):
        assert self.init_kwargs is not None, "a task made before Ray started"
        return lambda function: function  # no spec is given, so no task is submitted


@pytest.fixture
def fake_ray(monkeypatch):
    fake = FakeRay()
    monkeypatch.setattr(launchers, "_import_ray", lambda: fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return fake


@pytest.mark.parametrize("address", [None, "", "local"])
def test_no_address_and_local_start_an_instance_here(address):
    assert starts_local_ray(address)


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379", "ray://head:10001", "LOCAL", "localhost:6379"])
def test_a_cluster_address_does_not(address):
    assert not starts_local_ray(address)  # Ray compares "local" exactly: "LOCAL" is parsed as HOST:PORT


@pytest.mark.parametrize("via_environment", [False, True])
def test_address_local_is_given_the_cpus_and_checked_against_the_started_instance(fake_ray, monkeypatch,
                                                                                 via_environment):
    """``--ray-address local`` (or ``RAY_ADDRESS=local``) starts a new instance, as Ray documents: the old
    code took it for a cluster's address, passed no ``num_cpus`` and never compared a run with the instance,
    so ``--cpus-per-run 3`` on this 2-CPU instance was submitted and waited for ever."""
    if via_environment:
        monkeypatch.setenv("RAY_ADDRESS", "local")
    options = LaunchOptions(launcher="ray", device="cpu", cpus_per_run=3.0,
                            ray_address=None if via_environment else "local")
    with pytest.raises(FwbenchError, match=r"^--cpus-per-run: got 3; expected at most 2, the CPUs of the local Ray"):
        list(launch_ray([], options))
    assert fake_ray.init_kwargs["address"] == "local" and fake_ray.init_kwargs["num_cpus"] is None
    assert fake_ray.shut_down

    fake_ray.__init__()
    options = LaunchOptions(launcher="ray", device="cpu", cpus_per_run=1.0, ray_num_cpus=2,
                            ray_address=None if via_environment else "local")
    assert list(launch_ray([], options)) == []
    assert fake_ray.init_kwargs["address"] == "local" and fake_ray.init_kwargs["num_cpus"] == 2  # old: not passed


def test_no_address_still_starts_a_local_instance_with_its_cpus(fake_ray):
    assert list(launch_ray([], LaunchOptions(launcher="ray", device="cpu", ray_num_cpus=2))) == []
    assert fake_ray.init_kwargs["address"] == "local" and fake_ray.init_kwargs["num_cpus"] == 2


def test_a_cluster_address_is_joined_without_cpus(fake_ray):
    assert list(launch_ray([], LaunchOptions(launcher="ray", device="cpu", ray_address="auto"))) == []
    assert fake_ray.init_kwargs["address"] == "auto" and "num_cpus" not in fake_ray.init_kwargs


@pytest.mark.parametrize("ray_address, environment, shown", [
    ("10.0.0.1:6379", None, "--ray-address '10.0.0.1:6379'"),
    ("auto", "local", "--ray-address 'auto'"),
    (None, "auto", "$RAY_ADDRESS 'auto'"),
])
def test_ray_num_cpus_with_a_clusters_address_is_refused(monkeypatch, ray_address, environment, shown):
    """Ray is given no CPU count for a cluster it joins: ``--ray-num-cpus 4 --ray-address HOST:6379`` was
    silently ignored (as C105's options without Ray were)."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if environment is not None:
        monkeypatch.setenv("RAY_ADDRESS", environment)
    options = LaunchOptions(launcher="ray", device="cpu", ray_num_cpus=4, ray_address=ray_address)
    with pytest.raises(FwbenchError) as info:
        check_ray_resources(options)
    assert str(info.value).startswith(f"--ray-num-cpus: got 4 with {shown}, where it has no effect; expected it only")


class RayReadingItsAddressVariable(FakeRay):
    """Also records the address Ray 2.60's ``ray.init`` would use: it replaces ``None`` or ``"auto"`` by a
    non-empty ``$RAY_ADDRESS`` (``ray/_private/worker.py``: ``if address_env_var and (address is None or
    address == "auto")``), which ``services.canonicalize_bootstrap_address`` does again."""

    def init(self, **kwargs) -> None:
        super().init(**kwargs)
        address, environment = kwargs.get("address"), os.environ.get("RAY_ADDRESS")
        self.used_address = environment if environment and address in (None, "auto") else address


@pytest.mark.parametrize("environment", ["local", "10.0.0.1:6379", " "])
def test_ray_address_auto_overrides_the_environment_variable(monkeypatch, environment):
    """``--ray-address auto`` with ``RAY_ADDRESS`` set: the old code called ``ray.init(address='auto')`` with the
    variable in place, and Ray used the variable: ``local`` started a new instance no run was compared with (the
    runs waited for ever where one was larger), ``10.0.0.1:6379`` joined that cluster, not the running one asked
    for, and a blank one raised Ray's ValueError, shown as a bad ``--ray-address 'auto'``."""
    fake = RayReadingItsAddressVariable()
    monkeypatch.setattr(launchers, "_import_ray", lambda: fake)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", environment)
    assert list(launch_ray([], LaunchOptions(launcher="ray", device="cpu", ray_address="auto"))) == []
    assert fake.used_address == "auto"  # old: the variable's value
    assert os.environ["RAY_ADDRESS"] == environment  # hidden from ray.init only
    try:  # Ray's own rule, where Ray is installed (a pure function: nothing is started)
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return
    if environment == "local":
        assert canonicalize_bootstrap_address("auto") is None  # None: "start a local Ray instance"


def test_the_environment_variable_is_still_used_without_the_option(monkeypatch):
    fake = RayReadingItsAddressVariable()
    monkeypatch.setattr(launchers, "_import_ray", lambda: fake)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert list(launch_ray([], LaunchOptions(launcher="ray", device="cpu"))) == []
    assert fake.used_address == "10.0.0.1:6379" and "num_cpus" not in fake.init_kwargs
