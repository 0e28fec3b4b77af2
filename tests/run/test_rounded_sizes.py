"""Two embedding factors that round to one key-embedding size build one model, so a grid listing both
is refused (issue 14 kind 12: one computation, two run ids)."""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.grid import expand, load_grid
from fwbench.tasks import RetrievalConfig
from fwbench.tasks.retrieval import RetrievalTask


def loss_and_grads(config: RetrievalConfig) -> list[torch.Tensor]:
    task = RetrievalTask()
    torch.manual_seed(0)
    model = task.build_model(config, "linear")
    loss = task.loss(model, task.train_batch(config, torch.Generator().manual_seed(0)), config)
    loss.backward()
    return [loss.detach(), *(p.grad for p in model.parameters() if p.grad is not None)]


def test_embedding_factors_that_round_to_one_size_are_refused_in_a_grid(tmp_path):
    """At S = 20 the key embedding has int(embedding_factor · S) features: 2.2 and 2.21 both build 44
    and compute the same numbers; 2.2 and 2.25 (44 and 45 features) are two runs."""
    config = RetrievalConfig(setting=2, S=20, d_key=8, batch_size=4)
    first, second = (loss_and_grads(RetrievalConfig(**{**config.__dict__, "embedding_factor": f})) for f in (2.2, 2.21))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    head = ('name = "ef"\ntask = "retrieval"\n[profiles.quick]\nvariant = "linear"\nS = 20\nseed = 1\n'
            "max_steps = 2\neval_every = 2\nd_key = 4\n")
    path = tmp_path / "ef.toml"
    path.write_text(head + "embedding_factor = [2.2, 2.21]\n")
    with pytest.raises(FwbenchError, match=r"appears twice: embedding_factor 2.2 and 2.21 act alike \(a key embedding "
                                           r"of int\(embedding_factor × S=20\) = 44 features\)"):
        load_grid(path)
    path.write_text(head + "embedding_factor = [2.2, 2.25]\n")
    assert len(expand(load_grid(path), "quick")) == 2
