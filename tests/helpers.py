"""Shared test helpers: the one tolerance check (:func:`assert_close`), the variant specs every
property is checked for, and builders for random inputs and carried states."""

from __future__ import annotations

import torch
from torch import Tensor

from fwbench import variants
from fwbench.variants import FastWeightState, KVCacheState

#: Every variant, with small feature sizes so that the whole suite runs in seconds.
SPECS = [
    "softmax",
    "linear",
    "favor:m=16",
    "dpfp:nu=1",
    "dpfp:nu=2",
    "linear-delta",
    "favor-delta:m=16",
    "dpfp-delta:nu=2",
]
DELTA_SPECS = [spec for spec in SPECS if variants.parse_spec(spec).info.rule == "delta"]
FORMS = ("parallel", "chunk", "recurrent")

#: Small shapes used by the module-level tests; d_v differs from d_key on purpose, so that a
#: transposed fast weight or a swapped axis shows up as a shape error rather than passing silently.
B, H, D_KEY, D_V = 2, 2, 8, 6

#: Below this max-abs difference two tensors are equal whatever their scale.
ABS_PASS = 1e-6

#: Relative RMSE allowed for a half-precision run against its fp32 counterpart (the tests' own bound,
#: deliberately not read from the code under test).
LOW_PRECISION_REL_RMSE = {torch.float16: 5e-3, torch.bfloat16: 3e-2}


def assert_close(actual: Tensor, expected: Tensor, rel_rmse: float) -> None:
    """Assert ``actual`` ≈ ``expected``: max |a − b| ≤ 1e-6 passes outright, else the relative
    RMSE ‖a − b‖ / ‖b‖ (computed in fp64) must be ≤ ``rel_rmse``. Shapes must match exactly and
    ``actual`` must be finite where ``expected`` is."""
    assert isinstance(actual, Tensor) and isinstance(expected, Tensor), (type(actual), type(expected))
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    a, b = actual.detach().double(), expected.detach().double()
    assert torch.isfinite(b).all(), "expected value is not finite"
    assert torch.isfinite(a).all(), "actual value has NaN or inf"
    if a.numel() == 0:
        return
    max_abs = (a - b).abs().max().item()
    if max_abs <= ABS_PASS:
        return
    rel = ((a - b).norm() / b.norm()).item() if b.norm() > 0 else float("inf")
    assert rel <= rel_rmse, f"relative RMSE {rel:.3e} > {rel_rmse:.0e} (max abs diff {max_abs:.3e})"


def assert_states_close(actual, expected, rel_rmse: float) -> None:
    """Compare two carried states of the same kind field by field (position exactly)."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    assert actual.position == expected.position
    if isinstance(expected, FastWeightState):
        assert_close(actual.W, expected.W, rel_rmse)
        assert (actual.z is None) == (expected.z is None)
        if expected.z is not None:
            assert_close(actual.z, expected.z, rel_rmse)
    else:
        assert isinstance(expected, KVCacheState)
        assert_close(actual.k, expected.k, rel_rmse)
        assert_close(actual.v, expected.v, rel_rmse)


def build(spec: str, d_key: int = D_KEY) -> variants.Attention:
    """The attention module of ``spec`` in eval mode (FAVOR+ draws Ω from the seeded RNG)."""
    return variants.build_attention(spec, d_key=d_key).eval()


def random_inputs(attention: variants.Attention, T: int, batch: int = B, heads: int = H,
                  d_v: int = D_V) -> dict[str, Tensor | None]:
    """Random fp32 q, k, v (B, H, T, ·) and, for the delta rule, β ∈ (0, 1) of shape (B, H, T)."""
    d_key = attention.d_key
    beta = torch.sigmoid(torch.randn(batch, heads, T)) if attention.uses_beta else None
    return {
        "q": torch.randn(batch, heads, T, d_key),
        "k": torch.randn(batch, heads, T, d_key),
        "v": torch.randn(batch, heads, T, d_v),
        "beta": beta,
    }


def carried_state(attention: variants.Attention, prefix: int = 7):
    """A non-zero state: the state after running a random prefix of ``prefix`` tokens."""
    _, state = attention(**random_inputs(attention, prefix), form="recurrent")
    return state


def time_slice(inputs: dict[str, Tensor | None], start: int, stop: int) -> dict[str, Tensor | None]:
    """Tokens [start, stop) of every input (β is (B, H, T), the others (B, H, T, D))."""
    return {name: None if x is None else x[:, :, start:stop] for name, x in inputs.items()}


def tiny_retrieval_grid(name: str, slow_max_steps: int) -> str:
    """A small Setting 1 grid file (TOML) for launcher tests: a ``quick`` profile of 6 short runs and a
    ``slow`` one of 12 runs long enough to be interrupted midway."""
    return f"""
name = "{name}"
task = "retrieval"

[defaults]
setting = 1
eval_every = 5
eval_sequences = 4
batch_size = 8
d_key = 8

[profiles.quick]
variant = ["linear", "dpfp:nu=1", "dpfp-delta:nu=1"]
S = [4, 6]
seed = [1]
max_steps = 10

[profiles.slow]
variant = ["linear", "dpfp:nu=1", "dpfp-delta:nu=1"]
S = [8, 10]
seed = [1, 2]
max_steps = {slow_max_steps}
target_loss = 0.0
eval_every = 50
"""


def comparable_records(records: list[dict]) -> dict:
    """run id → what a run measured (status, steps, metrics, curve): equal for equal runs wherever they ran."""
    return {r["run_id"]: (r["status"], r["steps"], r["metrics"], r["curve"]) for r in records}

