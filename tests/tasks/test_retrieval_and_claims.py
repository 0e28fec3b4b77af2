"""The retrieval task's data and maths, the capacity estimator and the claim checks."""

from __future__ import annotations

import math

import pytest
import torch
from official_retrieval import official_model

from fwbench.analysis.records import estimate_capacity
from fwbench.analysis.reference import official_synthetic, official_variant_spec
from fwbench.tasks.retrieval import RetrievalModel, generate_sequences, last_occurrence_values, retrieval_loss, sample_batch
from fwbench.variants import build_attention, using_form


def test_setting1_writes_every_key_once_with_distinct_values():
    keys, values = generate_sequences(1, 30, 64, torch.Generator().manual_seed(0))
    assert keys.shape == values.shape == (64, 30)
    assert (keys.sort(dim=1).values == torch.arange(30)).all()
    assert (values.sort(dim=1).values == torch.arange(30)).all()


def test_setting2_target_is_the_value_at_the_last_occurrence():
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        batch = sample_batch(2, 10, 100, generator)
        assert batch["keys"].shape == (100, 20)
        for keys, values, query, target in zip(batch["keys"], batch["values"], batch["queries"], batch["targets"]):
            last = max(i for i, k in enumerate(keys.tolist()) if k == query.item())
            assert target.item() == values[last].item()


def test_last_occurrence_marks_absent_queries():
    keys = torch.tensor([[0, 1, 0]])
    values = torch.tensor([[5, 6, 7]])
    targets, present = last_occurrence_values(keys, values, torch.tensor([[0, 1, 2]]))
    assert targets.tolist() == [[7, 6, 0]] and present.tolist() == [[True, True, False]]


def test_loss_of_a_silent_memory_is_one_half():
    predicted = torch.zeros(4, 3, 10)
    assert retrieval_loss(predicted, torch.zeros(4, 3, dtype=torch.long), 10).item() == pytest.approx(0.5)


def test_retrieval_model_reads_every_query_after_writing(capsys):
    torch.manual_seed(0)
    model = RetrievalModel("dpfp-delta:nu=1", S=12, d_key=16)
    batch = sample_batch(1, 12, 3, torch.Generator().manual_seed(0))
    out = model(batch["keys"], batch["values"], torch.arange(12).expand(3, -1))
    assert out.shape == (3, 12, 12) and torch.isfinite(out).all()
    # the chunk write and the recurrent form give the same read-out
    with using_form(model, "recurrent"):
        recurrent = model(batch["keys"], batch["values"], torch.arange(12).expand(3, -1))
    assert torch.allclose(out, recurrent, atol=1e-5)


def test_capacity_interpolates_the_threshold_crossing_in_log_loss():
    capacity = estimate_capacity([20, 40, 60, 80], [0.001, 0.001, 0.001, 0.1], threshold=0.01)
    assert capacity.value == pytest.approx(70.0)  # log-midway between 1e-3 and 1e-1
    assert not capacity.lower_bound_only and not capacity.upper_bound_only


def test_capacity_is_censored_when_the_grid_does_not_bracket_it():
    assert estimate_capacity([20, 40], [0.001, 0.002]).lower_bound_only
    assert estimate_capacity([20, 40], [0.3, 0.4]).upper_bound_only
    assert math.isnan(estimate_capacity([], []).value)
    bracketed = estimate_capacity([20, 40, 60], [0.001, 0.005, 0.2])  # ≈ 44
    assert estimate_capacity([20, 60], [0.001, 0.002]).exceeds(bracketed) is True  # ≥ 60
    assert estimate_capacity([20, 40], [0.001, 0.002]).exceeds(bracketed) is None  # ≥ 40: undecided
    assert bracketed.exceeds(estimate_capacity([20, 60], [0.001, 0.002])) is False


def test_official_names_map_to_fwbench_specs():
    assert official_variant_spec("dpfp2", "ours") == "dpfp-delta:nu=2"
    assert official_variant_spec("favor64", "sum") == "favor:m=64"
    assert official_variant_spec("softmax", "cat") == "softmax"
    assert {"linear", "softmax", "dpfp:nu=1", "favor:m=64"} <= set(official_synthetic()["variant"])




@pytest.mark.parametrize("variant", ["dpfp-delta:nu=1", "linear"])
def test_lookup_model_equals_the_official_dense_token_model(variant):
    S, d_key, e = 9, 8, 19
    torch.manual_seed(3)
    model = RetrievalModel(variant, S=S, d_key=d_key, embedding_size=e)
    after_model = torch.rand(1)
    official = official_model(False, S, e, d_key, seed=3)  # the linear-attention model of the official code
    build_attention(variant, d_key)
    assert torch.rand(1) == after_model  # the split storage draws nothing beyond the official init
    dense_Wk, dense_bk, dense_Wb, dense_bb = model.dense_token_weights()
    assert torch.equal(dense_Wk, official.W_k.weight) and torch.equal(dense_bk, official.W_k.bias)
    assert torch.equal(dense_Wb, official.W_b.weight) and torch.equal(dense_bb, official.W_b.bias)
    assert torch.equal(model.W_q.weight, official.W_q.weight)
    assert torch.equal(model.key_embedding.weight, official.embeddingK.weight[:S])

    batch = sample_batch(2, S, 4, torch.Generator().manual_seed(5))
    keys, values, queries = batch["keys"], batch["values"], torch.arange(S).expand(4, -1)
    lookup_loss = retrieval_loss(model(keys, values, queries), last_occurrence_values(keys, values, queries)[0], S)
    lookup_grads = torch.autograd.grad(lookup_loss, list(model.parameters()), allow_unused=True)

    # the official forward: dense tokens [onehot(v); e(k)] through whole-token weights
    W_k_full, b_k, W_beta_full, b_beta = model.dense_token_weights()
    tokens = torch.cat([torch.nn.functional.one_hot(values, S).float(), model.key_embedding(keys)], dim=-1)
    k = (tokens @ W_k_full.T + b_k)[:, None]
    beta = torch.sigmoid(tokens @ W_beta_full.T + b_beta)[..., 0][:, None]
    q = model.W_q(model.key_embedding(queries))[:, None]
    v = torch.nn.functional.one_hot(values, S).float()[:, None]
    state = model.attention.write(k, v, beta=beta if model.attention.uses_beta else None)
    dense = model.attention.read(q, state)[:, 0]
    dense_loss = retrieval_loss(dense, last_occurrence_values(keys, values, queries)[0], S)
    dense_grads = torch.autograd.grad(dense_loss, list(model.parameters()), allow_unused=True)
    assert lookup_loss.item() == pytest.approx(dense_loss.item(), rel=1e-5)
    for (name, _), a, b in zip(model.named_parameters(), lookup_grads, dense_grads):
        assert (a is None) == (b is None), name  # the sum rule has no β: its weights get no gradient
        assert a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-6), name


def test_loss_matches_the_official_formula_with_and_without_a_mask():
    predicted = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(1))
    per_query = 0.5 * (predicted - torch.nn.functional.one_hot(targets, 7).float()).pow(2).sum(-1)
    assert retrieval_loss(predicted, targets, 7).item() == pytest.approx(per_query.mean().item(), rel=1e-6)
    mask = (torch.arange(5) % 2 == 0).float().expand(3, -1)
    expected = (per_query * mask).sum() / mask.sum()
    assert retrieval_loss(predicted, targets, 7, mask).item() == pytest.approx(expected.item(), rel=1e-6)


def test_an_empty_batch_reads_nothing_in_every_form():
    model = RetrievalModel("dpfp-delta:nu=1", S=5, d_key=8)
    ids = torch.zeros(0, 10, dtype=torch.long)
    for form in ("auto", "chunk", "recurrent", "parallel"):
        with using_form(model, form):
            assert model(ids, ids, torch.zeros(0, 2, dtype=torch.long)).shape == (0, 2, 5)


@pytest.mark.parametrize("spec", ["linear", "softmax", "linear-delta"])
def test_ids_on_another_device_than_the_model_are_refused_naming_them(spec):
    """The range check read meta ids with .item(): "RuntimeError: Tensor.item() cannot be called on meta
    tensors"; CPU ids into a model on meta returned meta outputs (the delta rule: "v.device: got 'cpu'").
    A model on meta reads meta ids unchecked (a shape dry run)."""
    model = RetrievalModel(spec, 6, d_key=4)
    ids = torch.arange(6).repeat(2, 1)
    meta = ids.to("meta")
    for args, name in (((meta, ids, ids[:, :1]), "keys"), ((ids, ids, meta[:, :1]), "queries")):
        with pytest.raises(ValueError, match=rf"^{name}.device: got 'meta'; expected the model's device \(cpu\)$"):
            model(*args)
    on_meta = RetrievalModel(spec, 6, d_key=4).to("meta")
    with pytest.raises(ValueError, match=r"^keys.device: got 'cpu'; expected the model's device \(meta\)$"):
        on_meta(ids, ids, ids[:, :1])
    output = on_meta(meta, meta, meta[:, :1])
    assert output.device.type == "meta" and output.shape == (2, 1, 6)


def test_loss_is_fp32_nan_for_no_queries_and_names_bad_arguments():
    many = torch.zeros(100_000, 1, 10, dtype=torch.float16)  # a sum in fp16 would overflow
    assert retrieval_loss(many, torch.zeros(100_000, 1, dtype=torch.long), 10).item() == pytest.approx(0.5)
    assert math.isnan(retrieval_loss(torch.rand(0, 1, 5), torch.zeros(0, 1, dtype=torch.long), 5).item())
    predicted = torch.rand(4, 1, 5)
    with pytest.raises(ValueError, match="predicted, targets: got shapes"):
        retrieval_loss(predicted, torch.zeros(4, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="predicted, targets: got shapes"):
        retrieval_loss(predicted, torch.zeros(4, 1, dtype=torch.long), 6)
    with pytest.raises(ValueError, match="targets: got dtype"):
        retrieval_loss(predicted, torch.zeros(4, 1), 5)
    for bad in (5, -1):
        with pytest.raises(ValueError, match=r"targets: .*expected ids in \[0, 5\)"):
            retrieval_loss(predicted, torch.full((4, 1), bad), 5)
