"""The Ray launcher's PYTHONPATH check (rows C180, C181, C184, C185) gives advice that fits where the
refused character comes from: a ``$`` written in a relative entry itself is fixed by renaming the
directory, not by running from another working directory. Ray is never started here."""

from __future__ import annotations

import os

import pytest

from fwbench.errors import FwbenchError
from fwbench.run.launchers import LaunchOptions, check_ray_resources

OPTIONS = LaunchOptions(launcher="ray", device="cpu")
DOLLAR_WHY = "Ray expands $NAME in its workers' environment, so they would import from elsewhere"


def refusal() -> str:
    with pytest.raises(FwbenchError) as caught:
        check_ray_resources(OPTIONS)
    return str(caught.value)


@pytest.mark.parametrize("python_path", ["lib$x", "${HOME}", "./$", f"/abs/lib{os.pathsep}lib$x"])
def test_a_dollar_written_in_a_relative_entry_is_refused_as_one_in_the_variable(python_path, tmp_path, monkeypatch):
    """2c39977 read each entry made absolute: a relative entry holding '$' itself, run from a working
    directory without one, was told 'run from a directory without '$'' (which cannot help) with the entry's
    absolute form; before, and now, the message C180 gives for a '$' in the variable."""
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.chdir(plain)
    monkeypatch.setenv("PYTHONPATH", python_path)
    assert refusal() == (f"$PYTHONPATH: got {python_path!r} with --launcher ray; expected directories without '$' "
                         f"({DOLLAR_WHY}; rename the directory or reach it through a link)")


def test_a_dollar_from_the_working_directory_still_advises_another_working_directory(tmp_path, monkeypatch):
    where = tmp_path / "a$lib"
    where.mkdir()
    monkeypatch.chdir(where)
    monkeypatch.setenv("PYTHONPATH", "lib")
    assert refusal() == (f"$PYTHONPATH: got 'lib' with --launcher ray, whose entry 'lib' is '{where / 'lib'}' from "
                         f"this working directory; expected directories without '$' ({DOLLAR_WHY}; run from a "
                         "directory without '$', or reach it through a link)")
