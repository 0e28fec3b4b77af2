"""Sessions: `nox -s tests`, `nox -s reproduce -- --profile quick`, `nox -s capacity`, `nox -s bench`.

Every session runs in the current Python environment (no virtualenv), so a CPU build of torch
installed once is reused rather than replaced by a multi-GB CUDA download. Each session first
installs this project (editable, with its dev extras) into that environment.
"""

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["tests"]


def install_project(session: nox.Session) -> None:
    # Quiet and idempotent: a no-op apart from the editable link once the dependencies are present.
    session.run("python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", ".[dev]")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite, on CPU (extra pytest arguments after --)."""
    install_project(session)
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session(venv_backend="none")
def reproduce(session: nox.Session) -> None:
    """Run every paper grid, the Tiny Shakespeare LM grid included, and render reports/REPORT.md
    (`-- --profile quick|full`, `--device cuda`). The LM grid needs the corpus: FWBENCH_DATA_DIR=DIR or
    `-- --data-dir DIR` (DIR/tinyshakespeare/input.txt), else the user cache or a download."""
    install_project(session)
    session.run("fwbench", "reproduce", *(session.posargs or ["--profile", "quick"]))


@nox.session(venv_backend="none")
def capacity(session: nox.Session) -> None:
    """Capacity vs ν: run the capacity_nu grid for seeds 1-3, write reports/capacity_nu.png and a CSV of
    capacities with 95 % t-intervals (`-- --profile full`, `--device cuda`). Seed 1 is shared with
    `reproduce --profile quick`, so after it only seeds 2 and 3 train."""
    install_project(session)
    session.run("fwbench", "capacity", *(session.posargs or ["--profile", "quick", "--seeds", "1", "2", "3"]))


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Performance regression check: benchmarks/ (pytest-benchmark) against results/baselines/.

    `-- --short`: the CI subset (< 3 min), failing only on gross regressions;
    `-- --update-baseline`: rewrite results/baselines/perf_baseline.json from this machine.
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
