"""Sessions: `nox -s tests`, `nox -s reproduce -- --profile quick`, `nox -s capacity`, `nox -s bench`,
`nox -s mutation` (by hand only: never in CI, not part of `tests`).

Every session runs in the current Python environment (no virtualenv) and first installs what it needs
there, so a machine with nothing but Python and nox can run any of them:

1. torch, only when the environment has none (an installed torch is always kept, whatever its build):
   where no CUDA device is visible, the CPU build (`torch==VERSION+cpu` from PyTorch's CPU index,
   about 200 MB instead of a multi-GB CUDA download; macOS wheels are CPU builds already); where one
   is, the default build. `FWBENCH_TORCH="torch==…"` (plus `FWBENCH_TORCH_INDEX=URL`) overrides the choice.
2. this project, editable, with its dev extras (`pip install -e '.[dev]'`), skipped when the last
   install from this checkout into this interpreter still holds (same pyproject.toml).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
from pathlib import Path
from urllib.parse import urlparse

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["tests"]

#: The torch release installed where none is: the one CI and the committed baselines use.
TORCH_VERSION = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def cuda_device_visible() -> bool:
    """True when an NVIDIA driver is installed and CUDA_VISIBLE_DEVICES does not hide every device."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1")
    return shutil.which("nvidia-smi") is not None and not hidden


def index_reachable(url: str) -> bool:
    """Whether ``url``'s host resolves: pip retries an unreachable extra index for every package."""
    try:
        socket.getaddrinfo(urlparse(url).hostname, 443)
    except OSError:
        return False
    return True


def torch_requirement() -> tuple[str, list[str]]:
    """(requirement, extra pip arguments) for installing torch on this machine."""
    if os.environ.get("FWBENCH_TORCH"):
        index = os.environ.get("FWBENCH_TORCH_INDEX")
        return os.environ["FWBENCH_TORCH"], ["--extra-index-url", index] if index else []
    if cuda_device_visible() or platform.system() == "Darwin":
        return f"torch=={TORCH_VERSION}", []
    # Linux and Windows wheels on PyPI bundle CUDA; the +cpu build lives on PyTorch's own index (or on
    # whatever index or wheel folder pip is configured with, where that index cannot be reached).
    extra = ["--extra-index-url", TORCH_CPU_INDEX] if index_reachable(TORCH_CPU_INDEX) else []
    return f"torch=={TORCH_VERSION}+cpu", extra


def ensure_torch(session: nox.Session) -> None:
    has_torch = session.run(
        "python", "-c", "import importlib.util; print(importlib.util.find_spec('torch') is not None)",
        silent=True, log=False,  # a probe: its command line is noise in the session's log
    )
    if "True" in (has_torch or ""):
        return
    requirement, extra = torch_requirement()
    session.log(f"no torch in this environment: installing {requirement}")
    session.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *extra, requirement)


#: What the environment looked like after the last install from this checkout (git-ignored).
INSTALL_STAMP = Path(".nox") / "fwbench-install-stamp"
#: Prints the interpreter and where fwbench is installed from (empty when it is not installed).
_PROBE = """
import sys, json, importlib.metadata as metadata
try:
    url = json.loads(metadata.distribution("fwbench").read_text("direct_url.json") or "{}").get("url", "")
except metadata.PackageNotFoundError:
    url = ""
print(sys.executable, url)
"""


def install_stamp(session: nox.Session) -> str:
    """The interpreter, fwbench's install location and pyproject.toml's hash: equal stamps mean the
    last install still holds, so the ~10 s of a no-op pip run are skipped (the fast test loop)."""
    # -I: not the checkout's egg-info; log=False: the probe's seven lines were echoed twice per session
    where = (session.run("python", "-I", "-c", _PROBE, silent=True, log=False) or "").strip()
    return f"{where}\n{hashlib.sha256(Path('pyproject.toml').read_bytes()).hexdigest()}"


def install_project(session: nox.Session) -> None:
    stamp = install_stamp(session)
    editable_here = stamp.split("\n")[0].endswith(" " + Path.cwd().as_uri())
    if editable_here and INSTALL_STAMP.exists() and INSTALL_STAMP.read_text() == stamp:
        session.log("fwbench is installed from this checkout and pyproject.toml is unchanged: nothing to install")
        return
    ensure_torch(session)
    session.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", ".[dev]")
    INSTALL_STAMP.parent.mkdir(exist_ok=True)
    INSTALL_STAMP.write_text(install_stamp(session))


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite, on CPU (extra pytest arguments after --; `-- -m "not slow"`: the fast subset)."""
    install_project(session)
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session(venv_backend="none")
def reproduce(session: nox.Session) -> None:
    """Run every paper grid, the Tiny Shakespeare LM grid included, and render reports/REPORT.md
    (`-- --profile quick|full`, `--device cuda`). The LM grid needs the corpus: FWBENCH_DATA_DIR=DIR or
    `-- --data-dir DIR` (DIR/tinyshakespeare/input.txt), else the user cache or a download."""
    install_project(session)
    session.run("python", "-m", "fwbench", "reproduce", *(session.posargs or ["--profile", "quick"]))


@nox.session(venv_backend="none")
def capacity(session: nox.Session) -> None:
    """Capacity vs ν: run the capacity_nu grid for seeds 1-3, write reports/capacity_nu.png and a CSV of
    capacities with 95 % t-intervals (`-- --profile full`, `--device cuda`). Seed 1 is shared with
    `reproduce --profile quick`, so after it only seeds 2 and 3 train."""
    install_project(session)
    session.run("python", "-m", "fwbench", "capacity", *(session.posargs or ["--profile", "quick", "--seeds", "1", "2", "3"]))


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Performance regression check: benchmarks/ (pytest-benchmark) against results/baselines/.

    `-- --short`: the CI subset (< 3 min), failing only on gross regressions;
    `-- --update-baseline`: rewrite this CPU's baseline in results/baselines/ from this machine (the file of
    its fwbench.run.environment.cpu_identity; perf_baseline.json only where no file exists yet).
    """
    install_project(session)
    session.run(
        "python", "-m", "pytest", "benchmarks", "-q",
        "--benchmark-json=.benchmarks/latest.json", "--benchmark-columns=min,median,max,rounds",
        *session.posargs,
    )


@nox.session(venv_backend="none", name="bench-ci")
def bench_ci(session: nox.Session) -> None:
    """The short performance check CI can afford: `nox -s bench -- --short`."""
    install_project(session)
    session.run("python", "-m", "pytest", "benchmarks", "-q", "--short", *session.posargs)


@nox.session(venv_backend="none")
def mutation(session: nox.Session) -> None:
    """Mutation testing of the core modules with mutmut (docs/mutation.md); by hand, never in CI.

    What is mutated and which tests run are set in pyproject.toml's [tool.mutmut]. Extra arguments go
    to `mutmut run`: `-- --max-children 1 "fwbench.analysis.*"` (one worker, the analysis modules'
    mutants only). Then `mutmut results` lists the survivors and `mutmut show NAME` prints one.
    """
    install_project(session)
    session.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "mutmut>=3.8,<4")
    # The mutated copy must exist before the interpreter starts: a PYTHONPATH entry that is missing at
    # start-up is cached as "no such directory" and the tests would import the unmutated package.
    mutants = Path("mutants").resolve()
    mutants.mkdir(exist_ok=True)
    env = {"PYTHONPATH": str(mutants), "OMP_NUM_THREADS": "1"}  # subprocesses of tests import the mutants too
    session.run("mutmut", "run", *session.posargs, env=env)
