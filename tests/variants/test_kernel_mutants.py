"""Values the kernels' surviving mutants changed and no other test saw (issue 14 item 14).

Each test names the mutants it was written against; ``docs/mutation.md`` lists them all, with
the ones that are equivalent and why. References are independent of the code under test: plain
autograd through another form of the same rule in float64, or a float64 loop.

- The delta rule's fused write-then-read (:func:`delta_rule_write_read`) has a hand-written
  backward. Its gradients come back each in its own input's dtype, computed in the compute dtype:
  with one input in float64 and the others fp32 the float64 input's gradient equals plain
  autograd's float64 gradient to 1e-12 (a detour through another input's fp32 would miss by ~1e-8),
  and the fp32 inputs' gradients are that gradient rounded once.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fwbench.variants import VariantError, kernels
from fwbench.variants.kernels.chunking import chunk_length, split_chunks
from fwbench.variants.kernels.fla_dispatch import sum_rule_chunk_dispatch

#: float64 arithmetic agrees with float64 arithmetic to ~1e-15; one rounding to fp32 leaves ~1e-8.
FLOAT64_TOL = 1e-12
#: a float64 gradient rounded once to fp32: relative error ≤ 2⁻²⁴ ≈ 6e-8.
ROUNDED_TOL = 1e-6

DELTA_ARGS = ("q", "k", "v", "beta", "W0")


def delta_inputs(wide: str | None, *, T: int = 10, T_q: int = 2, d_dot: int = 4, d_v: int = 3, seed: int = 3):
    """Arguments of :func:`delta_rule_write_read`: fp32, the one named ``wide`` float64 with values
    fp32 cannot hold. Queries and keys positive and sum-normalised (φ-mapped), β in (0, 1)."""
    g = torch.Generator().manual_seed(seed)

    def features(*shape):
        x = F.elu(torch.randn(*shape, generator=g, dtype=torch.float64)) + 1.0
        return x / x.sum(-1, keepdim=True)

    given = {
        "q": features(2, 2, T_q, d_dot),
        "k": features(2, 2, T, d_dot),
        "v": torch.randn(2, 2, T, d_v, generator=g, dtype=torch.float64),
        "beta": torch.rand(2, 2, T, generator=g, dtype=torch.float64),
        "W0": 0.3 * torch.randn(2, 2, d_v, d_dot, generator=g, dtype=torch.float64),
    }
    return {name: x if name == wide else x.float() for name, x in given.items()}


def reference_delta_gradients(given: dict, grad_y: torch.Tensor, names=DELTA_ARGS) -> tuple[torch.Tensor, ...]:
    """Plain autograd through the chunkwise write and the read, all in float64."""
    wide = {name: x.detach().double().requires_grad_(name in names) for name, x in given.items()}
    _, W = kernels.delta_rule_chunk(None, wide["k"], wide["v"], wide["beta"], wide["W0"], chunk_size=3)
    y = kernels.delta_rule_read(wide["q"], W)
    return torch.autograd.grad(y, [wide[name] for name in names], grad_y.double())


@pytest.mark.parametrize("wide", DELTA_ARGS)
def test_delta_write_read_gradients_come_back_in_their_inputs_dtypes(wide):
    """Mutants ``_DeltaWriteRead.backward`` 119, 210, 225, 245 (a gradient cast to another input's
    dtype: q's to k's, k's to v's, β's to W0's, v's to β's)."""
    given = {name: x.requires_grad_() for name, x in delta_inputs(wide).items()}
    y = kernels.delta_rule_write_read(*(given[name] for name in DELTA_ARGS), chunk_size=4)
    assert y.dtype == torch.float64
    grad_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    grads = torch.autograd.grad(y, [given[name] for name in DELTA_ARGS], grad_y)
    expected = reference_delta_gradients(given, grad_y)
    for name, grad, ref in zip(DELTA_ARGS, grads, expected, strict=True):
        x = given[name]
        assert grad.dtype == x.dtype, f"{name}: {grad.dtype}"
        tol = FLOAT64_TOL if x.dtype == torch.float64 else ROUNDED_TOL
        torch.testing.assert_close(grad, ref.to(x.dtype), rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("name", DELTA_ARGS)
def test_delta_write_read_gives_the_gradient_of_one_input_alone(name):
    """Only ``name`` requires a gradient; two queries. Mutants ``_DeltaWriteRead.backward`` 120
    and 211 (a gradient not asked for returned as ``""``: autograd refuses it) and 138 (the
    broadcast rank-1 terms of the key gradient, right only for one query, taken for two)."""
    given = delta_inputs(None)
    given[name].requires_grad_()
    y = kernels.delta_rule_write_read(*(given[arg] for arg in DELTA_ARGS), chunk_size=4)
    grad_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(8))
    (grad,) = torch.autograd.grad(y, given[name], grad_y)
    (expected,) = reference_delta_gradients(given, grad_y, (name,))
    assert grad.dtype == torch.float32
    torch.testing.assert_close(grad.double(), expected, rtol=1e-5, atol=1e-6)


def test_delta_write_read_refuses_second_order_gradients_with_its_whole_message():
    """Mutants ``_DeltaWriteRead.backward`` 2, 3, 5, 6 (the error's text changed)."""
    given = {name: x.requires_grad_() for name, x in delta_inputs(None).items()}
    y = kernels.delta_rule_write_read(*(given[name] for name in DELTA_ARGS), chunk_size=4)
    with pytest.raises(VariantError) as raised:
        torch.autograd.grad(y.sum(), given["k"], create_graph=True)
    assert str(raised.value) == (
        "write_read: second-order gradients (create_graph=True) are not supported by the delta rule's "
        "fused write-then-read; use read(q, write(k, v, beta)) instead"
    )


@pytest.mark.parametrize("chunk_size", [3, 7])
def test_the_sum_rule_dispatch_without_fla_passes_its_chunk_size_on(chunk_size):
    """Without fla (CPU) the dispatch is :func:`sum_rule_chunk` with the chunk size given: the same
    bits, where the default chunk size (32: two chunks of 20 for 40 tokens) rounds otherwise.
    Mutant ``fla_dispatch.sum_rule_chunk_dispatch`` 35 (the chunk size not passed on)."""
    g = torch.Generator().manual_seed(5)
    q, k = (F.elu(torch.randn(2, 2, 40, 6, generator=g)) + 1 for _ in range(2))
    v = torch.randn(2, 2, 40, 5, generator=g)
    got = sum_rule_chunk_dispatch(q, k, v, chunk_size=chunk_size)
    expected = kernels.sum_rule_chunk(q, k, v, chunk_size=chunk_size)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert not torch.equal(got[0], kernels.sum_rule_chunk(q, k, v)[0])  # the chunk size shows in the bits


@pytest.mark.parametrize(("T", "chunk_size", "C"), [(120, 32, 30), (40, 32, 20), (33, 32, 17), (5, 32, 5),
                                                    (64, 32, 32), (1, 1, 1), (7, 3, 3)])
def test_chunk_length_balances_the_chunks(T, chunk_size, C):
    """C = ⌈T / N⌉ with N = ⌈T / chunk_size⌉, worked by hand (the chunking module's mutants had not
    run when this was written: its integer divisions and signs)."""
    assert chunk_length(T, chunk_size) == C


def test_split_chunks_pads_the_tail_with_zeros_in_the_compute_dtype():
    """7 tokens in chunks of at most 3: 3 chunks of 3, two zero rows of padding; d = 5 differs from
    B, H and T so that a size read from the wrong axis shows. The dtype: the widest of the tensors
    and fp32, or the one given."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(2, 3, 7, 5, generator=g), torch.randn(2, 3, 7, 1, generator=g, dtype=torch.float64)
    (chunks,) = split_chunks([x], 3)
    assert chunks.shape == (2, 3, 3, 3, 5) and chunks.dtype == torch.float32
    flat = chunks.reshape(2, 3, 9, 5)
    assert torch.equal(flat[:, :, :7], x) and torch.equal(flat[:, :, 7:], torch.zeros(2, 3, 2, 5))
    (half,) = split_chunks([x.bfloat16()], 3)
    assert half.dtype == torch.float32 and torch.equal(half, split_chunks([x.bfloat16().float()], 3)[0])
    xs, ys = split_chunks([x, y], 4)
    assert xs.dtype == ys.dtype == torch.float64 and xs.shape == (2, 3, 2, 4, 5) and ys.shape == (2, 3, 2, 4, 1)
    assert split_chunks([x], 3, torch.float64)[0].dtype == torch.float64


@pytest.mark.parametrize("wide", [None, "q", "k", "v", "beta", "W0", "z0"])
def test_the_sum_and_delta_recurrences_of_an_empty_sequence_keep_the_state_in_the_compute_dtype(wide):
    """T = 0: the state is W0 (z0) cast to the compute dtype (zeros without), y empty in v's dtype.
    Mutants ``sum_rule.sum_rule_recurrent`` 18 (the initial state in dtype None: W0 kept in its own
    dtype), ``delta_rule._initial_state`` 7, 12 (zeros in k's dtype), ``delta_rule.delta_rule_chunk``'s
    T = 0 branch (a write's reads not None, the state's dtype); ``delta_rule.delta_rule_parallel`` 21
    (T = 0 taken down the general path) survives it: that path gives the same."""
    g = torch.Generator().manual_seed(4)
    given = {"q": torch.rand(2, 2, 0, 4, generator=g, dtype=torch.float64),
             "k": torch.rand(2, 2, 0, 4, generator=g, dtype=torch.float64),
             "v": torch.randn(2, 2, 0, 3, generator=g, dtype=torch.float64),
             "beta": torch.rand(2, 2, 0, generator=g, dtype=torch.float64),
             "W0": torch.randn(2, 2, 3, 4, generator=g, dtype=torch.float64),
             "z0": torch.rand(2, 2, 4, generator=g, dtype=torch.float64)}
    given = {name: x if name == wide else x.float() for name, x in given.items()}
    dtype = torch.float64 if wide in ("q", "k", "v", "W0", "z0") else torch.float32
    y, W, z = kernels.sum_rule_recurrent(given["q"], given["k"], given["v"], given["W0"], given["z0"])
    assert y.shape == (2, 2, 0, 3) and y.dtype == given["v"].dtype
    assert W.dtype == z.dtype == dtype
    assert torch.equal(W, given["W0"].to(dtype)) and torch.equal(z, given["z0"].to(dtype))
    chunk_write = kernels.delta_rule_chunk(None, given["k"], given["v"], given["beta"], given["W0"])
    assert chunk_write[0] is None and torch.equal(chunk_write[1], given["W0"].to(torch.float64 if wide in (
        "k", "v", "beta", "W0") else torch.float32))  # a write: no reads, and q has no say in the dtype
    for form in (kernels.delta_rule_parallel, kernels.delta_rule_recurrent, kernels.delta_rule_chunk):
        y, W = form(given["q"], given["k"], given["v"], given["beta"], given["W0"])
        assert y.shape == (2, 2, 0, 3) and y.dtype == given["v"].dtype
        delta_dtype = torch.float64 if wide in ("q", "k", "v", "beta", "W0") else torch.float32
        assert W.dtype == delta_dtype and torch.equal(W, given["W0"].to(delta_dtype)), form.__name__
        _, W = form(given["q"], given["k"], given["v"], given["beta"])  # zeros, in the compute dtype of the rest
        expected = torch.zeros(2, 2, 3, 4, dtype=torch.float64 if wide in ("q", "k", "v", "beta") else torch.float32)
        assert W.dtype == expected.dtype and torch.equal(W, expected), form.__name__


def test_the_recurrences_refuse_queries_keys_and_values_of_different_lengths():
    """Mutants ``sum_rule.sum_rule_recurrent`` 28, 32, 42 and ``delta_rule.delta_rule_recurrent`` 23,
    25, 29 (``zip(strict=True)`` relaxed: the longer sequences silently cut to the shortest)."""
    q, k, v = torch.rand(1, 1, 5, 4), torch.rand(1, 1, 6, 4), torch.randn(1, 1, 6, 3)
    with pytest.raises(ValueError, match="zip"):
        kernels.sum_rule_recurrent(q, k, v)
    with pytest.raises(ValueError, match="zip"):
        kernels.delta_rule_recurrent(q, k, v, torch.rand(1, 1, 6))


@pytest.mark.parametrize("with_reads", [True, False])
def test_the_delta_chunk_form_leaves_the_callers_state_unchanged(with_reads):
    """Without autograd the chunk scan updates its state in place, on a copy: W0 is left as given.
    Mutant ``delta_rule._chunk_scan`` 66 (the copy made only when recording)."""
    given = delta_inputs(None, T=9, T_q=9)
    W0 = given["W0"].clone()
    with torch.no_grad():
        kernels.delta_rule_chunk(given["q"] if with_reads else None, given["k"], given["v"], given["beta"], W0, chunk_size=4)
    assert torch.equal(W0, given["W0"])


def test_the_delta_chunk_forms_rescan_after_an_overflow_keeps_the_carried_state():
    """A key of 1e20 at token 4 is finite, but products with it overflow fp32 inside its chunk
    (tokens 3–5), and the plain product's zeros carry them back to token 3; the chunk form then scans
    again with the masked product, from W0 still. The reads before that token are the recurrence's.
    Mutants ``delta_rule.delta_rule_chunk`` 54–56 (the rescan skipped) and 57–66 (the rescan without
    W0, or broken)."""
    given = delta_inputs(None, T=9, T_q=9)
    given["k"][0, 1, 4] = 1e20
    y, _ = kernels.delta_rule_chunk(given["q"], given["k"], given["v"], given["beta"], given["W0"], chunk_size=4)
    expected, _ = kernels.delta_rule_recurrent(given["q"], given["k"], given["v"], given["beta"], given["W0"])
    torch.testing.assert_close(y[:, :, :4], expected[:, :, :4], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y[1], expected[1], rtol=1e-5, atol=1e-6)
