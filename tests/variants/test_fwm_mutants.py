"""Values of the FWM rule that its surviving mutants changed and no other test saw (issue 14 item
14; ``docs/mutation.md`` lists them all). The reference is the float64 loop of the rule's
equations, ``fwm_naive`` of ``test_fwm_rule.py``."""

from __future__ import annotations

import pytest
import torch
from test_fwm_rule import fwm_naive

from fwbench.variants.kernels import fwm_rule_recurrent, fwm_rule_write

B, H, T, D_DOT, D_V = 2, 2, 5, 4, 3
FWM_ARGS = ("q", "k", "v", "beta", "W0")


def fwm_args(T: int, wide: str | None = None, seed: int = 4) -> dict[str, torch.Tensor]:
    """fp32 arguments of the FWM rule, the one named ``wide`` in float64 with values fp32 cannot hold."""
    g = torch.Generator().manual_seed(seed)
    given = {
        "q": torch.rand(B, H, T, D_DOT, generator=g, dtype=torch.float64),
        "k": torch.rand(B, H, T, D_DOT, generator=g, dtype=torch.float64),
        "v": torch.randn(B, H, T, D_V, generator=g, dtype=torch.float64),
        "beta": torch.rand(B, H, T, generator=g, dtype=torch.float64),
        "W0": 0.2 * torch.randn(B, H, D_V, D_DOT, generator=g, dtype=torch.float64),
    }
    return {name: x if name == wide else x.float() for name, x in given.items()}


@pytest.mark.parametrize("wide", [None, *FWM_ARGS])
@pytest.mark.parametrize("carried", ["W0", "zeros", "non-finite W0"])
def test_an_empty_fwm_sequence_returns_the_carried_state_in_the_compute_dtype(wide, carried):
    """T = 0: nothing is written, the state is W0 (zeros without one, NaN and inf as given) in the
    wider of the arguments' dtypes and fp32, and the reads are an empty tensor in v's dtype.
    Mutants ``fwm_rule_recurrent`` 1 and 4–22, ``fwm_rule_write`` 1 and 3–19 (the T = 0 branch: the
    token axis, its state built without k, v or W0, or in a dtype missing one argument)."""
    given = fwm_args(0, wide)
    if carried == "zeros":
        given["W0"] = None
    elif carried == "non-finite W0":
        given["W0"][0, 1, 2, 3], given["W0"][1, 0, 0, 0] = float("nan"), float("inf")

    def carried_state(args: tuple[str, ...]) -> torch.Tensor:
        dtype = torch.float64 if wide in args and given[wide] is not None else torch.float32
        return torch.zeros(B, H, D_V, D_DOT, dtype=dtype) if given["W0"] is None else given["W0"].to(dtype)

    def assert_equal(W: torch.Tensor, expected: torch.Tensor) -> None:
        assert W.dtype == expected.dtype and torch.equal(W.isnan(), expected.isnan())
        assert torch.equal(torch.nan_to_num(W), torch.nan_to_num(expected))

    y, W = fwm_rule_recurrent(*(given[name] for name in FWM_ARGS))
    assert y.shape == (B, H, 0, D_V) and y.dtype == given["v"].dtype
    assert_equal(W, carried_state(FWM_ARGS))
    assert_equal(fwm_rule_write(*(given[name] for name in FWM_ARGS[1:])), carried_state(FWM_ARGS[1:]))


def test_an_fwm_write_of_one_token_writes_it():
    """Mutant ``fwm_rule_write`` 3 (``T == 1`` taken for the empty sequence: one token not written)."""
    given = fwm_args(1)
    W = fwm_rule_write(given["k"], given["v"], given["beta"], given["W0"])
    _, expected = fwm_naive(*(given[name] for name in FWM_ARGS))
    torch.testing.assert_close(W.double(), expected, rtol=1e-5, atol=1e-6)


def test_the_fwm_recurrence_layer_norms_with_the_given_eps():
    """eps = 0.5, far from torch's default 1e-5. Mutant ``fwm_rule_recurrent`` 40 (eps not passed)."""
    given = fwm_args(T)
    y, _ = fwm_rule_recurrent(*(given[name] for name in FWM_ARGS), eps=0.5)
    expected, _ = fwm_naive(*(given[name] for name in FWM_ARGS), eps=0.5)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)


def test_an_fwm_value_that_overflows_a_chunk_is_scanned_token_by_token_also_under_autograd():
    """A finite value whose square overflows fp32 in the chunked scan (3e19 in every entry of v at
    token 3): with gradients recorded, the outputs are those without (token-by-token scan), and the
    first-order gradients under create_graph=True are those without it, finite before that token.
    Mutants ``_FlushedScan.forward`` 13 and ``backward`` 3 (the chunk size not passed on: the
    default, 16, scans the overflowing chunk whole)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.rand(2, 1, 1, 6, 4, generator=g).unbind(0)
    v = torch.randn(1, 1, 6, 3, generator=g)
    v[0, 0, 3] = 3e19
    beta = torch.ones(1, 1, 6)
    y_plain, W_plain = fwm_rule_recurrent(q, k, v, beta)
    inputs = [x.clone().requires_grad_() for x in (q, k, v, beta)]
    y, W = fwm_rule_recurrent(*inputs)
    assert torch.equal(y, y_plain) and torch.equal(W, W_plain)
    loss = y[:, :, :3].sum()
    first = torch.autograd.grad(loss, inputs, retain_graph=True)
    graphed = torch.autograd.grad(loss, inputs, create_graph=True)
    for name, a, b in zip(("q", "k", "v", "beta"), first, graphed, strict=True):
        assert torch.isfinite(a[:, :, :3]).all() and torch.isfinite(b[:, :, :3]).all(), name
        torch.testing.assert_close(b[:, :, :3], a[:, :, :3], rtol=1e-6, atol=1e-7, msg=name)


def token_by_token(q, k, v, beta, W0):
    """The FWM rule one call per token, the state carried: reads (B, H, T, d_v) and W_T."""
    reads, W = [], W0
    for t in range(k.shape[2]):
        y_t, W = fwm_rule_recurrent(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1],
                                    beta[:, :, t : t + 1], W)
        reads.append(y_t)
    return torch.cat(reads, dim=2), W


def assert_same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Equal bit for bit, NaN where NaN, ±inf where ±inf."""
    assert torch.equal(actual.isnan(), expected.isnan()), what
    assert torch.equal(actual.nan_to_num(), expected.nan_to_num()), what


#: (argument, token, entry, value) planted in the inputs of a 12-token sequence of batch row 0, head 0
#: (``None`` entry: the whole token); a second plant where a case has two.
TOKEN_CASES = {
    # a query so large that q·W0 overflows: only its own read is non-finite, W stays finite, and the
    # scan is redone token by token from it (mutants ``_scan`` 24, 26: only W checked for overflow)
    "huge query": [("q", 5, None, 3e38)],
    # a key whose products overflow mid-chunk: token by token, not in chunks of 2 (mutant ``_scan`` 40)
    "huge key": [("k", 10, None, 1e23)],
    # a NaN query, then a value that overflows: the reads from the NaN on come from a token-by-token
    # scan of the inputs as given (mutant ``_scan`` 97: chunks of 2)
    "NaN query, then a huge value": [("q", 0, 0, float("nan")), ("v", 4, None, 1e29)],
    # a NaN at the last token reaches the final state (mutant ``_scan`` 106: the state of the
    # sequences reached before the last token)
    "NaN value at the last token": [("v", 11, 2, float("nan"))],
}


@pytest.mark.parametrize("case", TOKEN_CASES)
@pytest.mark.parametrize("carried", [False, True])
def test_fwm_reads_and_state_equal_a_token_by_token_pass(case, carried):
    """Bit for bit the token-by-token pass's where the kernel scans token by token (from the first
    planted token on, in the sequence that holds it: after an overflow as after a NaN), and bit for bit
    the chunked scan of the inputs without the plants elsewhere (the reads before it, every other
    sequence); non-finite exactly where the token-by-token pass is. An overflow used to send the whole
    batch token by token, moving the reads before the huge token and the other sequences' by an ulp."""
    g = torch.Generator().manual_seed(6)
    given = {"q": torch.rand(1, 2, 12, D_DOT, generator=g), "k": torch.rand(1, 2, 12, D_DOT, generator=g),
             "v": torch.randn(1, 2, 12, D_V, generator=g), "beta": torch.rand(1, 2, 12, generator=g),
             "W0": 0.3 * torch.randn(1, 2, D_V, D_DOT, generator=g) if carried else None}
    y_plain, W_plain = fwm_rule_recurrent(*(given[name] for name in FWM_ARGS))
    for name, t, entry, value in TOKEN_CASES[case]:
        given[name][(0, 0, t) if entry is None else (0, 0, t, entry)] = value
    exact = torch.zeros(1, 2, 12, dtype=torch.bool)
    exact[0, 0, min(t for _, t, _, _ in TOKEN_CASES[case]):] = True
    y, W = fwm_rule_recurrent(*(given[name] for name in FWM_ARGS))
    y_steps, W_steps = token_by_token(*(given[name] for name in FWM_ARGS))
    assert_same(y[exact], y_steps[exact], "reads scanned token by token")
    assert torch.equal(y.isfinite(), y_steps.isfinite())
    assert_same(y[~exact], y_plain[~exact], "reads before the planted token, and of the other sequence")
    assert_same(W[0, 0], W_steps[0, 0], "state of the planted sequence")
    assert_same(W[0, 1], W_plain[0, 1], "state of the other sequence")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "value"), [("q", 3e38), ("k", 1e30), ("v", 3e38), ("beta", 1e30)])
def test_an_overflow_leaves_the_reads_before_it_and_other_sequences_as_they_were(name, value, dtype):
    """A finite value whose chunked scan overflows at token 4 of batch row 0, head 1 (1e300 in float64,
    a query 1.7e308), with a carried state: every read before it, and every read and state of the other
    sequences, equal bit for bit those of the call with that token as drawn; the overflow used to send
    the whole batch token by token (found by a random search; here fp32 reads before the token and of
    the other sequences were off by up to 3.8e-7, float64 by 1.3e-15)."""
    g = torch.Generator().manual_seed(3)
    given = {"q": torch.randn(2, 2, 9, D_DOT, generator=g, dtype=dtype),
             "k": torch.randn(2, 2, 9, D_DOT, generator=g, dtype=dtype),
             "v": torch.randn(2, 2, 9, D_V, generator=g, dtype=dtype), "beta": torch.rand(2, 2, 9, generator=g, dtype=dtype),
             "W0": 0.3 * torch.randn(2, 2, D_V, D_DOT, generator=g, dtype=dtype)}
    y_plain, W_plain = fwm_rule_recurrent(*(given[n] for n in FWM_ARGS))
    planted = dict(given)
    planted[name] = given[name].clone()
    planted[name][0, 1, 4] = value if dtype == torch.float32 else 1.7e308 if name == "q" else 1e300
    y, W = fwm_rule_recurrent(*(planted[n] for n in FWM_ARGS))
    assert torch.equal(y[0, 1, :4], y_plain[0, 1, :4])
    assert torch.equal(y[1], y_plain[1]) and torch.equal(y[0, 0], y_plain[0, 0])
    assert torch.equal(W[1], W_plain[1]) and torch.equal(W[0, 0], W_plain[0, 0])


@pytest.mark.parametrize("value", [1e23, float("nan")], ids=["huge value", "NaN value"])
@pytest.mark.parametrize("carried", [False, True])
def test_an_fwm_write_equals_a_token_by_token_pass(value, carried):
    """A write alone (no reads to check for overflow): the state of the sequence holding the value
    is the token-by-token pass's, bit for bit. Mutants ``_scan`` 25, 27 (overflow checked only in the
    reads, which a write has none of), 32 (W0 dropped from the token-by-token rescan), 107 (the
    missing reads of a write treated as a tensor)."""
    g = torch.Generator().manual_seed(7)
    k, v, beta = torch.rand(1, 2, 8, D_DOT, generator=g), torch.randn(1, 2, 8, D_V, generator=g), torch.rand(1, 2, 8, generator=g)
    W0 = 0.3 * torch.randn(1, 2, D_V, D_DOT, generator=g) if carried else None
    v[0, 0, 3] = value  # 1e23: the chunked state overflows (NaN), the token-by-token one stays finite
    W = fwm_rule_write(k, v, beta, W0)
    _, W_steps = token_by_token(torch.rand(1, 2, 8, D_DOT, generator=g), k, v, beta, W0)
    assert_same(W[0, 0], W_steps[0, 0], "state of the sequence holding the value")
    torch.testing.assert_close(W[0, 1], W_steps[0, 1], rtol=1e-5, atol=1e-6)


def test_the_fwm_backward_runs_with_denormals_flushed():
    """The backward of the chunked scan runs with denormals flushed (their arithmetic is tens of times
    slower on x86), so a gradient of the state of size 1e-39 gives exactly zero gradients. Mutants
    ``_scan_in_chunks`` 2, 3 (the flushing autograd function skipped when gradients are recorded)."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode")
    given = {name: x.requires_grad_() for name, x in fwm_args(T).items() if name != "q"}
    W = fwm_rule_write(given["k"], given["v"], given["beta"], given["W0"])
    grads = torch.autograd.grad(W, list(given.values()), torch.full_like(W, 1e-39), retain_graph=True)
    assert all(torch.equal(grad, torch.zeros_like(grad)) for grad in grads)
    grads = torch.autograd.grad(W, list(given.values()), torch.full_like(W, 1e-30))  # not denormal: not flushed
    assert all(grad.abs().max() > 0 for grad in grads)


@pytest.mark.parametrize("carried", [False, True])
def test_the_clean_scan_before_a_nan_falls_back_token_by_token_after_an_overflow(carried):
    """A NaN query at token 1 and a value at token 4 whose square overflows fp32 (found writing the
    tests above: read 0 was NaN). The reads before the NaN come from the scan of the finite
    stand-ins, which holds the huge value too: it must scan token by token as a finite input's scan
    does, or the overflow reaches read 0 through the chunk's masked products."""
    g = torch.Generator().manual_seed(6)
    q, k = torch.rand(1, 2, 12, D_DOT, generator=g), torch.rand(1, 2, 12, D_DOT, generator=g)
    v, beta = torch.randn(1, 2, 12, D_V, generator=g), torch.rand(1, 2, 12, generator=g)
    W0 = 0.3 * torch.randn(1, 2, D_V, D_DOT, generator=g) if carried else None
    q[0, 0, 1, 0], v[0, 0, 4] = float("nan"), 1e29
    y, W = fwm_rule_recurrent(q, k, v, beta, W0)
    y_steps, W_steps = token_by_token(q, k, v, beta, W0)
    assert torch.isfinite(y[0, 0, 0]).all()
    assert_same(y[0, 0], y_steps[0, 0], "reads of the sequence holding the NaN")
    assert_same(W[0, 0], W_steps[0, 0], "its state")
