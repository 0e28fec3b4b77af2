"""Values of the retrieval task checked one by one (issue 14 item 14: the surviving mutants of
``tasks/retrieval.py``): its streams, the query positions, the masked loss of one query, the
output dtype, the path the fused form takes, what reaches the model and which configs are refused."""

from __future__ import annotations

import pytest
import torch

from fwbench.tasks import retrieval
from fwbench.tasks.retrieval import (
    RetrievalConfig,
    RetrievalModel,
    RetrievalTask,
    generate_sequences,
    retrieval_loss,
    sample_batch,
)

TASK = RetrievalTask()


def _drawn_twice(draw) -> tuple:
    """``draw()`` after two different global seeds: a draw from its own stream gives equal results."""
    torch.manual_seed(1)
    first = draw()
    torch.manual_seed(2)
    return first, draw()


@pytest.mark.parametrize("setting", [1, 2])
def test_sequences_and_batches_come_from_the_given_stream_only(setting):
    first, second = _drawn_twice(lambda: generate_sequences(setting, 6, 3, torch.Generator().manual_seed(9)))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    config = RetrievalConfig(setting=setting, S=6, batch_size=3)
    for draw in (lambda: sample_batch(setting, 6, 3, torch.Generator().manual_seed(9)),
                 lambda: TASK.train_batch(config, torch.Generator().manual_seed(9))):
        first, second = _drawn_twice(draw)
        assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_setting_1_training_batch_holds_permutations_and_queries_every_position():
    """Setting 1 keys and values are permutations of the S ids; over 200 sequences of S = 4 the
    query sits at each of the 4 positions (the first one included)."""
    batch = TASK.train_batch(RetrievalConfig(setting=1, S=4, batch_size=200), torch.Generator().manual_seed(3))
    ids = torch.arange(4).expand(200, -1)
    assert torch.equal(batch["keys"].sort(-1).values, ids) and torch.equal(batch["values"].sort(-1).values, ids)
    positions = (batch["keys"] == batch["queries"]).int().argmax(-1)
    assert set(positions.tolist()) == {0, 1, 2, 3}
    assert torch.equal(batch["targets"][:, 0], batch["values"].gather(1, positions[:, None])[:, 0])


def test_the_masked_loss_of_a_single_query_is_that_querys_loss():
    predicted = torch.tensor([[[0.5, 0.0, 0.0], [1.0, 1.0, 1.0]]])  # (B=1, Q=2, S=3)
    targets = torch.tensor([[0, 2]])
    only_first = retrieval_loss(predicted, targets, 3, mask=torch.tensor([[1.0, 0.0]]))
    assert only_first.item() == pytest.approx(0.5 * 0.5**2)  # ½‖(0.5, 0, 0) − (1, 0, 0)‖²


def test_on_cpu_the_loss_leaves_the_id_check_to_scatter(monkeypatch):
    """The range check with ``aminmax`` (a host sync) runs only off the CPU; on the CPU a bad id is
    still refused, by the scatter, as a ValueError naming ``targets``."""
    def no_aminmax(*args, **kwargs):
        raise AssertionError("aminmax called on CPU")

    monkeypatch.setattr(torch, "aminmax", no_aminmax)
    predicted = torch.zeros(2, 1, 3)
    assert retrieval_loss(predicted, torch.tensor([[0], [2]]), 3).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"^targets: .*; expected ids in \[0, 3\)$"):
        retrieval_loss(predicted, torch.tensor([[0], [3]]), 3)


@pytest.mark.parametrize("variant, dtype, expected", [("linear-delta", torch.float64, torch.float64),
                                                       ("softmax", torch.bfloat16, torch.float32)])
def test_the_model_returns_float64_for_a_float64_model_and_fp32_otherwise(variant, dtype, expected):
    """Softmax attention computes a bf16 model in bf16: the scores still come back in fp32."""
    torch.manual_seed(0)
    model = RetrievalModel(variant, 4, d_key=8, form="parallel").to(dtype)
    keys = torch.tensor([[0, 1, 2, 3]])
    assert model(keys, keys.flip(-1), keys).dtype == expected


def test_the_auto_form_of_a_one_hot_reader_takes_the_one_hot_path(monkeypatch):
    """The fused one-hot write-then-read (no value codes, no β) is what ``form='auto'`` runs for a
    variant that reads one-hot values; other forms run the attention's own write_read."""
    calls: list[str] = []
    real = retrieval.one_hot_write_read

    def spy(*args, **kwargs):
        calls.append("one-hot")
        return real(*args, **kwargs)

    monkeypatch.setattr(retrieval, "one_hot_write_read", spy)
    keys = torch.tensor([[0, 1, 2, 3]])
    for form in ("auto", "parallel", "chunk"):
        torch.manual_seed(0)
        RetrievalModel("linear", 4, d_key=8, form=form)(keys, keys, keys)
        calls.append(form)
    assert calls == ["one-hot", "auto", "parallel", "chunk"]


def test_the_model_is_built_with_the_configs_sizes_form_and_chunk_size():
    torch.manual_seed(0)
    config = RetrievalConfig(S=5, d_key=6, embedding_factor=1.0, form="chunk", chunk_size=3)
    model = TASK.build_model(config, "linear-delta")
    assert model.embedding_size == 5 and model.key_embedding.weight.shape == (5, 5)
    assert model.W_q.weight.shape == (6, 5)
    assert (model.attention.form, model.attention.chunk_size) == ("chunk", 3)


@pytest.mark.parametrize("changes, message", [
    ({"batch_size": 0}, "batch_size"),
    ({"d_key": 0}, "d_key"),
    ({"S": 1}, "S: got 1; expected at least 2 keys"),
    ({"lr": 0.0}, "lr: got 0.0; expected > 0"),
    ({"embedding_factor": 0.0}, "embedding_factor: got 0.0; expected > 0"),
    ({"embedding_factor": 0.2, "S": 4}, "embedding_factor: got 0.2 with S=4, a key embedding of int(0.2 × 4) = 0"),
])
def test_configs_out_of_range_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError) as raised:
        TASK.validate(RetrievalConfig(**changes))
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("changes", [{"S": 2}, {"S": 2, "embedding_factor": 0.5}, {"S": 4, "embedding_factor": 0.5}])
def test_configs_at_the_edge_of_their_range_are_accepted(changes):
    TASK.validate(RetrievalConfig(**changes))  # S = 2 keys; a key embedding of 1 or 2 features


def test_the_models_defaults_are_the_official_sizes():
    """d_key 64 and a key embedding of int(2.2 · S) features (S = 10: 22), as the official model."""
    torch.manual_seed(0)
    model = RetrievalModel("linear", 10)
    assert model.attention.d_key == 64 and model.W_q.weight.shape == (64, 22)
    assert model.embedding_size == 22 and model.key_embedding.weight.shape == (10, 22)
