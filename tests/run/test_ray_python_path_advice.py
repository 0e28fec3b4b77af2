"""The Ray launcher's PYTHONPATH check (rows C180, C181, C184, C185) gives advice that fits where each
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
                         f"directory without '$', or {LINKED})")


UTF8_WHY = "Ray cannot give its workers other bytes: each worker would crash"
#: the way round a fault the working directory brings in (a link to the working directory is none)
LINKED = ("give the entry as an absolute path through a link (running from a link does not help: the working "
          "directory is read with its links resolved)")
COLON_WHY = f"a {os.pathsep!r} in an entry splits it in two"
#: a working directory whose name is not UTF-8 has no way round: Ray sends it to its workers itself (C188)
NO_WAY_ROUND = ("neither a link to it nor an absolute entry through one helps (the working directory is read with its "
                "links resolved, and Ray sends it to its workers too)")


def directory(tmp_path, name: bytes):
    """A new directory ``name`` (bytes: it may be no UTF-8) in ``tmp_path``, as Python names it (os.fsdecode)."""
    made = os.fsdecode(bytes(tmp_path) + b"/" + name)
    os.mkdir(made)
    return made


# (working directory, PYTHONPATH, the entry the working directory brings a fault into (None: none), the message's
# expected ... and advice); '{cwd}' stands for the working directory
COMBINATIONS = {
    "entry '$' only": (b"plain", "lib$x", None, "without '$'", DOLLAR_WHY, "rename the directory or"),
    "working directory '$' only": (b"a$b", "lib", "lib", "without '$'", DOLLAR_WHY, "run from a directory without '$', or"),
    "'$' in both": (b"a$b", "lib$x", "lib$x", "without '$'", DOLLAR_WHY,
                    "rename the entry's directory and run from a directory without '$', or"),
    "':' from the working directory": (b"a:b", ".", ".", f"without {os.pathsep!r}", f"{COLON_WHY}, so they would import "
                                       f"from elsewhere", f"run from a directory without {os.pathsep!r}, or"),
    "entry '$', working directory ':'": (
        b"a:b", "lib$x", "lib$x", f"without '$' or {os.pathsep!r}",
        f"Ray expands $NAME in its workers' environment and {COLON_WHY}, so they would import from elsewhere",
        f"rename the entry's directory and run from a directory without {os.pathsep!r}, or"),
    "working directory '$' and ':'": (b"a$:b", os.pathsep, "", f"without '$' or {os.pathsep!r}",
                                      f"Ray expands $NAME in its workers' environment and {COLON_WHY}, so they would "
                                      "import from elsewhere", f"run from a directory without '$' or {os.pathsep!r}, or"),
    "entry not UTF-8": (b"plain", os.fsdecode(b"x\xffy"), None, "whose names are UTF-8", UTF8_WHY,
                        "rename the directory or"),
    "absolute entry not UTF-8, with a trailing '/'": (b"plain", os.fsdecode(b"/abs/x\xffy/"), None,
                                                       "whose names are UTF-8", UTF8_WHY, "rename the directory or"),
    "working directory not UTF-8": (b"n\xffu", ".", ".", "whose names are UTF-8", UTF8_WHY,
                                    "run from a directory whose name is UTF-8:"),
    "entry '$', working directory not UTF-8": (
        b"n\xffu", "lib$x", "lib$x", "without '$' and whose names are UTF-8", f"{DOLLAR_WHY}; {UTF8_WHY}",
        "rename the entry's directory and run from a directory whose name is UTF-8:"),
    "entry not UTF-8, working directory '$'": (
        b"a$b", os.fsdecode(b"x\xffy"), os.fsdecode(b"x\xffy"), "without '$' and whose names are UTF-8",
        f"{DOLLAR_WHY}; {UTF8_WHY}", "rename the entry's directory and run from a directory without '$', or"),
    "an absolute entry's '$' and another entry's from the working directory": (
        b"a$b", f"/abs/$x{os.pathsep}.", ".", "without '$'", DOLLAR_WHY,
        "rename the entry's directory and run from a directory without '$', or"),
}


@pytest.mark.parametrize("case", COMBINATIONS)
def test_the_advice_names_every_cause_of_a_refused_entry_and_only_those(case, tmp_path, monkeypatch):
    """Each fault (a '$', the path separator, a name that is not UTF-8) is told by where it comes from: the entry's
    own text (rename its directory) or the working directory a relative entry is joined to (run from another). The
    old check took the first fault of the absolute entry and one source for it: 'lib$x' run from a$b was told only
    to rename it, and from a:b only of its '$'; a '$' with a name that is not UTF-8 lost the latter; a working
    directory not UTF-8 was told to rename the directory (C185), and an entry not UTF-8, relative or absolute with
    a trailing '/', was shown 'from this working directory', which brought nothing in."""
    cwd_name, python_path, from_cwd, without, why, advice = COMBINATIONS[case]
    cwd = directory(tmp_path, cwd_name)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", python_path)
    whose = "" if from_cwd is None else (f", whose entry {from_cwd!r} is {os.path.normpath(os.path.join(cwd, from_cwd))!r} "
                                         "from this working directory")
    around = "reach it through a link" if from_cwd is None else NO_WAY_ROUND if advice.endswith(":") else LINKED
    assert refusal() == (f"$PYTHONPATH: got {python_path!r} with --launcher ray{whose}; expected directories "
                         f"{without} ({why}; {advice} {around})")


@pytest.mark.parametrize("python_path", ["../lib", f"/abs/lib{os.pathsep}.."])
def test_a_relative_entry_that_climbs_out_of_the_working_directorys_fault_is_accepted(python_path, tmp_path, monkeypatch):
    """'../lib' run from /x/a$b is /x/lib: the working directory's '$' does not reach the workers."""
    monkeypatch.chdir(directory(tmp_path, b"a$b"))
    monkeypatch.setenv("PYTHONPATH", python_path)
    check_ray_resources(OPTIONS)


def test_the_way_round_a_working_directorys_fault_is_one_that_works(tmp_path, monkeypatch):
    """Break-it finding (h-breakA): a '$' the working directory brought in was told "run from a directory without
    '$', or reach it through a link", but running from a link to it (cd link, $PWD without '$') was refused again
    with the same advice: os.getcwd(), which the workers' entries are joined to, resolves links. The advice names
    what works: an absolute entry through a link."""
    where = tmp_path / "a$b"
    (where / "lib").mkdir(parents=True)
    link = tmp_path / "plain"
    link.symlink_to(where)
    monkeypatch.chdir(link)
    monkeypatch.setenv("PWD", str(link))
    monkeypatch.setenv("PYTHONPATH", "lib")
    assert refusal().endswith(f"; run from a directory without '$', or {LINKED})")
    monkeypatch.setenv("PYTHONPATH", str(link / "lib"))  # what the advice says: accepted
    check_ray_resources(OPTIONS)


def test_a_working_directory_not_utf8_is_given_no_way_round_that_is_refused_next(tmp_path, monkeypatch):
    """Break-it finding (h-breakC): '.' run from a directory whose name is not UTF-8 was told "... or give the entry as
    an absolute path through a link"; followed (PYTHONPATH=/x/link, the link to it), the check refused the working
    directory itself next (C188: Ray sends it to its workers), so the advice was no way round. It is not offered
    (but with a Ray client's address, ray://, whose driver sends none: there it works and is still given)."""
    where = directory(tmp_path, b"n\xffu")
    link = tmp_path / "plain"
    link.symlink_to(where)
    monkeypatch.chdir(where)
    monkeypatch.setenv("PYTHONPATH", ".")
    assert refusal().endswith(f"run from a directory whose name is UTF-8: {NO_WAY_ROUND})")
    monkeypatch.setenv("PYTHONPATH", str(link))  # what the old advice said: refused all the same
    assert refusal().startswith("the working directory: got ")
    client = LaunchOptions(launcher="ray", device="cpu", ray_address="ray://host:10001")
    monkeypatch.setenv("PYTHONPATH", ".")
    with pytest.raises(FwbenchError) as caught:
        check_ray_resources(client)
    assert str(caught.value).endswith(f"run from a directory whose name is UTF-8, or {LINKED})")
    monkeypatch.setenv("PYTHONPATH", str(link))
    check_ray_resources(client)


@pytest.mark.parametrize("name", [b"n\xffu", b"li$b"], ids=["entry not UTF-8", "entry '$'"])
def test_an_absolute_entry_run_from_a_working_directory_not_utf8_names_both_fixes(name, tmp_path, monkeypatch):
    """Break-it finding (h-breakE, the kind of 2e8bceb): an absolute entry of its own fault (not UTF-8, or a '$') run
    from a working directory whose name is not UTF-8 was told only "rename the directory or reach it through a link";
    followed (PYTHONPATH=/x/link), the working directory was refused next (C188: Ray sends it to its workers). Both
    fixes are named at once; with a Ray client's address (ray://), whose driver sends no working directory, only the
    entry's."""
    entry = directory(tmp_path, name)
    link = tmp_path / "plain"
    link.symlink_to(entry)
    monkeypatch.chdir(directory(tmp_path, b"w\xffd"))
    monkeypatch.setenv("PYTHONPATH", str(entry))
    also = "; and run from a directory whose name is UTF-8: Ray sends the working directory to its workers too"
    assert also in refusal(), refusal()
    monkeypatch.setenv("PYTHONPATH", str(link))  # the entry's own fix alone: refused next
    assert refusal().startswith("the working directory: got ")
    monkeypatch.setenv("PYTHONPATH", str(entry))
    with pytest.raises(FwbenchError) as caught:
        check_ray_resources(LaunchOptions(launcher="ray", device="cpu", ray_address="ray://host:10001"))
    assert also not in str(caught.value)
