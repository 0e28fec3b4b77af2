"""Shared pytest configuration: every test starts from the same RNG state and in fp32, and torch
runs single-threaded (the shapes are tiny; with more threads, OpenMP spin-waits make a loaded
2-core machine up to 100x slower on the token-by-token recurrent forms).

The tolerance helper lives in ``tests/helpers.py`` (:func:`helpers.assert_close`), imported by
the test modules; this file holds only hooks and fixtures.
"""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seeded_fp32():
    """Seed the global torch RNG (FAVOR+ draws Ω from it) and pin the default dtype to fp32."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(autouse=True)
def _run_settings_restored():
    """Put back the run settings that `fwbench run --data-dir DIR` writes into this process's environment
    (so that Ray workers and subprocesses inherit them): test_bad_input[C277] left FWBENCH_DATA_DIR
    at its own temporary directory, and every later LM test in that process lost the corpus."""
    import os

    from fwbench.run.environment import RUN_SETTINGS_ENV

    saved = {name: os.environ.get(name) for name in RUN_SETTINGS_ENV}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
