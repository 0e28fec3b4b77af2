"""Invariants of the data generators, checked on thousands of generated sequences.

- Setting 2 (overwriting): keys and values in [0, S), length 2S, drawn with replacement; the target
  of every query is the value at the queried key's *last* occurrence (checked against a plain loop).
- MQAR (Zoology's definition): keys and values from disjoint halves of the vocabulary, distinct within
  a sequence, context of interleaved pairs at the start; every scored label is the value paired with
  the key at that position; each key is queried exactly once, after the context, at an even offset;
  query gaps follow the power law.
"""

from __future__ import annotations

import pytest
import torch

from fwbench.tasks.mqar import IGNORE, MQARConfig, MQARTask, generate_mqar, power_law_probabilities
from fwbench.tasks.retrieval import RetrievalConfig, RetrievalTask, generate_sequences, last_occurrence_values, sample_batch


def test_setting2_sequences_have_length_2S_and_repeat_keys():
    keys, values = generate_sequences(2, 15, 2000, torch.Generator().manual_seed(3))
    assert keys.shape == values.shape == (2000, 30)
    assert keys.min() >= 0 and keys.max() < 15 and values.min() >= 0 and values.max() < 15
    # drawn uniformly with replacement: every id about 2000·30/15 = 4000 times, and the number of
    # distinct keys per sequence matches its expectation 15·(1 − (14/15)^30) ≈ 13.1 (a permutation: 15)
    for ids in (keys, values):
        counts = torch.bincount(ids.flatten(), minlength=15).double()
        assert ((counts - 4000).abs() < 300).all()
    distinct = torch.tensor([row.unique().numel() for row in keys]).double().mean().item()
    assert distinct == pytest.approx(15 * (1 - (14 / 15) ** 30), abs=0.1)


def test_setting2_training_target_is_the_value_at_the_last_occurrence_for_thousands_of_sequences():
    generator = torch.Generator().manual_seed(11)
    checked = 0
    for S in (2, 5, 20, 64):
        batch = sample_batch(2, S, 1000, generator)
        keys, values = batch["keys"].tolist(), batch["values"].tolist()
        for row, (query, target) in enumerate(zip(batch["queries"][:, 0].tolist(), batch["targets"][:, 0].tolist(),
                                                  strict=True)):
            positions = [i for i, k in enumerate(keys[row]) if k == query]
            assert positions, "the query is always drawn among the sequence's keys"
            assert target == values[row][positions[-1]]
            checked += 1
    assert checked == 4000


def test_setting2_every_present_key_is_scored_at_its_last_occurrence():
    """The evaluation queries all S keys; a key that occurs is scored with its last value, one that
    does not is masked out (``present`` False)."""
    generator = torch.Generator().manual_seed(5)
    S = 12
    keys, values = generate_sequences(2, S, 1500, generator)
    queries = torch.arange(S).expand(1500, -1)
    targets, present = last_occurrence_values(keys, values, queries)
    for row in range(1500):
        last = {}
        for i, k in enumerate(keys[row].tolist()):
            last[k] = values[row, i].item()
        for q in range(S):
            assert present[row, q].item() == (q in last)
            if q in last:
                assert targets[row, q].item() == last[q]


def test_setting2_evaluation_runs_on_length_2S():
    task = RetrievalTask()
    config = RetrievalConfig(setting=2, S=6, d_key=8, eval_sequences=3)
    torch.manual_seed(0)
    model = task.build_model(config, "dpfp-delta:nu=1")
    metrics = task.evaluate(model, config, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert config.sequence_length == 12
    assert set(metrics) == {"loss", "accuracy"} and 0 <= metrics["accuracy"] <= 1


# --------------------------------------------------------------------------------------------
# MQAR
# --------------------------------------------------------------------------------------------


def test_mqar_every_scored_label_is_the_value_paired_with_the_queried_key():
    generator = torch.Generator().manual_seed(7)
    V, L, n = 128, 64, 8
    inputs, labels = generate_mqar(3000, V, L, n, 0.01, generator)
    assert inputs.shape == labels.shape == (3000, L)
    assert inputs.min() >= 0 and inputs.max() < V
    context = 2 * n
    keys, values = inputs[:, 0:context:2], inputs[:, 1:context:2]
    assert ((keys >= 1) & (keys < V // 2)).all(), "keys come from the lower half, 0 excluded"
    assert ((values >= V // 2) & (values < V)).all(), "values come from the upper half"
    for row in range(3000):
        pairs = dict(zip(keys[row].tolist(), values[row].tolist(), strict=True))
        assert len(pairs) == n and len(set(values[row].tolist())) == n, "distinct keys and values"
        scored = (labels[row] != IGNORE).nonzero().flatten().tolist()
        assert len(scored) == n, "each key is queried exactly once"
        queried = [inputs[row, p].item() for p in scored]
        assert sorted(queried) == sorted(pairs), "the queried tokens are exactly the context keys"
        for position, key in zip(scored, queried, strict=True):
            assert position >= context and (position - context) % 2 == 0
            assert labels[row, position].item() == pairs[key]
    assert (labels[:, :context] == IGNORE).all()


def test_mqar_without_random_fillers_leaves_zeros():
    inputs, labels = generate_mqar(50, 32, 32, 4, 0.01, torch.Generator().manual_seed(0), random_non_queries=False)
    filler = (labels == IGNORE)
    filler[:, :8] = False
    assert (inputs[filler] == 0).all()


def test_mqar_query_gaps_follow_the_power_law():
    """Gap 0 (query right after the context) is the most likely slot; the empirical distribution of
    the first drawn gap matches p(i) ∝ i^(a−1) within sampling error."""
    space, a = 24, 0.01
    p = power_law_probabilities(space, a)
    assert p.sum().item() == pytest.approx(1.0) and (p[:-1] > p[1:]).all()
    inputs, labels = generate_mqar(20000, 64, 2 * space + 2, 1, a, torch.Generator().manual_seed(2))
    gaps = ((labels != IGNORE).nonzero()[:, 1] - 2) // 2
    counts = torch.bincount(gaps, minlength=space).double() / 20000
    assert (counts - p).abs().max().item() < 0.01


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"seq_len": 33}, "seq_len"),
    ({"num_kv_pairs": 20, "seq_len": 64}, "num_kv_pairs"),
    ({"vocab_size": 10, "num_kv_pairs": 8}, "vocab_size"),
])
def test_mqar_bad_config_names_the_field(kwargs, named):
    with pytest.raises(ValueError, match=named):
        MQARTask().validate(MQARConfig(**kwargs))


def test_mqar_loss_is_scored_only_at_query_positions():
    """Changing the model's output anywhere but at query positions cannot change the loss: the
    logits returned are exactly the scored positions, in order."""
    task = MQARTask()
    config = MQARConfig(vocab_size=32, seq_len=16, num_kv_pairs=2, d_model=8, batch_size=4)
    torch.manual_seed(0)
    model = task.build_model(config, "linear")
    batch = task.train_batch(config, torch.Generator().manual_seed(0))
    logits, labels = model(batch["inputs"], batch["labels"])
    assert logits.shape == (4 * 2, 32) and labels.tolist() == batch["labels"][batch["labels"] != IGNORE].tolist()
    loss = task.loss(model, batch, config)
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item())


def test_power_law_of_a_large_exponent_is_computed_from_its_logarithm():
    """a = 400 over 240 gaps: i^399 overflows float64 (240^399 ≈ 1e950), which made p NaN and
    torch.multinomial raise. p(i) = i^399 / Σ_j j^399, exactly in integers, is the reference."""
    from fractions import Fraction

    total = sum(j**399 for j in range(1, 241))
    expected = torch.tensor([float(Fraction(i**399, total)) for i in range(1, 241)], dtype=torch.float64)
    p = power_law_probabilities(240, 400.0)
    torch.testing.assert_close(p, expected, rtol=1e-12, atol=1e-300)
    assert p[-1] > 0.8  # most of the mass on the longest gap
    torch.testing.assert_close(power_law_probabilities(5, 0.01), torch.tensor(
        [float(0.01 * i ** (0.01 - 1)) for i in range(1, 6)], dtype=torch.float64) / sum(
        0.01 * i ** (0.01 - 1) for i in range(1, 6)), rtol=1e-15, atol=0)


@pytest.mark.parametrize("a", [129.5, 129.6])
def test_power_law_whose_terms_are_finite_but_whose_sum_overflows_sums_to_one(a):
    """At 240 gaps, a = 129.5 keeps every a · i^(a−1) finite (≤ 1.8e308) but their sum overflows:
    terms / inf gave p = 0 at every gap (finite, so the log-space path was not taken). Reference:
    the same law from (i / 240)^(a−1) in Python floats, which nothing overflows."""
    ratios = [(i / 240) ** (a - 1) for i in range(1, 241)]
    expected = torch.tensor([r / sum(ratios) for r in ratios], dtype=torch.float64)
    p = power_law_probabilities(240, a)
    torch.testing.assert_close(p, expected, rtol=1e-12, atol=1e-300)
    assert abs(float(p.sum()) - 1.0) < 1e-12


@pytest.mark.parametrize("a", [5e-324, 1e-310])
def test_power_law_of_a_subnormal_exponent_is_one_over_i(a):
    """a = 5e-324 (accepted: a > 0): a · i^(a−1) underflowed to 0 beyond gap 1, which then held all
    the mass, and generate_mqar refused the config as needing "a smaller power_a". In float64
    a − 1 = −1 exactly, so p(i) = (1/i) / Σ_j 1/j, exactly in fractions, is the reference."""
    from fractions import Fraction

    total = sum(Fraction(1, j) for j in range(1, 125))
    expected = torch.tensor([float(Fraction(1, i) / total) for i in range(1, 125)], dtype=torch.float64)
    torch.testing.assert_close(power_law_probabilities(124, a), expected, rtol=1e-12, atol=0)
    inputs, labels = generate_mqar(2, 64, 256, 4, a, torch.Generator().manual_seed(0))
    assert int((labels != IGNORE).sum()) == 2 * 4


@pytest.mark.parametrize("spec", ["linear", "softmax"])
def test_mqar_model_refuses_tokens_that_are_not_ids_of_its_vocabulary_naming_them(spec):
    """The MQAR model read its tokens unchecked: an id outside the vocabulary raised "IndexError: index out
    of range in self" from the embedding, float tokens "RuntimeError: Expected tensor for argument #1
    'indices' ...", 1-D tokens one from the token shift's cat, labels of another shape "IndexError: The shape
    of the mask ...", meta tokens NotImplementedError from nonzero. Valid batches (int64 or int32) unchanged."""
    from fwbench.tasks.mqar import MQARModel

    torch.manual_seed(0)
    model = MQARModel(spec, 8, 8)
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 0, 1, 2, 3]])
    labels = torch.full((2, 6), IGNORE)
    labels[:, 3] = 1
    logits, scored = model(tokens, labels)
    assert logits.shape == (2, 8) and scored.tolist() == [1, 1]
    assert torch.equal(model(tokens.int(), labels)[0], logits)
    cases = [
        ((tokens + 8, labels), "tokens: got ids in [8, 15]; expected ids in [0, vocab_size=8)"),
        ((tokens - 1, labels), "tokens: got ids in [-1, 6]; expected ids in [0, vocab_size=8)"),
        ((tokens.float(), labels), "tokens: got torch.float32 of shape (2, 6); expected int64 (or int32) ids of "
                                   "shape (B, T)"),
        ((tokens[0], labels[0]), "tokens: got torch.int64 of shape (6,); expected int64 (or int32) ids of shape "
                                 "(B, T)"),
        ((tokens, labels[:, :3]), "labels: got torch.int64 of shape (2, 3); expected int64 (or int32) labels of "
                                  "the tokens' shape (2, 6) (-100 where unscored)"),
        ((tokens.to("meta"), labels), "tokens.device: got 'meta'; expected the model's device (cpu)"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError) as error:
            model(*args)
        assert str(error.value) == message
