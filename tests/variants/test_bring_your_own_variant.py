"""Bring your own variant: what a user does, step by step, without editing fwbench.

The user writes a feature map in a file of their own (φ(x) = relu(x), d_dot = d_key), registers it
with :func:`fwbench.variants.register_feature_map`, names the file in a grid's ``variant_modules`` and
runs the grid through the command line. The forms of the new variants must agree with each other and
with a naive token loop written here (sum and delta rule).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import assert_close

from fwbench import variants
from fwbench.run.store import ResultsStore
from fwbench.variants import registry, rules

TOL = 1e-5

USER_MODULE = '''\
"""My own feature map: phi(x) = relu(x), d_dot = d_key."""
import torch

from fwbench.variants import FeatureMap, register_feature_map


class ReLU(FeatureMap):
    """phi(x) = relu(x): (B, H, T, d_key) -> (B, H, T, d_key)."""

    @classmethod
    def output_size(cls, d_key: int) -> int:
        return d_key

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


register_feature_map("relu", ReLU, description="phi = relu(x)", source="my notes")
'''

USER_GRID = '''\
name = "tiny_relu"
task = "retrieval"
variant_modules = ["my_attention.py"]

[defaults]
setting = 2
S = 4
d_key = 8
batch_size = 4
eval_every = 2
eval_sequences = 4
max_steps = 4
chunk_size = 3

[profiles.quick]
variant = ["relu", "relu-delta"]
seed = [1]
'''


@pytest.fixture
def user_file(tmp_path) -> Path:
    path = tmp_path / "my_attention.py"
    path.write_text(USER_MODULE)
    return path


@pytest.fixture
def clean_registry():
    """Leave the registry as it was: other tests list the built-in variants exactly."""
    saved = dict(registry.REGISTRY), dict(registry.FEATURE_MAPS), dict(rules.RULES)
    modules = set(sys.modules)
    yield
    for table, before in zip((registry.REGISTRY, registry.FEATURE_MAPS, rules.RULES), saved, strict=True):
        table.clear()
        table.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith(variants.plugins.MODULE_PREFIX):
            del sys.modules[name]


def naive_sum_rule(q, k, v, eps=1e-6):
    """y_t = W_t φ(q_t) / (z_tᵀ φ(q_t) + eps), W_t = Σ_{s≤t} v_s φ(k_s)ᵀ, z_t = Σ_{s≤t} φ(k_s), φ = relu."""
    phi_q, phi_k = torch.relu(q).double(), torch.relu(k).double()
    W = torch.zeros(*q.shape[:2], v.shape[-1], q.shape[-1], dtype=torch.float64)
    z = torch.zeros(*q.shape[:2], q.shape[-1], dtype=torch.float64)
    out = []
    for t in range(q.shape[2]):
        W = W + v[:, :, t, :, None].double() * phi_k[:, :, t, None, :]
        z = z + phi_k[:, :, t]
        numerator = (W @ phi_q[:, :, t, :, None]).squeeze(-1)
        out.append(numerator / ((z * phi_q[:, :, t]).sum(-1, keepdim=True) + eps))
    return torch.stack(out, dim=2)


def naive_delta_rule(q, k, v, beta, eps=1e-6):
    """W_t = W_{t−1} + β_t (v_t − W_{t−1} φ(k_t)) φ(k_t)ᵀ, y_t = W_t φ(q_t), φ = relu / (Σ relu + eps)."""
    def phi(x):
        r = torch.relu(x).double()
        return r / (r.sum(-1, keepdim=True) + eps)

    phi_q, phi_k = phi(q), phi(k)
    W = torch.zeros(*q.shape[:2], v.shape[-1], q.shape[-1], dtype=torch.float64)
    out = []
    for t in range(q.shape[2]):
        key = phi_k[:, :, t]
        old = (W @ key[..., None]).squeeze(-1)
        W = W + beta[:, :, t, None, None].double() * (v[:, :, t].double() - old)[..., None] * key[:, :, None, :]
        out.append((W @ phi_q[:, :, t, :, None]).squeeze(-1))
    return torch.stack(out, dim=2)


def test_a_user_feature_map_registers_its_variants_and_its_forms_agree(user_file, clean_registry):
    assert variants.import_variant_modules([str(user_file)]) == (str(user_file.resolve()),)
    variants.import_variant_modules([str(user_file)])  # a second import is a no-op, not a clash
    assert [n for n in variants.REGISTRY if n.startswith("relu")] == [
        "relu", "relu-delta", "relu-delta-unnorm", "relu-fwm"]
    assert variants.d_dot_of("relu-delta", 12) == 12
    B, H, T, d = 2, 3, 11, 6
    q, k, v = torch.randn(B, H, T, d), torch.randn(B, H, T, d), torch.randn(B, H, T, 5)
    beta = torch.rand(B, H, T)
    references = {"relu": naive_sum_rule(q, k, v), "relu-delta": naive_delta_rule(q, k, v, beta)}
    for spec, reference in references.items():
        for form in ("parallel", "chunk", "recurrent", "auto"):
            attention = variants.build_attention(spec, d, form=form, chunk_size=4)  # 3 chunks, a short tail
            y, state = attention(q, k, v, beta=beta)
            assert_close(y, reference.float(), TOL)
            assert state.W.shape == (B, H, 5, d)
            # the task-facing helpers read what the forward wrote
            assert_close(attention.read(q[:, :, -1:], state), y[:, :, -1:], TOL)
            assert_close(attention.write_read(k, v, q[:, :, -1:], beta=beta), y[:, :, -1:], TOL)


@pytest.mark.slow
def test_a_user_variant_runs_through_the_cli_from_a_grid(tmp_path, user_file):
    grid = tmp_path / "tiny.toml"
    grid.write_text(USER_GRID)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = tmp_path / "results"
    done = subprocess.run([sys.executable, "-m", "fwbench", "run", str(grid), "--results-dir", str(results),
                           "--quiet"], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 trained now" in done.stdout and "0 failed" in done.stdout, done.stdout
    records = {r["variant"]["spec"]: r for r in ResultsStore(results).records()}
    assert sorted(records) == ["relu", "relu-delta"]
    for record in records.values():
        assert record["status"] == "max_steps", json.dumps(record)[:2000]
        assert record["variant"]["d_dot"] == 8 and record["steps"] == 4 and record["config"]["chunk_size"] == 3
        assert 0 < record["metrics"]["best_eval_loss"] < 1
    listed = subprocess.run([sys.executable, "-m", "fwbench", "variants", "--d-key", "8", "--variant-module",
                             str(user_file)], capture_output=True, text=True, env=env, timeout=600)
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:3] == ["relu-delta", "delta", "8"] for line in listed.stdout.splitlines())
    # the report reads the records even where the module is not named (it needs no variant object)
    report = subprocess.run([sys.executable, "-m", "fwbench", "report", "--results-dir", str(results), "--out",
                             str(tmp_path / "reports")], capture_output=True, text=True, env=env, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "| relu | relu-delta |" in (tmp_path / "reports" / "REPORT.md").read_text()


@pytest.mark.slow
def test_a_fresh_worker_process_imports_the_modules_a_run_carries(tmp_path, user_file, clean_registry):
    """What a Ray worker does: unpickle a run expanded elsewhere, then train it."""
    from fwbench.run.grid import expand, load_grid

    grid = tmp_path / "tiny.toml"
    grid.write_text(USER_GRID)
    spec = expand(load_grid(grid), "quick")[1]
    assert spec.variant == "relu-delta" and spec.variant_modules == (str(user_file.resolve()),)
    (tmp_path / "spec.pkl").write_bytes(pickle.dumps(spec))
    worker = (
        "import pickle, sys\n"
        "from fwbench.run.launchers import execute_in_worker\n"
        "from fwbench.variants import REGISTRY\n"
        "assert 'relu-delta' not in REGISTRY\n"
        f"spec = pickle.loads(open({str(tmp_path / 'spec.pkl')!r}, 'rb').read())\n"
        "record = execute_in_worker(spec, 'cpu', 1)\n"
        "print(record['status'], record['run_id'], record['variant']['d_dot'])\n"
    )
    done = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["max_steps", spec.run_id, "8"], done.stdout + done.stderr[-2000:]


def test_a_user_rule_is_named_for_every_feature_map(clean_registry):
    rule = replace(rules.SUM, key="sum-again", description="the sum rule, registered again")
    names = variants.register_rule(rule)
    assert names == ["linear-sum-again", "favor-sum-again", "dpfp-sum-again"]  # tanh: φ can be negative
    assert variants.register_rule(rule) == []  # registering the same object again is a no-op
    with pytest.raises(variants.VariantError, match="rule.key: got 'sum-again', which another rule already has"):
        variants.register_rule(replace(rule, description="another"))
    q = torch.randn(1, 2, 7, 4)
    y, _ = variants.build_attention("linear-sum-again", 4)(q, q, q)
    y_ref, _ = variants.build_attention("linear", 4)(q, q, q)
    assert torch.equal(y, y_ref)


#: how each launcher starts ``fwbench run``: workers in other processes must import the grid's modules
LAUNCHES = {
    "local": [sys.executable, "-m", "fwbench", "run"],
    "ray": [sys.executable, "-m", "fwbench", "run", "--launcher", "ray", "--ray-num-cpus", "1"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "fwbench",
                 "run"],
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_a_user_variant_runs_in_worker_processes(tmp_path, user_file, launcher):
    """Ray workers (from the run they receive) and torchrun processes (from the grid they load) import
    the grid's variant modules: the same runs and losses as the local launcher."""
    if launcher == "ray":
        pytest.importorskip("ray")
    grid = tmp_path / "tiny.toml"
    grid.write_text(USER_GRID)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    stores = {}
    for name in ("local", launcher):
        out = tmp_path / name
        done = subprocess.run([*LAUNCHES[name], str(grid), "--results-dir", str(out), "--quiet"],
                              capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        stores[name] = {r["run_id"]: r for r in ResultsStore(out).records()}
    assert sorted(stores[launcher]) == sorted(stores["local"]) and len(stores["local"]) == 2
    for run_id, record in stores[launcher].items():
        assert record["status"] == "max_steps", record.get("error")
        assert record["metrics"]["best_eval_loss"] == pytest.approx(
            stores["local"][run_id]["metrics"]["best_eval_loss"], rel=1e-5)
