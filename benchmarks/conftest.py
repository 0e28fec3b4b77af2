"""The performance-regression suite (pytest-benchmark), run by ``nox -s bench``; not part of the
default ``pytest`` run (``testpaths = ["tests"]``).

Options: ``--short`` (the CI subset, failing only on gross regressions), ``--update-baseline``
(write the measured ratios to this CPU's baseline in ``results/baselines/`` instead of judging
them; a CPU is its model name, family, model and torch's instruction set,
:func:`~fwbench.run.environment.cpu_identity`; the gate judges each CPU against its own baseline,
see :func:`~fwbench.bench.regression.choose_baseline`),
``--threshold X`` (override the slowdown factor that fails), ``--plant-slowdown MODULE:FUNCTION``
(run that kernel twice per call, e.g. ``fwbench.variants.kernels.delta_rule:delta_rule_chunk``: a
planted 2× slowdown, which the gate must catch).
"""

from __future__ import annotations

import pytest
import torch

from fwbench.bench.plant import plant_slowdown
from fwbench.bench.regression import (
    FULL_THRESHOLD,
    GROSS_THRESHOLD,
    baseline_path_for,
    check_threshold,
    judged_baseline,
    write_baseline,
)
from fwbench.run.environment import cpu_identity, cpu_model, describe_environment


def pytest_addoption(parser):
    group = parser.getgroup("fwbench performance regression")
    group.addoption("--short", action="store_true", help="only the CI subset; fail only on gross regressions")
    group.addoption("--update-baseline", action="store_true", help="write the measured ratios to this CPU's baseline "
                    "(results/baselines/perf_baseline.json, or perf_baseline-<cpu>.json where that file is another CPU's)")
    group.addoption("--threshold", type=float, default=None, help="slowdown factor over the baseline that fails")
    group.addoption("--plant-slowdown", default=None, metavar="MODULE:FUNCTION",
                    help="run this kernel twice per call (a planted 2x slowdown the gate must catch)")


def pytest_configure(config):
    torch.set_num_threads(1)
    chosen = config.getoption("--threshold")
    if chosen is not None:
        try:
            check_threshold(chosen)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    planted = config.getoption("--plant-slowdown")
    # None is "no plant"; an empty target ("--plant-slowdown $KERNEL" with KERNEL unset) planted nothing
    # and the gate passed, read as a plant the gate missed: it is refused as any other target
    if planted is not None and config.getoption("--update-baseline"):
        # the baseline would hold the planted kernel's ratios: the gate would then pass that slowdown for good
        raise pytest.UsageError(f"--plant-slowdown: got {planted!r} with --update-baseline; expected one of them "
                                "(a baseline measured with a planted slowdown would let that slowdown pass)")
    if planted is not None:
        _plant_slowdown(planted)
    # read once, here: a malformed baseline is one usage error, not an INTERNALERROR in the report
    # header or an error in every case's fixture
    try:
        if config.getoption("--update-baseline"):
            config._fwbench_baseline_path = baseline_path_for(cpu_identity())
            config._fwbench_baseline = None
        else:
            # keyed by more than the model name, which a VM's CPU generations share ('AMD EPYC')
            config._fwbench_baseline = judged_baseline(cpu_identity(), model=cpu_model())
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config._fwbench_ratios = {}
    config._fwbench_seconds = {}


def _plant_slowdown(target: str) -> None:
    """Replace MODULE:FUNCTION (and every fwbench module's name for it) with a version that calls it twice."""
    try:
        plant_slowdown(target)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--short"):
        return
    keep = [item for item in items if getattr(item, "callspec", None) and item.callspec.params["case"].short]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


@pytest.fixture(scope="session")
def threshold(pytestconfig) -> float:
    chosen = pytestconfig.getoption("--threshold")
    if chosen is not None:
        return chosen
    return GROSS_THRESHOLD if pytestconfig.getoption("--short") else FULL_THRESHOLD


def pytest_report_header(config):
    if config.getoption("--update-baseline"):
        return [f"fwbench baseline: writing {config._fwbench_baseline_path.name} (CPU {cpu_identity()!r})"]
    judged = config._fwbench_baseline
    return [f"fwbench baseline: {judged.where()}"] + [f"WARNING: {warning}" for warning in judged.warnings]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("--update-baseline"):
        for warning in config._fwbench_baseline.warnings:  # said again at the end, beside the verdict it qualifies
            terminalreporter.write_line(f"WARNING: {warning}", yellow=True)


@pytest.fixture(scope="session")
def baseline(pytestconfig) -> dict[str, float]:
    return {} if pytestconfig.getoption("--update-baseline") else pytestconfig._fwbench_baseline.ratios


@pytest.fixture(scope="session")
def measured(pytestconfig):
    return pytestconfig._fwbench_ratios, pytestconfig._fwbench_seconds


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if config.getoption("--update-baseline") and config._fwbench_ratios:
        environment = describe_environment(torch.device("cpu")) | {"cpu_identity": cpu_identity()}
        path = write_baseline(config._fwbench_ratios, config._fwbench_seconds, environment,
                              config._fwbench_baseline_path)
        print(f"\nbaseline written: {path} ({len(config._fwbench_ratios)} benchmarks)")
