"""Data-parallel training under torchrun (issue 7): two CPU processes (gloo) train each run together.

Checks that both ranks end with identical parameters, that exactly one record (from rank 0) is
written per run, and that the two-process run follows the single-process run on the same global
batch. The Shakespeare case needs the real corpus (``FWBENCH_DATA_DIR``; CI sets it); the
retrieval case needs nothing.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.distributed import DistributedContext, context_from_environment
from fwbench.run.store import ResultsStore
from fwbench.tasks.corpus import DATA_DIR_ENV

REAL_DATA_DIR = os.environ.get(DATA_DIR_ENV)

LM_GRID = """
name = "ddp-lm"
task = "shakespeare"

[defaults]
schedule = "noam"
grad_clip = 1.0
stream_eval = true
stream_characters = 2048
sample_tokens = 40

[profiles.quick]
variant = ["linear-delta", "favor:m=16"]
seed = [1]
d_model = 32
n_heads = 2
n_layers = 1
d_ff = 64
positional = "learned"
context = 32
batch_size = 8
lr = 6e-3
warmup_steps = 5
max_steps = 12
eval_every = 6
eval_segments = 4
checkpoint_every = 6
"""

RETRIEVAL_GRID = """
name = "ddp-retrieval"
task = "retrieval"

[defaults]
setting = 2
eval_every = 5
eval_sequences = 4
batch_size = 8
d_key = 8

[profiles.quick]
variant = ["dpfp-delta:nu=1", "softmax"]
S = [5]
seed = [1]
max_steps = 10
"""


def run_fwbench(args: list[str], nproc: int | None, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``fwbench ARGS`` in a subprocess: under ``torchrun --nproc_per_node=nproc``, or plain when None."""
    launcher = [sys.executable, "-m", "fwbench"] if nproc is None else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "fwbench"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run(launcher + args, capture_output=True, text=True, env=env, timeout=600)


def train_both(tmp_path, grid_text: str, env_extra=None):
    grid = tmp_path / "grid.toml"
    grid.write_text(grid_text)
    results = {}
    for nproc in (2, None):
        out = tmp_path / f"results-{nproc or 1}"
        done = run_fwbench(["run", str(grid), "--results-dir", str(out), "--quiet"], nproc, env_extra)
        assert done.returncode == 0, done.stderr[-3000:]
        results[nproc or 1] = (out, ResultsStore(out).records(), done)
    return results


def check_two_process_records(results, expected_runs: int) -> None:
    out, records, done = results[2]
    raw_lines = (out / "runs.jsonl").read_text().splitlines()
    assert len(raw_lines) == expected_runs, "rank 1 must not write records"
    assert len({r["run_id"] for r in records}) == expected_runs
    assert done.stdout.count("grid ") == 1, "only rank 0 prints the summary"
    single = {r["run_id"]: r for r in results[1][1]}
    for record in records:
        assert record["status"] != "failed", record.get("error")
        info = record["distributed"]
        assert info["world_size"] == 2 and info["backend"] == "gloo"
        digests = info["parameter_sha256"]
        assert len(digests) == 2 and digests[0] == digests[1], "ranks disagree on the parameters"
        # same global batch, gradients averaged over the two halves: the same trajectory as one process
        alone = single[record["run_id"]]
        assert "distributed" not in alone
        assert record["steps"] == alone["steps"]
        for key in ("best_eval_loss", "final_eval_loss"):
            assert math.isclose(record["metrics"][key], alone["metrics"][key], rel_tol=1e-3), key
        assert [p["step"] for p in record["curve"]] == [p["step"] for p in alone["curve"]]


@pytest.mark.slow
def test_two_processes_train_retrieval_like_one(tmp_path):
    results = train_both(tmp_path, RETRIEVAL_GRID)
    check_two_process_records(results, expected_runs=2)
    # rerunning under torchrun trains nothing: rank 0 reads the store and tells rank 1
    again = run_fwbench(["run", str(tmp_path / "grid.toml"), "--results-dir", str(results[2][0]), "--quiet"], 2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 trained now, 2 already" in again.stdout
    assert len((results[2][0] / "runs.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
@pytest.mark.skipif(not REAL_DATA_DIR, reason=f"needs the Tiny Shakespeare corpus ({DATA_DIR_ENV}; CI sets it)")
def test_two_processes_train_the_language_model_like_one(tmp_path):
    results = train_both(tmp_path, LM_GRID, {DATA_DIR_ENV: REAL_DATA_DIR})
    check_two_process_records(results, expected_runs=2)
    out, records, _ = results[2]
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("*.pt"))
    assert checkpoints == sorted(f"{r['run_id']}.pt" for r in records), "rank 0 writes one checkpoint per run"
    for record in records:
        assert record["final_evaluation"]["sample"]["text"], "rank 0 runs the final evaluation"
        assert record["metrics"]["val_bpc"] > 0


@pytest.mark.slow
def test_batch_size_must_split_across_ranks(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(RETRIEVAL_GRID.replace("batch_size = 8", "batch_size = 7"))
    done = run_fwbench(["run", str(grid), "--results-dir", str(tmp_path / "r"), "--quiet"], 2)
    assert done.returncode != 0
    assert "fwbench: error: batch_size: got 7 with 2 processes" in done.stderr
    # torchrun reports the failed workers itself; the workers print one line each, no traceback
    assert "[rank0]: Traceback" not in done.stderr and "[rank1]: Traceback" not in done.stderr
    assert not (tmp_path / "r" / "runs.jsonl").exists() or not (tmp_path / "r" / "runs.jsonl").read_text()


@pytest.mark.parametrize("argv", [["reproduce", "--profile", "quick"], ["bench", "--variants", "linear"],
                                  ["report", "--out", "OUT"], ["variants"]])
@pytest.mark.slow
def test_torchrun_only_drives_run(tmp_path, argv):
    """Any other command would run once per process (two reports written at once, two benchmarks
    competing for the CPU): every process that reaches the check refuses it with one line, and
    none trains, writes or prints a traceback. (torchrun stops the other workers as soon as one
    exits, so whether the second process gets to print first is a race, not a property of fwbench.)"""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    done = run_fwbench([*argv, "--results-dir", str(tmp_path / "r")] if argv[0] != "variants" else argv, 2)
    assert done.returncode != 0
    # one line per process that got to print it: torchrun stops the other worker as soon as the
    # first one exits, so on a loaded machine the second may be stopped before it prints
    assert 1 <= done.stderr.count(f"fwbench: error: torchrun: got 'fwbench {argv[0]}'") <= 2
    assert "[rank0]: Traceback" not in done.stderr and "[rank1]: Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "r" / "bench.jsonl").exists()


def test_context_from_environment():
    assert context_from_environment({}) is None
    assert context_from_environment({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}) is None
    context = context_from_environment({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert (context.rank, context.local_rank, context.world_size, context.is_main) == (3, 1, 4, False)
    with pytest.raises(FwbenchError, match=r"\$RANK: got 'x'"):
        context_from_environment({"WORLD_SIZE": "2", "RANK": "x", "LOCAL_RANK": "0"})


def test_shard_splits_every_tensor_of_a_batch_into_disjoint_slices():
    batch = {"ids": torch.arange(12).reshape(6, 2), "pair": (torch.arange(6), "meta")}
    parts = [DistributedContext(rank, rank, 3, "gloo").shard(batch) for rank in range(3)]
    assert torch.equal(torch.cat([p["ids"] for p in parts]), batch["ids"])
    assert torch.equal(torch.cat([p["pair"][0] for p in parts]), batch["pair"][0])
    assert all(p["ids"].shape == (2, 2) and p["pair"][1] == "meta" for p in parts)
    with pytest.raises(FwbenchError, match="batch_size: got 7 with 3 processes"):
        DistributedContext(0, 0, 3, "gloo").check_batch_size(7)
