"""Read scores of one query taken straight from the key tables (:mod:`fwbench.tasks.key_rows`,
issue 16.4) against the lookup path: the keys looked up (``row_sums``), then q·k or φ(q)·φ(k) by the
paper's definitions (softmax Eq. 1–2, DPFP Eq. 27–28), differentiated by plain autograd."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers import assert_close

from fwbench.tasks import key_rows, one_hot_read
from fwbench.tasks.key_rows import KeyRows, row_sums, table_scores
from fwbench.tasks.retrieval import RetrievalModel, retrieval_loss, sample_batch
from fwbench.variants import NonFiniteError, set_check_finite
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores


def paper_dpfp(x: torch.Tensor, nu: int) -> torch.Tensor:
    """φ(x): r = [relu(x), relu(−x)], block i = r ⊙ roll(r, i), i = 1..ν."""
    r = torch.cat([x.relu(), (-x).relu()], dim=-1)
    return torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)


def inputs(kind: str, nu: int, dtype=torch.float64, B=3, T=11, d=5, n_a=4, n_b=6, seed=0):
    """Tables with fewer rows than tokens (rows read many times: their gradients add up) and ids."""
    g = torch.Generator().manual_seed(seed)
    table_a = torch.randn(n_a, d, generator=g, dtype=dtype)
    table_b = torch.randn(n_b, d, generator=g, dtype=dtype)
    ids_a, ids_b = torch.randint(0, n_a, (B, T), generator=g), torch.randint(0, n_b, (B, T), generator=g)
    width = d if kind == "dot" else 2 * d * nu
    if kind == "dpfp":  # φ(q) is non-negative
        return table_a, ids_a, table_b, ids_b, torch.rand(B, width, generator=g, dtype=dtype) + 0.1
    return table_a, ids_a, table_b, ids_b, torch.randn(B, width, generator=g, dtype=dtype)


def lookup_scores(table_a, ids_a, table_b, ids_b, query, kind, nu):
    k = row_sums(table_a, ids_a, table_b, ids_b)
    features = k if kind == "dot" else paper_dpfp(k, nu)
    return (features * query[:, None, :]).sum(-1)


CASES = [("dot", 0), ("dpfp", 1), ("dpfp", 2), ("dpfp", 5)]


@pytest.mark.parametrize(("kind", "nu"), CASES)
def test_scores_and_gradients_equal_the_lookup_path_in_float64(kind, nu):
    table_a, ids_a, table_b, ids_b, query = inputs(kind, nu)
    leaves = [x.clone().requires_grad_() for x in (table_a, table_b, query)]
    refs = [x.clone().requires_grad_() for x in (table_a, table_b, query)]
    fast = table_scores(KeyRows(leaves[0], ids_a, leaves[1], ids_b), leaves[2], kind, nu)
    reference = lookup_scores(refs[0], ids_a, refs[1], ids_b, refs[2], kind, nu)
    assert fast.shape == (3, 11) and fast.dtype == torch.float64
    torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-12)
    grad = torch.randn(3, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    for a, b in zip(torch.autograd.grad(fast, leaves, grad), torch.autograd.grad(reference, refs, grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("nu", [1, 3])
def test_fp32_dpfp_scores_are_those_of_the_looked_up_keys_bit_for_bit(nu):
    table_a, ids_a, table_b, ids_b, _ = inputs("dpfp", nu, dtype=torch.float32, B=4, T=50, d=16, n_a=50, n_b=50)
    phi_q = paper_dpfp(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)), nu)
    fast = table_scores(KeyRows(table_a, ids_a, table_b, ids_b), phi_q, "dpfp", nu)
    k = row_sums(table_a, ids_a, table_b, ids_b)
    assert torch.equal(fast, dpfp_query_scores(k, phi_q[:, None], nu)[..., 0])


@pytest.mark.parametrize(("kind", "nu"), [("dot", 0), ("dpfp", 2)])
def test_second_derivatives_by_gradgradcheck(kind, nu):
    table_a, ids_a, table_b, ids_b, query = inputs(kind, nu, B=2, T=4, d=3, n_a=3, n_b=2)
    leaves = [x.clone().requires_grad_() for x in (table_a, table_b, query)]
    assert torch.autograd.gradgradcheck(lambda a, b, q: table_scores(KeyRows(a, ids_a, b, ids_b), q, kind, nu), leaves)


def test_bad_ids_kind_and_query_shape_are_refused_naming_the_argument():
    table_a, ids_a, table_b, ids_b, query = inputs("dot", 0)
    with pytest.raises(ValueError, match=r"ids_a: got ids in \[0, 4\]; expected rows of its table, in \[0, 4\)"):
        table_scores(KeyRows(table_a, ids_a.clamp(max=3).index_fill(1, torch.tensor([0]), 4), table_b, ids_b), query, "dot")
    with pytest.raises(ValueError, match=r"ids_b: got ids in \[-1, "):
        table_scores(KeyRows(table_a, ids_a, table_b, ids_b - 1), query, "dot")
    with pytest.raises(ValueError, match="kind: got 'softmax'; expected 'dot' or 'dpfp'"):
        table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query, "softmax")
    with pytest.raises(ValueError, match=r"query: got shape \(3, 5\); expected \(3, 20\)"):
        table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query, "dpfp", 2)
    # the compiled loops do not check bounds: ids_b of (3, 2) beside ids_a of (3, 11) read past its
    # memory (scores of 1e31, or a segmentation fault), as did a narrower table_b
    with pytest.raises(ValueError, match=r"^ids_b: got torch.int64 ids of shape \(3, 2\); expected int64 \(or int32\) "
                                         r"ids of shape \(B, T\), one shape for ids_a and ids_b$"):
        table_scores(KeyRows(table_a, ids_a, table_b, ids_b[:, :2]), query, "dot")
    with pytest.raises(ValueError, match=r"^ids_a: got torch.float32 ids of shape \(3, 11\)"):
        table_scores(KeyRows(table_a, ids_a.float(), table_b, ids_b), query, "dot")
    with pytest.raises(ValueError, match=r"^table_b: got shape \(6, 4\) beside table_a's \(4, 5\); expected two "
                                         r"\(n, d_key\) tables of one d_key$"):
        table_scores(KeyRows(table_a, ids_a, table_b[:, :4], ids_b), query, "dot")
    # a table_a of another rank was blamed on table_b ("table_b: got shape (6, 5) beside table_a's (5,)")
    for bad in (table_a[0], table_a[None]):
        with pytest.raises(ValueError, match=rf"^table_a: got shape {re.escape(str(tuple(bad.shape)))}; "
                                             r"expected an \(n, d_key\) table$"):
            table_scores(KeyRows(bad, ids_a, table_b, ids_b), query, "dot")
    # ν outside [1, d_key]: "torch.cat(): expected a non-empty list" (0) or a size mismatch (6)
    for nu in (0, 6):
        with pytest.raises(ValueError, match=rf"^nu: got {nu}; expected an integer in \[1, d_key=5\] for kind='dpfp'$"):
            table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query.new_ones(3, 10 * nu), "dpfp", nu)
    # an integer as the feature maps take one: True was taken as ν = 1, NumPy's 2 refused as "not an integer"
    for nu in (True, 2.0):
        with pytest.raises(ValueError, match=rf"^nu: got {nu}; expected an integer in \[1, d_key=5\] for kind='dpfp'$"):
            table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query.new_ones(3, 10 * int(nu)), "dpfp", nu)
    query = query.new_ones(3, 20)
    torch.testing.assert_close(table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query, "dpfp", np.int64(2)),
                               table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query, "dpfp", 2), rtol=0, atol=0)


@pytest.mark.parametrize("device", ["meta"] + (["cuda"] if torch.cuda.is_available() else []))
def test_a_tensor_off_the_cpu_is_refused_naming_the_argument(device):
    # the compiled loops read memory through NumPy: "TypeError: can't convert cuda:0 device type tensor
    # to numpy" (meta: the same) from deep in the op, for every argument
    arguments = dict(zip(("table_a", "ids_a", "table_b", "ids_b", "query"), inputs("dpfp", 1)))
    for name in arguments:
        moved = {**arguments, name: arguments[name].to(device)}
        query = moved.pop("query")
        with pytest.raises(ValueError, match=rf"^{name}: got a tensor on {device}(:0)?; expected a CPU tensor \(the "
                                             r"compiled loops run on CPU; elsewhere look the keys up with "
                                             r"KeyRows.materialise\(\)\)$"):
            table_scores(KeyRows(**moved), query, "dpfp", 1)


def test_a_nan_table_row_reaches_only_the_tokens_that_read_it():
    table_a, ids_a, table_b, ids_b, query = inputs("dpfp", 1, dtype=torch.float32)
    clean = table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query, "dpfp", 1)
    table_a[2, 1] = float("nan")
    out = table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query, "dpfp", 1)
    readers = ids_a == 2
    assert readers.any() and (~readers).any()
    assert torch.isnan(out[readers]).all()
    assert torch.equal(out[~readers], clean[~readers])


def training_losses(variant: str, table_path: bool, monkeypatch, dtype=torch.float32) -> list[float]:
    if not table_path:  # the lookup path: keys formed, then one_hot_write_read's own scores
        monkeypatch.setattr(one_hot_read, "table_scores_apply", lambda keys, q: False)
    torch.manual_seed(3)
    model = RetrievalModel(variant, S=40, d_key=16).to(dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator, out = torch.Generator().manual_seed(5), []
    for _ in range(6):
        batch = sample_batch(1, 40, 8, generator)
        loss = retrieval_loss(model(batch["keys"], batch["values"], batch["queries"]), batch["targets"], 40)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("variant", ["softmax", "dpfp:nu=1", "dpfp:nu=3"])
def test_setting1_training_takes_the_table_path_and_gives_the_lookup_paths_losses(variant, monkeypatch):
    calls = []
    original = key_rows.table_scores
    monkeypatch.setattr(one_hot_read, "table_scores", lambda *a: calls.append(a[2]) or original(*a))
    fast = training_losses(variant, True, monkeypatch)
    assert calls == ["dot" if variant == "softmax" else "dpfp"] * 6
    reference = training_losses(variant, False, monkeypatch)
    assert_close(torch.tensor(fast), torch.tensor(reference), rel_rmse=1e-5)
    assert fast[-1] != fast[0]
    fast64 = training_losses(variant, True, monkeypatch, torch.float64)
    reference64 = training_losses(variant, False, monkeypatch, torch.float64)
    torch.testing.assert_close(torch.tensor(fast64, dtype=torch.float64), torch.tensor(reference64, dtype=torch.float64),
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("variant", ["softmax", "dpfp:nu=1"])
def test_a_non_finite_key_table_is_named_when_the_check_is_on_as_the_lookup_path_names_it(variant, monkeypatch):
    # issue 14 kinds 4 and 13: the table path checked the whole tables, so an inf in a row that a token
    # reads was named at the table's index ("k: got inf at index (3, 2)") where the lookup path names
    # the key's, and one in a row no token reads was refused where the lookup path (CUDA, evaluation)
    # reads on: the same batch diverged on CPU only
    torch.manual_seed(0)
    model = RetrievalModel(variant, S=60, d_key=8)
    set_check_finite(model, True)
    batch = sample_batch(2, 60, 1, torch.Generator().manual_seed(0))  # Setting 2: values repeat, some unread
    read, unread = int(batch["values"][0, 2]), sorted(set(range(60)) - set(batch["values"].flatten().tolist()))[0]
    clean = model(batch["keys"], batch["values"], batch["queries"])
    with torch.no_grad():
        model.key_by_value[unread, 2] = float("inf")
    torch.testing.assert_close(model(batch["keys"], batch["values"], batch["queries"]), clean, rtol=0, atol=0)
    with torch.no_grad():
        model.key_by_value[read, 2] = float("inf")
    messages = []
    for table_path in (True, False):
        if not table_path:
            monkeypatch.setattr(one_hot_read, "table_scores_apply", lambda keys, q: False)
        with pytest.raises(NonFiniteError) as error:
            model(batch["keys"], batch["values"], batch["queries"])
        messages.append(str(error.value))
    first = (batch["values"] == read).nonzero()[0].tolist()
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"k: got inf at index ({first[0]}, 0, {first[1]}, 2)")


@pytest.mark.parametrize("variant", ["softmax", "dpfp:nu=1"])
def test_finite_tables_whose_rows_sum_past_fp32_are_refused_as_the_lookup_path_refuses(variant):
    # issue 14 kinds 4 and 13: 3e38 + 3e38 overflows fp32, so the key of the token with value 4 is inf;
    # with the check on, the table path returned NaN predictions where the looked-up keys are refused
    torch.manual_seed(0)
    model = RetrievalModel(variant, S=6, d_key=4)
    set_check_finite(model, True)
    keys, values, queries = torch.tensor([[0, 1, 2]]), torch.tensor([[3, 4, 5]]), torch.tensor([[1]])
    with torch.no_grad():
        model.key_by_value[4] = 3e38
        model.key_projection.weight.zero_()
        model.key_projection.bias.fill_(3e38)
    with pytest.raises(NonFiniteError) as table_path:
        model(keys, values, queries)
    key_rows = KeyRows(model.key_by_value, values, model.key_projection(model.key_embedding.weight), keys)
    q = model.query_projections(queries)[:, None]
    with pytest.raises(NonFiniteError) as lookup_path:
        one_hot_read.one_hot_write_read(model.attention, key_rows.materialise(), values, q, 6)
    assert str(table_path.value).startswith("k: got inf at index (0, 0, 1, 0)")
    assert str(table_path.value) == str(lookup_path.value)


@pytest.mark.parametrize(("kind", "nu"), CASES)
@pytest.mark.parametrize("wide", ["query", "tables"])
def test_mixed_dtypes_are_scored_in_the_wider_one(kind, nu, wide):
    """fp32 tables with a float64 query (or the reverse) are scored in float64, as the lookup path
    computes them: a forward that took its compute dtype from the tables alone scored the float64
    query in fp32 (errors about 1e-7) and returned fp32 (mutation pass of stop 27)."""
    table_a, ids_a, table_b, ids_b, query = inputs(kind, nu)
    if wide == "query":
        table_a, table_b = table_a.float(), table_b.float()
    else:
        query = query.float()
    leaves = [x.clone().requires_grad_() for x in (table_a, table_b, query)]
    fast = table_scores(KeyRows(leaves[0], ids_a, leaves[1], ids_b), leaves[2], kind, nu)
    reference = lookup_scores(table_a.double(), ids_a, table_b.double(), ids_b, query.double(), kind, nu)
    assert fast.dtype == torch.float64
    torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(fast.sum(), leaves)
    assert [g.dtype for g in grads] == [x.dtype for x in leaves]


def test_the_table_path_serves_only_one_head_and_one_query_on_the_cpu():
    """table_scores reads q[:, 0, 0]: a second head or a second query must take the lookup path, or
    their scores would be head 0's (mutation pass of stop 27: no test held more than one head)."""
    table_a, ids_a, table_b, ids_b, _ = inputs("dot", 0)
    keys = KeyRows(table_a, ids_a, table_b, ids_b)
    B, d = ids_a.shape[0], table_a.shape[1]
    assert key_rows.table_scores_apply(keys, torch.zeros(B, 1, 1, d))
    assert not key_rows.table_scores_apply(keys, torch.zeros(B, 2, 1, d))
    assert not key_rows.table_scores_apply(keys, torch.zeros(B, 1, 2, d))
    on_meta = KeyRows(table_a.to("meta"), ids_a.to("meta"), table_b.to("meta"), ids_b.to("meta"))
    assert not key_rows.table_scores_apply(on_meta, torch.zeros(B, 1, 1, d, device="meta"))


@pytest.mark.parametrize(("kind", "nu"), [("dot", 0), ("dpfp", 2)])
def test_int32_ids_give_the_int64_ids_scores(kind, nu):
    """The docstring promises int32 ids as well as int64 (the compiled loops take either)."""
    table_a, ids_a, table_b, ids_b, query = inputs(kind, nu)
    wide = table_scores(KeyRows(table_a, ids_a, table_b, ids_b), query, kind, nu)
    narrow = table_scores(KeyRows(table_a, ids_a.int(), table_b, ids_b.int()), query, kind, nu)
    torch.testing.assert_close(narrow, wide, rtol=0, atol=0)


@pytest.mark.parametrize(("kind", "nu"), CASES)
def test_first_derivatives_taken_with_create_graph_are_the_lookup_paths(kind, nu):
    """With ``create_graph=True`` the backward differentiates ``_scores_composed`` (the keys looked
    up and scored by plain ops) instead of the compiled loops. gradgradcheck checks that path only
    against itself, so a recomputation that read table_b at the wrong ids (ids_a, or ids_b flipped
    along T) passed; the right value is the lookup path's gradient, keys formed with row_sums."""
    table_a, ids_a, table_b, ids_b, query = inputs(kind, nu)
    leaves = [x.clone().requires_grad_() for x in (table_a, table_b, query)]
    refs = [x.clone().requires_grad_() for x in (table_a, table_b, query)]
    fast = table_scores(KeyRows(leaves[0], ids_a, leaves[1], ids_b), leaves[2], kind, nu)
    reference = lookup_scores(refs[0], ids_a, refs[1], ids_b, refs[2], kind, nu)
    grad = torch.randn(3, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(fast, leaves, grad, create_graph=True)
    expected = torch.autograd.grad(reference, refs, grad)
    for a, b in zip(got, expected, strict=True):
        assert a.requires_grad
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("nu", [1, 2])
def test_a_non_finite_dpfp_query_is_scored_against_the_looked_up_keys(nu):
    """A φ(q) holding inf takes ``_scores_composed`` (the compiled loops would score 0 · inf as 0).
    Only sequence 0's query holds the inf, so the other sequences' scores stay finite and must equal
    φ(k)·φ(q) of their looked-up keys: a composed path reading table_b at the wrong ids (ids_a, or
    ids_b flipped along T) gave other keys' scores. Sequence 0's scores are inf where the feature
    meeting the inf is positive and NaN where it is 0 (0 · inf), as the plain product has them."""
    table_a, ids_a, table_b, ids_b, query = inputs("dpfp", nu)
    query[0, 1] = float("inf")
    leaves = [x.clone().requires_grad_() for x in (table_a, table_b)]
    got = table_scores(KeyRows(leaves[0], ids_a, leaves[1], ids_b), query, "dpfp", nu)
    expected = lookup_scores(table_a, ids_a, table_b, ids_b, query, "dpfp", nu)
    assert torch.isfinite(expected[1:]).all() and not torch.isfinite(expected[0]).any()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    finite = torch.randn(2, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    grads = torch.autograd.grad(got[1:], leaves, finite)
    refs = [x.clone().requires_grad_() for x in (table_a, table_b)]
    expected_grads = torch.autograd.grad(lookup_scores(refs[0], ids_a, refs[1], ids_b, query, "dpfp", nu)[1:],
                                         refs, finite)
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
