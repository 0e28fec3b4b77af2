"""Determinism: the same config and seed give bit-identical records (metrics and curves) on the
same CPU machine, for a short run of every task in ``tasks.TASKS``; and the report states the
torch version, device and thread count of every run.

Across processes (another PYTHONHASHSEED, a run resumed after ``kill -9``) the same holds: see
``tests/run/test_interruption.py``, which compares subprocess records with an in-process run.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch

from fwbench.report.render import render_report
from fwbench.run.environment import cpu_model
from fwbench.run.grid import RunSpec
from fwbench.run.launchers import LaunchOptions
from fwbench.run.runner import execute, run_grid
from fwbench.run.store import ResultsStore
from fwbench.tasks import TASKS
from fwbench.tasks.corpus import CorpusError

#: A few steps of each task. A task without an entry gets GENERIC, restricted to its config's
#: fields, so a new task is covered from the day it is registered (add an entry if its defaults
#: are too big for a test).
TINY = {
    "retrieval": {"S": 4, "d_key": 8, "batch_size": 4, "eval_every": 2, "eval_sequences": 2, "max_steps": 4},
    # the final evaluation reads the whole validation split: a wide batch keeps it to a few calls
    "shakespeare": {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "context": 32, "batch_size": 256,
                    "warmup_steps": 1, "eval_every": 2, "max_steps": 4, "eval_segments": 2, "checkpoint_every": 0,
                    "stream_eval": False, "sample_tokens": 8},
}
GENERIC = {"batch_size": 2, "eval_every": 2, "max_steps": 4, "eval_sequences": 2, "eval_batches": 1}
#: Random features redrawn every step (FAVOR+), the delta rule's β, and a KV cache.
VARIANTS = ["favor:m=8", "dpfp-delta:nu=1", "softmax"]
CPU = torch.device("cpu")


def tiny_spec(task_name: str, variant: str, seed: int = 3) -> RunSpec:
    task = TASKS[task_name]
    names = {f.name for f in fields(task.config_class)}
    overrides = TINY.get(task_name) or {k: v for k, v in GENERIC.items() if k in names}
    config = task.config_class(**overrides)
    task.validate(config)
    return RunSpec("determinism", task_name, variant, seed, asdict(config))


def outcome(record: dict) -> str:
    """What must repeat bit for bit, serialised exactly (floats by repr, NaN as NaN)."""
    return json.dumps({k: record[k] for k in ("status", "steps", "metrics", "curve", "diverged_at")}, sort_keys=True)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_same_config_and_seed_give_bit_identical_records(task_name, variant):
    spec = tiny_spec(task_name, variant)
    try:
        first = execute(spec, CPU)
    except CorpusError as exc:  # a task whose data is not on this machine (set FWBENCH_DATA_DIR)
        pytest.skip(f"{task_name}: {str(exc)[:120]}")
    second = execute(spec, CPU)
    assert len(first["curve"]) >= 2
    assert outcome(first) == outcome(second)
    assert outcome(execute(tiny_spec(task_name, variant, seed=4), CPU)) != outcome(first)  # the seed matters


@pytest.mark.slow
def test_report_states_torch_version_device_and_threads_of_every_run(tmp_path):
    store = ResultsStore(tmp_path / "results")
    run_grid([tiny_spec("retrieval", v) for v in ("linear", "dpfp:nu=1")], store, LaunchOptions(device="cpu"), quiet=True)
    records = store.records()
    assert all(r["environment"]["threads"] == torch.get_num_threads() for r in records)
    text = render_report(tmp_path / "results", tmp_path / "reports").read_text()
    section = text[text.index("Runs by environment"):]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "device", "machine", "torch", "python", "threads", "commit", "runs", "first_start", "last_end", "run_hours"]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in body]
    environment = records[0]["environment"]
    assert environment["device_name"] == cpu_model() and environment["device_name"] not in ("", "x86_64") or \
        not Path("/proc/cpuinfo").exists()
    assert cells == [["cpu", environment["device_name"], torch.__version__, platform.python_version(),
                      str(torch.get_num_threads()), environment["git_commit"] or "nan", str(len(records)),
                      min(r["started_at"] for r in records), max(r["ended_at"] for r in records),
                      f"{round(sum(r['wall_s'] for r in records) / 3600, 2)}"]]
