"""The glibc allocator tuning that ``fwbench`` applies at start-up (fwbench/run/allocator.py)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

PROBE = """
import json, sys
from fwbench.run.allocator import malloc_tuning_active, tune_malloc
first = tune_malloc()
print(json.dumps({"first": first, "again": tune_malloc(), "active": malloc_tuning_active()}))
"""


def probe(env_value: str | None) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k != "FWBENCH_MALLOC_TUNING"}
    if env_value is not None:
        env["FWBENCH_MALLOC_TUNING"] = env_value
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(not GLIBC, reason="the tuning applies to glibc's malloc only")
def test_tuning_is_applied_once_on_glibc():
    assert probe(None) == {"first": True, "again": True, "active": True}


def test_tuning_can_be_switched_off():
    assert probe("0") == {"first": False, "again": False, "active": False}


def test_records_say_whether_the_tuning_was_active():
    import torch

    from fwbench.run.environment import describe_environment

    assert isinstance(describe_environment(torch.device("cpu"))["malloc_tuning"], bool)
