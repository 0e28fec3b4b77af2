"""One home per setting: the attention form and chunk size are chosen when a model is built, every
path uses them, and the run id hashes only the config keys that act."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace

import pytest
import torch

from fwbench.run.grid import RECORD_SCHEMA, RunSpec, expand, load_grid
from fwbench.tasks import RetrievalConfig, RetrievalTask
from fwbench.variants import AttentionLayer, build_attention, chunk_size_in_use
from fwbench.variants.kernels import delta_rule, sum_rule
from fwbench.variants.kernels.chunking import DEFAULT_CHUNK_SIZE
from fwbench.variants.kernels.delta_rule import WRITE_READ_CHUNK_SIZE


def spy(monkeypatch, module, name: str) -> list[int]:
    """Record the ``chunk_size`` every call of ``module.name`` receives."""
    seen, original = [], getattr(module, name)

    def recording(*args, chunk_size, **kwargs):
        seen.append(chunk_size)
        return original(*args, chunk_size=chunk_size, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


def retrieval_step(config: RetrievalConfig, variant: str = "dpfp-delta:nu=1") -> None:
    task = RetrievalTask()
    model = task.build_model(config, variant)
    task.loss(model, task.train_batch(config, torch.Generator().manual_seed(0)), config).backward()


@pytest.mark.parametrize(("chunk_size", "expected"), [(5, 5), (None, WRITE_READ_CHUNK_SIZE)])
def test_the_retrieval_config_chunk_size_reaches_the_write_read_kernel(monkeypatch, chunk_size, expected):
    seen = spy(monkeypatch, delta_rule, "delta_rule_write_read")
    retrieval_step(RetrievalConfig(setting=2, S=6, d_key=8, batch_size=2, chunk_size=chunk_size))
    assert seen == [expected]


def test_the_retrieval_chunk_form_writes_with_the_config_chunk_size(monkeypatch):
    seen = spy(monkeypatch, delta_rule, "delta_rule_chunk")
    retrieval_step(RetrievalConfig(setting=2, S=6, d_key=8, batch_size=2, form="chunk", chunk_size=7))
    assert seen == [7]


def test_the_setting2_grid_chunk_size_reaches_the_kernel_that_runs(monkeypatch):
    cells = [spec for spec in expand(load_grid("setting2"), "quick") if spec.variant == "dpfp-delta:nu=2"]
    assert [cell.config["chunk_size"] for cell in cells] == [80]
    seen = spy(monkeypatch, delta_rule, "delta_rule_write_read")
    config = replace(cells[0].task_config(), batch_size=2, S=6)  # the grid's cell, on a small batch
    retrieval_step(config, cells[0].variant)
    assert seen == [80]


def test_layers_keep_their_form_and_chunk_size_and_every_call_uses_them(monkeypatch):
    seen = spy(monkeypatch, sum_rule, "sum_rule_chunk")
    layer = AttentionLayer("linear", d_model=8, n_heads=2, chunk_size=3)
    assert (layer.attention.form, layer.attention.chunk_size) == ("auto", 3)
    layer(torch.randn(1, 10, 8))
    build_attention("linear", 4)(*(torch.randn(1, 1, 5, 4),) * 3)
    assert seen == [3, DEFAULT_CHUNK_SIZE]
    recurrent = AttentionLayer("linear", d_model=8, n_heads=2, form="recurrent")
    recurrent(torch.randn(1, 10, 8))
    assert seen == [3, DEFAULT_CHUNK_SIZE], "the recurrent form never reaches the chunk kernel"


def run_id(task: str, variant: str, config) -> str:
    return RunSpec("g", task, variant, 1, asdict(config)).run_id


def test_the_run_id_ignores_a_chunk_size_that_does_not_act_and_hashes_one_that_does():
    base = RetrievalConfig(setting=2, S=20)
    for variant in ("dpfp:nu=1", "softmax", "tanh-fwm"):  # no chunked kernel on their write-read path
        assert run_id("retrieval", variant, base) == run_id("retrieval", variant, replace(base, chunk_size=80))
    parallel = replace(base, form="parallel")
    assert run_id("retrieval", "dpfp-delta:nu=1", parallel) == run_id(
        "retrieval", "dpfp-delta:nu=1", replace(parallel, chunk_size=80))
    assert run_id("retrieval", "dpfp-delta:nu=1", base) != run_id(
        "retrieval", "dpfp-delta:nu=1", replace(base, chunk_size=80))
    # unset means the rule's default for the path: the same run as naming that default
    assert run_id("retrieval", "dpfp-delta:nu=1", base) == run_id(
        "retrieval", "dpfp-delta:nu=1", replace(base, chunk_size=WRITE_READ_CHUNK_SIZE))


def old_run_id(spec: RunSpec, config: dict) -> str:
    """The id of ``spec`` as it was computed before only acting keys were hashed: the whole config."""
    payload = {"schema": RECORD_SCHEMA, "task": spec.task, "variant": spec.variant, "seed": spec.seed,
               "config": config}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize(("grid", "former_default"), [("mqar", 32)])
def test_run_ids_whose_keys_all_act_are_unchanged(grid, former_default):
    """A fast-weight run at its former default chunk size (MQAR: the task's 32) keeps the id it had before: its
    stored records stay valid. Softmax and FWM runs, whose chunk size never acted, drop it from the hash (their
    ids change once). The LM's ids changed once more with break-it pass AH: its grid's ``checkpoint_every``
    acts on nothing and is hashed as the task's default, its chunk size as the chunk lengths it cuts
    (test_run_ids_as_they_act.py)."""
    cells = expand(load_grid(grid), "quick")
    acting = [cell for cell in cells if chunk_size_in_use(cell.variant, cell.config["form"]) is not None]
    assert {cell.variant for cell in cells} - {cell.variant for cell in acting} <= {"softmax", "dpfp-fwm:nu=1"}
    for cell in cells:
        assert cell.run_id != old_run_id(cell, cell.config)
    for cell in acting:
        config = {**cell.config, "chunk_size": cell.config["chunk_size"] or former_default}
        assert cell.run_id == old_run_id(cell, config), cell.label
