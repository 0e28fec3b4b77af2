"""The retrieval model starts where the official model of its variant's family starts (issue 13).

The official code has two models: softmax attention draws W_k and W_q Xavier-uniform over whole
tokens (a bound that shrinks as S grows), the linear-attention model draws them from
U(±1/√d_key). Softmax with the linear model's initialisation starts saturated at large S (score std
≈ 7 at S=600 against ≈ 1.6) and never trains, while nothing at S ≤ 160 shows it: hence the
checks at S = 20, 300 and 600, for every variant, against :mod:`official_retrieval`.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import SPECS
from official_retrieval import dense_scores, official_model

from fwbench.tasks.retrieval import RetrievalModel, model_family, official_initial_weights, sample_batch
from fwbench.variants import build_attention

D_KEY = 64
VARIANTS = [*SPECS, "dpfp-fwm:nu=1", "favor:m=64"]
SIZES = (20, 300, 600)


def embedding_size(S: int) -> int:
    return int(2.2 * S)


def seeded_model(variant: str, S: int, seed: int) -> RetrievalModel:
    """fwbench's retrieval model right after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return RetrievalModel(variant, S=S, d_key=D_KEY, embedding_size=embedding_size(S))


def official_reference(variant: str, S: int, seed: int):
    """The official model for ``variant``'s family, plus what fwbench draws after it: a W_β for
    the softmax model (which has none) and the attention module (FAVOR+ draws Ω)."""
    softmax = variant == "softmax"
    official = official_model(softmax, S, embedding_size(S), D_KEY, seed)
    W_beta = torch.nn.Linear(S + embedding_size(S), 1) if softmax else official.W_b
    build_attention(variant, D_KEY)
    return official, W_beta


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("S", [20, 300])
def test_a_seed_draws_the_official_initial_weights(variant, S):
    model = seeded_model(variant, S, seed=5)
    after_model = torch.rand(1)
    official, W_beta = official_reference(variant, S, seed=5)
    assert torch.rand(1) == after_model  # the same number of draws, in the same order
    W_k, b_k, W_b, b_b = model.dense_token_weights()
    assert torch.equal(W_k, official.W_k.weight) and torch.equal(b_k, official.W_k.bias)
    assert torch.equal(model.W_q.weight, official.W_q.weight) and torch.equal(model.W_q.bias, official.W_q.bias)
    assert torch.equal(model.key_embedding.weight, official.embeddingK.weight[:S])
    assert torch.equal(W_b, W_beta.weight) and torch.equal(b_b, W_beta.bias)


def official_bounds(family: str, S: int) -> dict[str, float]:
    """Bounds of the uniform draws, from the official code's init calls (PyTorch's formulas)."""
    e = embedding_size(S)
    default = {"b_k": (S + e) ** -0.5, "b_q": e**-0.5}
    if family == "softmax":
        return {"W_k": math.sqrt(6 / (S + e + D_KEY)), "W_q": math.sqrt(6 / (e + D_KEY)), **default}
    return {"W_k": D_KEY**-0.5, "W_q": D_KEY**-0.5, "W_beta": (S + e) ** -0.5, "b_beta": (S + e) ** -0.5, **default}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("S", SIZES)
def test_initial_weights_fill_the_official_bounds(variant, S):
    model = seeded_model(variant, S, seed=0)
    W_k, b_k, W_beta, b_beta = model.dense_token_weights()
    weights = {"W_k": W_k, "b_k": b_k, "W_q": model.W_q.weight, "b_q": model.W_q.bias,
               "W_beta": W_beta, "b_beta": b_beta}
    family = model_family(variant)
    assert family == ("softmax" if variant == "softmax" else "linear")
    for name, bound in official_bounds(family, S).items():
        largest = weights[name].abs().max().item()
        assert largest <= bound, (name, largest, bound)
        if weights[name].numel() >= 1000:  # a uniform draw this large reaches within 1 % of its bound
            assert largest >= 0.99 * bound, (name, largest, bound)
            assert weights[name].std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05), name
    embedding = model.key_embedding.weight
    assert embedding.mean().abs() < 0.05 and embedding.std().item() == pytest.approx(1.0, rel=0.05)


def initial_score_std(W_k, b_k, W_q, b_q, key_embedding, S: int) -> float:
    """Std of q·k/√d_key over 8 Setting 1 sequences, every key queried (the same data each call)."""
    batch = sample_batch(1, S, 8, torch.Generator().manual_seed(0))
    queries = torch.arange(S).expand(8, -1)
    return dense_scores(W_k, b_k, W_q, b_q, key_embedding, batch["keys"], batch["values"], queries).std().item()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("S", SIZES)
def test_initial_attention_scores_match_the_official_model(variant, S):
    """Other seeds than the exact-match test: the statistics, not one draw, must agree."""
    model = seeded_model(variant, S, seed=21)
    W_k, b_k, _, _ = model.dense_token_weights()
    ours = initial_score_std(W_k, b_k, model.W_q.weight, model.W_q.bias, model.key_embedding.weight, S)
    official = official_model(variant == "softmax", S, embedding_size(S), D_KEY, seed=22)
    reference = initial_score_std(official.W_k.weight, official.W_k.bias, official.W_q.weight, official.W_q.bias,
                                  official.embeddingK.weight, S)
    # seed-to-seed spread of this std (measured over 6 seeds): ±12 % at S=20, under ±2 % at S ≥ 300;
    # the linear family's initialisation on softmax is off by 3.5× (S=20) to 4.3× (S=600)
    assert ours == pytest.approx(reference, rel=0.3 if S < 100 else 0.06), (ours, reference)
    if variant == "softmax":  # the official softmax model's scores stay O(1) at every S
        assert 0.4 < ours < 2.5, ours


def test_an_unknown_family_is_named():
    with pytest.raises(ValueError, match="family: got 'rnn'; expected 'softmax' or 'linear'"):
        official_initial_weights("rnn", 4, 8, 8)
