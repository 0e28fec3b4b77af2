"""The code-free read of one-hot values (issue 16.4) equals the variant's own read of dense codes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from helpers import SPECS, assert_close

from fwbench.tasks.key_rows import KeyRows
from fwbench.tasks.one_hot_read import one_hot_codes, one_hot_write_read, reads_one_hot
from fwbench.tasks.retrieval import RetrievalModel, last_occurrence_values, retrieval_loss, sample_batch
from fwbench.variants import DPFP, FastWeightAttention, SoftmaxAttention, VariantError, build_attention
from fwbench.variants.kernels import sum_rule
from fwbench.variants.kernels.dpfp import dpfp
from fwbench.variants.rules.base import UpdateRule

CODE_FREE = [spec for spec in SPECS if reads_one_hot(build_attention(spec, 8))]


def test_code_free_reads_cover_softmax_and_the_sum_rule_only():
    assert set(CODE_FREE) == {"softmax", "linear", "favor:m=16", "dpfp:nu=1", "dpfp:nu=2"}
    assert not reads_one_hot(SoftmaxAttention(8, window=4))
    with pytest.raises(ValueError, match="attention: got"):
        one_hot_write_read(build_attention("dpfp-delta:nu=2", 8), torch.randn(1, 1, 3, 8),
                           torch.zeros(1, 3, dtype=torch.long), torch.randn(1, 1, 1, 8), 4)


def test_one_hot_codes_are_identity_rows():
    values = torch.tensor([[2, 0, 2], [1, 1, 3]])
    assert torch.equal(one_hot_codes(values, 4), torch.eye(4)[values])


@pytest.mark.parametrize("variant", CODE_FREE)
@pytest.mark.parametrize("setting", [1, 2])  # Setting 2 repeats values: weights of one column add up
def test_model_answer_and_gradients_equal_the_dense_codes_read(variant, setting):
    S = 23
    torch.manual_seed(4)
    model = RetrievalModel(variant, S=S, d_key=16)
    batch = sample_batch(setting, S, 5, torch.Generator().manual_seed(6))
    keys, values = batch["keys"], batch["values"]
    for queries in (batch["queries"], torch.arange(S).expand(5, -1)):  # training (one query), evaluation
        targets = last_occurrence_values(keys, values, queries)[0]
        fast = model(keys, values, queries)
        fast_grads = torch.autograd.grad(retrieval_loss(fast, targets, S), list(model.parameters()), allow_unused=True)
        # the variant's own write_read on the dense (B, 1, L, S) codes, from the same projections
        key_by_value, key_by_key, _, _ = model.token_projections()
        k = (key_by_value[values] + key_by_key[keys])[:, None]
        q = model.W_q(model.key_embedding.weight)[queries][:, None]
        dense = model.attention.write_read(k, torch.eye(S)[values][:, None], q)[:, 0]
        dense_grads = torch.autograd.grad(retrieval_loss(dense, targets, S), list(model.parameters()), allow_unused=True)
        assert_close(fast, dense, rel_rmse=1e-5)
        for (name, _), a, b in zip(model.named_parameters(), fast_grads, dense_grads):
            assert (a is None) == (b is None), name
            if a is not None:
                assert_close(a, b, rel_rmse=1e-4)


class _ShiftedDPFP(DPFP):
    """A user's DPFP subclass with keys mapped otherwise: φ(x) = DPFP(x) + 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dpfp(x, self.nu) + 1.0


@dataclass(frozen=True)
class _HalfRule(UpdateRule):
    """A user's rule that carries the normaliser z but reads half the sum rule's answer."""

    def write(self, pk, v, beta, W0, z0, chunk_size):
        return sum_rule.sum_rule_write(pk, v, W0, z0)

    def read(self, pq, W, z):
        return 0.5 * sum_rule.sum_rule_read(pq, W, z)


def test_a_users_dpfp_subclass_or_rule_reads_as_its_own_write_read():
    # the code-free read took every DPFP subclass's keys as DPFP's (φ(k) = DPFP(k) + 1 read with
    # DPFP(k): outputs off by 0.33) and every rule carrying z as the sum rule (a rule reading half the
    # sum rule's answer read the whole: off by 0.5), on the table path and the lookup path alike
    half = _HalfRule(name="half", key="half", description="", source="", kernels={"recurrent": None},
                     auto_form="recurrent", uses_beta=False, carries_normalizer=True, sum_normalize=False)
    S, d_key = 23, 8
    for attention in (FastWeightAttention(_ShiftedDPFP(d_key, 2)), FastWeightAttention(DPFP(d_key, 1), rule=half)):
        torch.manual_seed(4)
        model = RetrievalModel("dpfp:nu=1", S=S, d_key=d_key)
        model.attention = attention
        batch = sample_batch(1, S, 5, torch.Generator().manual_seed(6))
        keys, values = batch["keys"], batch["values"]
        for queries in (batch["queries"], torch.arange(S).expand(5, -1)):
            key_by_value, key_by_key, _, _ = model.token_projections()
            k = (key_by_value[values] + key_by_key[keys])[:, None]
            q = model.W_q(model.key_embedding.weight)[queries][:, None]
            dense = attention.write_read(k, torch.eye(S)[values][:, None], q)[:, 0]
            assert_close(model(keys, values, queries), dense, rel_rmse=1e-5)
    assert reads_one_hot(FastWeightAttention(_ShiftedDPFP(d_key, 2)))
    assert not reads_one_hot(FastWeightAttention(DPFP(d_key), rule=half))


@pytest.mark.parametrize("variant", ["softmax", "linear", "dpfp:nu=1"])
def test_queries_of_other_heads_than_the_keys_are_refused_as_write_read_refuses_them(variant):
    # two heads of queries against one head's keys: softmax's and the dot-product reads broadcast
    # them (an answer per query head), DPFP's refused them as "phi_q: got shape (2, 2, 1, 8)", an
    # argument the caller never gave; the variant's own write_read names q
    attention = build_attention(variant, 4)
    g = torch.Generator().manual_seed(0)
    table_a, table_b = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    values = torch.randint(0, 6, (2, 5), generator=g)
    q = torch.randn(2, 2, 1, 4, generator=g)
    message = r"^q: got \(2, 2, 1, 4\); expected a tensor of shape \(B, H, T_q, d_key\) = \(2, 1, 'T_q', 4\)$"
    for k in (KeyRows(table_a, values, table_b, values), KeyRows(table_a, values, table_b, values).materialise()):
        with pytest.raises(VariantError, match=message):
            one_hot_write_read(attention, k, values, q, 6)
    if variant != "softmax":  # softmax's write_read names its cache instead
        with pytest.raises(VariantError, match=message):
            attention.write_read(KeyRows(table_a, values, table_b, values).materialise(), one_hot_codes(values, 6)[:, None], q)


@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_packed_softmax_retrieval_models_answer_under_cpu_autocast_as_each_model_does(form):
    """The packed twin of the retrieval model (the harness's packed runs) under bf16 autocast: its keys add an
    fp32 table to a bf16 projection, its queries are bf16, and softmax refused its own write-then-read
    ('q.dtype: got torch.bfloat16; expected the dtype of k (torch.float32)'), where the single model casts
    its queries since bcb142f. Now both share one write-then-read, and each packed run equals its model's."""
    from fwbench.tasks.retrieval_pack import PackedRetrievalModel

    torch.manual_seed(0)
    models = [RetrievalModel("softmax", 8, d_key=8, form=form) for _ in range(2)]
    generator = torch.Generator().manual_seed(0)
    keys, values = (torch.randint(0, 8, (2, 3, 7), generator=generator) for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed = PackedRetrievalModel(models)(keys, values, keys[:, :, :3])
        for run, model in enumerate(models):
            torch.testing.assert_close(packed[run], model(keys[run], values[run], keys[run, :, :3]), rtol=0.02, atol=0.01)


def test_packing_models_with_per_run_state_is_refused_in_one_line():
    """Break-it pass X: PackedRetrievalModel's refusal of FAVOR+ models (their random features are per-run state)
    held the attention module's repr, four lines long. It is one line, and names the feature map."""
    from fwbench.tasks.retrieval import RetrievalModel
    from fwbench.tasks.retrieval_pack import PackedRetrievalModel

    with pytest.raises(ValueError) as refused:
        PackedRetrievalModel([RetrievalModel("favor:m=8", 8, d_key=8) for _ in range(2)])
    message = str(refused.value)
    assert "\n" not in message and message.startswith("models: FastWeightAttention(")
    assert "Favor(d_key=8, m=8, d_dot=16)" in message and message.endswith("expected a stateless attention")
