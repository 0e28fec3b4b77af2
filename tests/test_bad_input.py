"""Every row of the bad-input table in ``docs/bad_input.md``, checked against the exact answer the
table states.

Each row id (``L07``, ``C03``, ``G11``, …) has one function here that provokes the bad input and
returns what the user sees: ``ExceptionType: message`` for the library, ``exit N: stderr`` for the
command line, or a one-line account of the outcome where the right answer is not an error (an empty
sequence, a corrupt results line). ``test_bad_input[ROW]`` runs the function and matches its answer
against the table, where ``…`` stands for text that varies (temporary paths, the torch version), so
the table cannot drift from the code.
"""

from __future__ import annotations

import fractions
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

from fwbench import tasks, variants
from fwbench.cli import main
from fwbench.errors import FwbenchError
from fwbench.run.environment import check_device_name, resolve_device
from fwbench.run.grid import RunSpec, expand, load_grid
from fwbench.run.launchers import LaunchOptions
from fwbench.run.runner import run_grid
from fwbench.run.store import TORN_FILE, ResultsStore
from fwbench.tasks.corpus import CorpusError
from fwbench.tasks.lm_model import DecoderConfig, DecoderLM
from fwbench.tasks.shakespeare import ShakespeareConfig, ShakespeareTask
from fwbench.variants import AttentionLayer, FastWeightState, Favor, NonFiniteError, VariantError
from fwbench.variants.kernels import fla_dispatch

TABLE = Path(__file__).resolve().parents[1] / "docs" / "bad_input.md"
B, H, T, D_KEY, D_V = 2, 2, 4, 8, 6
SPECS = ["softmax", "linear", "favor:m=4", "dpfp:nu=2", "linear-delta", "favor-delta:m=4", "dpfp-delta:nu=2"]
FORMS = ("auto", "parallel", "chunk", "recurrent")

GRID_HEAD = 'task = "retrieval"\n[profiles.quick]\n'
TINY_GRID = """\
name = "one"
task = "retrieval"
[defaults]
eval_every = 2
eval_sequences = 2
batch_size = 2
max_steps = 2
d_key = 4
[profiles.quick]
variant = "linear"
S = 3
seed = 1
"""


@dataclass
class Context:
    tmp_path: Path
    capsys: pytest.CaptureFixture
    monkeypatch: pytest.MonkeyPatch


ROWS: dict[str, Callable[[Context], str]] = {}


def row(row_id: str):
    def register(fn: Callable[[Context], str]) -> Callable[[Context], str]:
        assert row_id not in ROWS, row_id
        ROWS[row_id] = fn
        return fn

    return register


# ------------------------------------------------------------------------------------------------
# What a user sees.
# ------------------------------------------------------------------------------------------------


def raised(expected: type[Exception], fn: Callable, *args, **kwargs) -> str:
    """``Type: message`` of the exception ``fn(*args, **kwargs)`` raises (which must be ``expected``)."""
    with pytest.raises(expected) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "an error is one line"
    return f"{type(info.value).__name__}: {message}"


def cli(ctx: Context, *argv: str) -> str:
    """``exit N: <last stderr line>`` of the command line run in-process.

    An uncaught exception would escape this call and fail the test: no traceback ever reaches a user.
    Errors of our own are exactly one line; argparse's usage errors print the usage first.
    """
    ctx.capsys.readouterr()
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse
        status = exc.code
        err = ctx.capsys.readouterr().err.strip()
        assert err.startswith("usage:"), err
    else:
        err = ctx.capsys.readouterr().err.strip()
        assert "\n" not in err, err
    assert "Traceback" not in err
    return f"exit {status}: {err.splitlines()[-1] if err else ''}"


def attention(spec: str, **kwargs) -> variants.Attention:
    return variants.build_attention(spec, d_key=D_KEY, **kwargs).eval()


def qkvb(T: int = T, dtype=torch.float32) -> dict:
    return {
        "q": torch.randn(B, H, T, D_KEY, dtype=dtype),
        "k": torch.randn(B, H, T, D_KEY, dtype=dtype),
        "v": torch.randn(B, H, T, D_V, dtype=dtype),
        "beta": torch.rand(B, H, T, dtype=dtype),
    }


def grid_file(ctx: Context, text: str) -> Path:
    path = ctx.tmp_path / "grid.toml"
    path.write_text(text)
    return path


def grid_error(ctx: Context, text: str) -> str:
    return raised(FwbenchError, load_grid, grid_file(ctx, text))


# ------------------------------------------------------------------------------------------------
# L: the library (variants): specs, construction, calls, carried states, values.
# ------------------------------------------------------------------------------------------------


@row("L01")
def _(ctx):
    return raised(VariantError, variants.build_attention, "lineer", d_key=D_KEY)


@row("L02")
def _(ctx):
    return raised(VariantError, variants.build_attention, "favor:nu=2", d_key=D_KEY)


@row("L03")
def _(ctx):
    return raised(VariantError, variants.build_attention, "dpfp:nu=1.5", d_key=D_KEY)


@row("L108")
def _(ctx):
    """A parameter given twice: the last one won silently ('dpfp:nu=1,nu=2' built ν = 2)."""
    for spec in "favor:m=4,m=4", "softmax:window=2, window=3", "dpfp-delta:nu=2,nu=2":
        assert "given twice" in raised(VariantError, variants.parse_spec, spec)
    return raised(VariantError, variants.build_attention, "dpfp:nu=1,nu=2", d_key=D_KEY)


@row("L109")
def _(ctx):
    """d_dot_of and chunk_size_in_use answered for what build_attention refuses (d_dot_of("dpfp:nu=2", 0) was 0)."""
    for spec, d_key in ("dpfp:nu=2", -1), ("favor:m=4", 2.0), ("linear", True):
        assert raised(VariantError, variants.d_dot_of, spec, d_key).startswith("VariantError: d_key:")
    assert raised(VariantError, variants.d_dot_of, "dpfp:nu=9", 2).startswith("VariantError: nu: got 9")
    assert raised(VariantError, variants.d_dot_of, "favor:m=70000", 8).startswith("VariantError: m: got 70000")
    for chunk_size in 0, -2, 2.5:
        assert raised(VariantError, variants.chunk_size_in_use, "linear", "chunk", chunk_size).startswith(
            "VariantError: chunk_size:")
    return raised(VariantError, variants.d_dot_of, "dpfp:nu=2", 0)


@row("L111")
def _(ctx):
    """Feature maps took any x: DPFP(4) of (2, 3) gave (2, 6) features, elu+1 (2, 3), FAVOR+ a matmul error."""

    class Square(variants.ElementwiseFeatureMap):  # a user's map: its forward is checked too
        def forward(self, x):
            return x * x

    answers = set()
    for feature_map in variants.DPFP(4), variants.EluPlusOne(4), variants.Tanh(4), variants.Favor(4, m=3), Square(4):
        for method in feature_map, feature_map.normalized, feature_map.for_queries:
            answers.add(raised(VariantError, method, torch.randn(2, 3)))
            for bad in [1.0] * 4, torch.tensor(1.0):
                assert raised(VariantError, method, bad).startswith("VariantError: x: got")
            for dtype in torch.int64, torch.bool:
                assert raised(VariantError, method, torch.ones(2, 4, dtype=dtype)).startswith("VariantError: x.dtype:")
            assert method(torch.randn(2, 4)).shape[-1] == feature_map.d_dot
    (answer,) = answers
    return answer


@row("L04")
def _(ctx):
    return raised(VariantError, variants.build_attention, "dpfp-delta:nu=0", d_key=D_KEY)


@row("L05")
def _(ctx):
    return raised(VariantError, variants.build_attention, "favor:m=-4", d_key=D_KEY)


@row("L06")
def _(ctx):
    return raised(VariantError, Favor, D_KEY, m=2.5)


@row("L07")
def _(ctx):
    return raised(VariantError, variants.build_attention, "dpfp:nu=16", d_key=D_KEY)


@row("L08")
def _(ctx):
    return raised(VariantError, variants.build_attention, "linear", d_key=0)


@row("L09")
def _(ctx):
    return raised(VariantError, variants.build_attention, None, d_key=D_KEY)


@row("L10")
def _(ctx):
    return raised(VariantError, variants.build_attention, "favor:m", d_key=D_KEY)


@row("L11")
def _(ctx):
    return raised(VariantError, AttentionLayer, "linear", d_model=32, n_heads=0)


@row("L12")
def _(ctx):
    return raised(VariantError, AttentionLayer, "linear", d_model=32, n_heads=2.0)


@row("L13")
def _(ctx):
    return raised(VariantError, AttentionLayer, "linear", d_model=30, n_heads=4)


@row("L14")
def _(ctx):
    layer = AttentionLayer("linear", d_model=32, n_heads=2)
    return raised(VariantError, layer, torch.randn(2, 5, 16))


@row("L15")
def _(ctx):
    inputs = qkvb()
    inputs["q"] = inputs["q"][0]
    return raised(VariantError, attention("linear"), **inputs)


@row("L16")
def _(ctx):
    inputs = qkvb()
    inputs["k"] = torch.ones(B, H, T, D_KEY, dtype=torch.int64)
    return raised(VariantError, attention("linear"), **inputs)


@row("L17")
def _(ctx):
    inputs = qkvb()
    inputs["k"] = torch.randn(B + 1, H, T, D_KEY)
    return raised(VariantError, attention("softmax"), **inputs)


@row("L18")
def _(ctx):
    inputs = qkvb()
    inputs["v"] = torch.randn(B, H + 1, T, D_V)
    return raised(VariantError, attention("linear-delta"), **inputs)


@row("L19")
def _(ctx):
    inputs = qkvb()
    inputs["v"] = torch.randn(B, H, T + 1, D_V)
    return raised(VariantError, attention("dpfp:nu=2"), **inputs)


@row("L20")
def _(ctx):
    inputs = qkvb()
    inputs["k"] = torch.randn(B, H, T, 5)
    return raised(VariantError, attention("favor:m=4"), **inputs)


@row("L21")
def _(ctx):
    inputs = qkvb()
    inputs["q"], inputs["k"] = torch.randn(B, H, T, 16), torch.randn(B, H, T, 16)
    return raised(VariantError, attention("dpfp-delta:nu=2"), **inputs)


@row("L22")
def _(ctx):
    inputs = qkvb()
    inputs["v"] = inputs["v"].half()
    return raised(VariantError, attention("softmax"), **inputs)


@row("L23")
def _(ctx):
    inputs = qkvb()
    inputs["k"] = inputs["k"].to("meta")
    return raised(VariantError, attention("linear"), **inputs)


@row("L24")
def _(ctx):
    inputs = qkvb()
    inputs["beta"] = None
    return raised(VariantError, attention("linear-delta"), **inputs)


@row("L25")
def _(ctx):
    inputs = qkvb()
    inputs["beta"] = inputs["beta"][..., None]
    return raised(VariantError, attention("dpfp-delta:nu=2"), **inputs)


@row("L26")
def _(ctx):
    return raised(VariantError, attention("linear"), **qkvb(), form="fast")


@row("L27")
def _(ctx):
    return raised(VariantError, attention("linear-delta"), **qkvb(), form="chunk", chunk_size=0)


@row("L28")
def _(ctx):
    return raised(VariantError, attention("linear"), **qkvb(), form="chunk", chunk_size=2.5)


@row("L29")
def _(ctx):
    _, cache = attention("softmax")(**qkvb())
    return raised(VariantError, attention("linear"), **qkvb(), state=cache)


@row("L30")
def _(ctx):
    _, sum_state = attention("dpfp:nu=2")(**qkvb())
    return raised(VariantError, attention("dpfp-delta:nu=2"), **qkvb(), state=sum_state)


@row("L31")
def _(ctx):
    _, state = attention("dpfp-delta:nu=1")(**qkvb())
    return raised(VariantError, attention("dpfp-delta:nu=2"), **qkvb(), state=state)


@row("L32")
def _(ctx):
    _, cache = attention("softmax")(**qkvb())
    smaller = {name: x[:1] for name, x in qkvb().items()}
    return raised(VariantError, attention("softmax"), **smaller, state=cache)


@row("L33")
def _(ctx):
    _, state = attention("linear")(**qkvb())
    state = FastWeightState(state.W.half(), state.z, state.position)
    return raised(VariantError, attention("linear"), **qkvb(), state=state)


@row("L34")
def _(ctx):
    _, cache = attention("softmax")(**qkvb())
    return raised(VariantError, attention("softmax"), **qkvb(dtype=torch.bfloat16), state=cache)


@row("L35")
def _(ctx):
    _, state = attention("linear-delta")(**qkvb())
    state = FastWeightState(state.W.to("meta"), None, state.position)
    return raised(VariantError, attention("linear-delta"), **qkvb(), state=state)


@row("L36")
def _(ctx):
    return raised(VariantError, attention("linear").read, torch.randn(B, H, 1, D_KEY), None)


@row("L37")
def _(ctx):
    inputs = qkvb()
    inputs["q"][0, 1, 2, 3] = float("nan")
    return raised(NonFiniteError, attention("favor:m=4", check_finite=True), **inputs)


@row("L38")
def _(ctx):
    inputs = qkvb()
    inputs["beta"][1, 0, 3] = float("inf")
    return raised(NonFiniteError, attention("linear-delta", check_finite=True), **inputs)


@row("L39")
def _(ctx):
    module = attention("dpfp:nu=2", check_finite=True)
    _, state = module(**qkvb())
    state.W[0, 0, 0, 0] = -float("inf")
    return raised(NonFiniteError, module, **qkvb(), state=state)


@row("L40")
def _(ctx):
    layer = AttentionLayer("softmax", d_model=16, n_heads=2, check_finite=True)
    x = torch.randn(2, 5, 16)
    x[1, 4, 0] = float("nan")
    return raised(NonFiniteError, layer, x)


@row("L60")
def _(ctx):
    return raised(VariantError, variants.build_attention, "dpfp-fwm", 8, form="chunk")


@row("L61")
def _(ctx):
    return raised(VariantError, variants.build_attention, "linear", 8, chunk_size=0)


@row("L62")
def _(ctx):
    return raised(VariantError, variants.register_feature_map, "linear", variants.Tanh)


@row("L63")
def _(ctx):
    for name in "my\nmap", "my\tmap", "my\x00map", "my\u2028map":  # a line break, tab, NUL, Unicode line separator
        assert raised(VariantError, variants.register_feature_map, name, variants.Tanh).startswith("VariantError: name:")
        assert not any(name in info.name for info in variants.list_variants())
    return raised(VariantError, variants.register_feature_map, "my:map", variants.Tanh)


@row("L103")
def _(ctx):
    """L63's check, at the other registration: register_rule took a rule key holding a line break, a tab or
    a NUL (only ' ' was refused) and named 'linear-my\\nrule' for every map; an int key raised AttributeError."""
    from dataclasses import replace

    from fwbench.variants.rules import DELTA, RULES

    before = (dict(RULES), set(variants.REGISTRY))
    for key in "my\nrule", "my\trule", "my\x00rule", "my\u2028rule", "my\u00a0rule", 5:
        assert raised(VariantError, variants.register_rule, replace(DELTA, key=key)).startswith(
            "VariantError: rule.key:"), key
    assert (dict(RULES), set(variants.REGISTRY)) == before  # nothing registered
    return raised(VariantError, variants.register_rule, replace(DELTA, key="my\nrule"))


@row("L104")
def _(ctx):
    """A feature map's parameters are written in spec strings too: a key 'a=b' was registered, and the
    variant's own spec 'pm:a=b=1' (the one in its run records) read as the unknown parameter 'a'; a default
    of 0 gave 'pm:nu=0', which parse_spec refuses; a default '2' (str) gave 'pm:nu=2', parsed as 2."""
    for params in ({"a=b": 1}, {"a,b": 1}, {"n u": 1}, {"nu\n": 1}, {"": 1}, {3: 1}, {"nu": 0}, {"nu": -1},
                   {"nu": "2"}, {"nu": 1.5}, {"nu": True}, [("nu", 1)], {"nu": 10 ** 5000}, {"nu": 2**63}):
        assert raised(VariantError, variants.register_feature_map, "pm", variants.Tanh, params).startswith(
            "VariantError: params"), params
        assert "pm" not in variants.REGISTRY
    registry, maps = dict(variants.REGISTRY), dict(variants.FEATURE_MAPS)
    try:
        for name, params in ("pm1", {"nu": 2}), ("pm2", {"window": None}), ("pm3", {"nu": 2**63 - 1}):  # accepted:
            # their specs parse back
            variants.register_feature_map(name, variants.Tanh, params, non_negative=False)
            spec = variants.parse_spec(f"{name}-fwm")  # a map that may be negative: the FWM rule only
            assert variants.parse_spec(str(spec)) == spec and spec.params == params
    finally:  # the registry is global: leave it as the other rows find it
        variants.REGISTRY.clear(), variants.REGISTRY.update(registry)
        variants.FEATURE_MAPS.clear(), variants.FEATURE_MAPS.update(maps)
    return raised(VariantError, variants.register_feature_map, "pm", variants.Tanh, {"a=b": 1})


@row("L64")
def _(ctx):
    ctx.monkeypatch.setenv(fla_dispatch.FLA_ENV, "maybe")
    ctx.monkeypatch.setattr(fla_dispatch, "_enabled", None)  # read the switch again, as a fresh process would
    return raised(VariantError, attention("dpfp-delta:nu=1", form="chunk"), **qkvb())


@row("L41")
def _(ctx):
    """Not an error: an empty sequence returns an empty output and leaves the state as it was."""
    for dtype in (torch.float32, torch.bfloat16):
        for spec in SPECS:
            module = attention(spec)
            _, state = module(**qkvb(dtype=dtype))
            for form in FORMS:
                y, after = module(**qkvb(T=0, dtype=dtype), state=state, form=form)
                assert y.shape == (B, H, 0, D_V) and y.dtype == dtype, (spec, form, y.shape, y.dtype)
                assert after.position == state.position
                for name in ("W", "z", "k", "v"):
                    if getattr(state, name, None) is not None:
                        assert torch.equal(getattr(after, name), getattr(state, name)), (spec, form, name)
            written = module.write(qkvb(T=0, dtype=dtype)["k"], qkvb(T=0, dtype=dtype)["v"],
                                   beta=qkvb(T=0, dtype=dtype)["beta"], state=state)
            assert written.position == state.position
            assert module.read(torch.randn(B, H, 0, D_KEY, dtype=dtype), state).shape[2] == 0
    layer_out, _ = AttentionLayer("dpfp-delta:nu=1", d_model=16, n_heads=2)(torch.randn(2, 0, 16))
    return (f"no error: y {tuple(y.shape)}; state unchanged (every variant and form; "
            f"layer output {tuple(layer_out.shape)})")


@row("L42")
def _(ctx):
    _, state = attention("linear")(**qkvb())
    return raised(VariantError, attention("linear"), **qkvb(dtype=torch.float64), state=state)


@row("L43")
def _(ctx):
    """Not an error without the check: a NaN stays causal (earlier outputs as without it)."""
    for spec in SPECS:
        module = attention(spec)
        clean = qkvb()
        poisoned = {name: x.clone() for name, x in clean.items()}
        poisoned["v"][0, 1, 2, 0] = float("nan")
        recurrent, _ = module(**poisoned, form="recurrent")
        for form in FORMS:
            y, _ = module(**poisoned, form=form)
            y_clean, _ = module(**clean, form=form)
            assert torch.isfinite(y[:, :, :2]).all(), (spec, form)
            torch.testing.assert_close(y[:, :, :2], y_clean[:, :, :2], rtol=1e-6, atol=1e-7)
            assert torch.equal(torch.isfinite(y), torch.isfinite(recurrent)), (spec, form)
    return "no error: outputs before token 2 unchanged and finite; from token 2 on non-finite where the recurrent form's are"


@row("L44")
def _(ctx):
    """Not an error: a normalised attention stays normalised at extreme input scales."""
    worst = 0.0
    values = torch.eye(T).expand(B, H, T, T)
    for spec in ("favor:m=4", "linear", "dpfp:nu=2", "softmax"):
        module = attention(spec)
        inputs = qkvb()
        for scale in (1e3, 1e-3):
            q, k = inputs["q"] * scale, inputs["k"] * scale
            # a query that shares no non-zero feature with any earlier key has no mass and reads 0:
            # DPFP's features are sparse, elu+1's exp(x) underflows at x = -1e3
            empty = torch.zeros(B, H, T, dtype=torch.bool)
            if spec != "softmax":
                empty = (module.phi(q, query=True) @ module.phi(k).mT).tril().sum(-1) == 0
            for form in FORMS:
                y, _ = module(q, k, values, form=form)
                assert torch.equal(y.sum(-1) == 0, empty), (spec, scale, form)
                worst = max(worst, (y.sum(-1) - 1)[~empty].abs().max().item())
    assert worst < 1e-5, worst
    return ("no error: every output row of identity values sums to 1 (max deviation < 1e-5), except rows whose "
            "query shares no non-zero feature with any earlier key (no mass), which read 0")


# ------------------------------------------------------------------------------------------------
# H: the harness (training loop, results store).
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoisonConfig:
    """A task whose attention inputs turn NaN from training step ``nan_at`` on."""

    nan_at: int = 3
    batch_size: int = 2
    lr: float = 0.01
    eval_every: int = 2
    patience: int = 10
    target_loss: float = 0.0
    max_steps: int = 6


class PoisonTask:
    name: ClassVar[str] = "poison"
    config_class: ClassVar[type] = PoisonConfig

    def validate(self, config):
        pass

    def build_model(self, config, variant):
        model = nn.Module()
        model.proj = nn.Linear(D_KEY, D_KEY)
        model.attention = variants.build_attention(variant, D_KEY)
        model.steps = 0
        return model

    def train_batch(self, config, generator):
        return torch.randn(config.batch_size, 1, 5, D_KEY, generator=generator)

    def loss(self, model, x, config):
        model.steps += 1
        q = model.proj(x) * (float("nan") if model.steps >= config.nan_at else 1.0)
        y, _ = model.attention(q, q, x, beta=torch.full(x.shape[:3], 0.5), form="chunk")
        return y.pow(2).mean()

    def evaluate(self, model, config, generator, device):
        return {"loss": 1.0}


@row("H01")
def _(ctx):
    ctx.monkeypatch.setitem(tasks.TASKS, "poison", PoisonTask())
    cells = [RunSpec("poison", "poison", "linear", 1, asdict(PoisonConfig(nan_at=n))) for n in (3, 100)]
    store = ResultsStore(ctx.tmp_path / "results")
    summary = run_grid(cells, store, LaunchOptions(device="cpu"), quiet=True)
    first, second = (next(r for r in store.records() if r["run_id"] == c.run_id) for c in cells)
    assert summary["ran"] == 2 and summary["diverged"] == 1
    return (f"record status {first['status']!r}, diverged_at {first['diverged_at']}, diverged_reason "
            f"{first['diverged_reason']!r}; the next cell still runs ({second['status']!r})")


@row("H02")
def _(ctx):
    store = ResultsStore(ctx.tmp_path)
    store.append({"run_id": "a"})
    with open(store.path, "a") as handle:
        handle.write('{"run_id": "b", "metrics": {"loss"\n')
    store.append({"run_id": "c"})
    loaded = store.load()
    return f"problems {loaded.problems}; records {[r['run_id'] for r in loaded.records]} still read"


@row("H03")
def _(ctx):
    store = ResultsStore(ctx.tmp_path)
    store.append({"run_id": "a"})
    with open(store.path, "a") as handle:
        handle.write('{"run_id": "b", "metr')  # what kill -9 in the middle of a write can leave
    before = store.load().problems
    store.append({"run_id": "c"})
    after = store.load()
    torn = (ctx.tmp_path / TORN_FILE).read_text()
    return (f"problems {before}; the next append moves it to {TORN_FILE} ({torn.strip()}); then problems "
            f"{after.problems}, records {[r['run_id'] for r in after.records]}")


@row("H04")
def _(ctx):
    blocker = ctx.tmp_path / "results"
    blocker.write_text("a file, not a directory")
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(blocker), "--quiet")


@row("H05")
def _(ctx):
    (ctx.tmp_path / "file").write_text("")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(ctx.tmp_path / "file" / "results"),
                 "--quiet")
    return answer


@row("H06")
def _(ctx):
    results = ctx.tmp_path / "results"
    results.mkdir()
    (results / "runs.jsonl").write_text('{"run_id": \n')
    ctx.capsys.readouterr()
    status = main(["run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet"])
    err = ctx.capsys.readouterr().err.strip()
    assert len(ResultsStore(results).records()) == 1
    return f"exit {status}, warning: {err}"


@row("H07")
def _(ctx):
    from fwbench.tasks.retrieval import RetrievalConfig

    config = RetrievalConfig(S=4, d_key=8, batch_size=4, eval_every=50, eval_sequences=4, max_steps=100, lr=1e12)
    store = ResultsStore(ctx.tmp_path / "results")
    run_grid([RunSpec("lr", "retrieval", "dpfp:nu=1", 1, asdict(config))], store, LaunchOptions(device="cpu"), quiet=True)
    line, = store.path.read_text().splitlines()

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    record = json.loads(line, parse_constant=refuse)
    return (f"strict JSON line: status {record['status']!r}, diverged_at {record['diverged_at']}, diverged_reason "
            f"{record['diverged_reason']!r}, best_eval_loss {record['metrics']['best_eval_loss']} (never measured; "
            "never Infinity)")


# ------------------------------------------------------------------------------------------------
# C: the command line.
# ------------------------------------------------------------------------------------------------


@row("C01")
def _(ctx):
    return cli(ctx, "run", "no-such-grid", "--results-dir", str(ctx.tmp_path))


@row("C02")
def _(ctx):
    return cli(ctx, "run", str(ctx.tmp_path / "missing.toml"), "--results-dir", str(ctx.tmp_path))


@row("C03")
def _(ctx):
    return cli(ctx, "run", "capacity", "--profile", "huge", "--results-dir", str(ctx.tmp_path))


@row("C281")
def _(ctx):
    return cli(ctx, "reproduce", "--profile", "quik", "--results-dir", str(ctx.tmp_path))


@row("C04")
def _(ctx):
    return cli(ctx, "run", "capacity", "--device", "tpu", "--results-dir", str(ctx.tmp_path))


@row("C05")
def _(ctx):
    ctx.monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return cli(ctx, "run", "capacity", "--device", "cuda", "--results-dir", str(ctx.tmp_path))


@row("C06")
def _(ctx):
    ctx.monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ctx.monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return cli(ctx, "run", "capacity", "--device", "cuda:3", "--results-dir", str(ctx.tmp_path))


@row("C07")
def _(ctx):
    return cli(ctx, "run", "capacity", "--threads", "0", "--results-dir", str(ctx.tmp_path))


@row("C08")
def _(ctx):
    return cli(ctx, "run", "capacity", "--threads", "two")


@row("C09")
def _(ctx):
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--seeds", "-1", "--results-dir", str(ctx.tmp_path))


@row("C10")
def _(ctx):
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--seeds", "1", "1", "--results-dir", str(ctx.tmp_path))


@row("C11")
def _(ctx):
    return cli(ctx, "variants", "--d-key", "0")


@row("C12")
def _(ctx):
    return cli(ctx, "report", "--results-dir", str(ctx.tmp_path / "resutls"), "--out", str(ctx.tmp_path / "out"))


@row("C13")
def _(ctx):
    (ctx.tmp_path / "out").write_text("")
    return cli(ctx, "report", "--results-dir", str(ctx.tmp_path), "--out", str(ctx.tmp_path / "out"))


@row("C14")
def _(ctx):
    return cli(ctx, "rn", "capacity")


def run_as_if_under_torchrun(ctx: Context, world_size: str, rank: str) -> str:
    """``fwbench run`` with torchrun's variables set by hand (no MASTER_ADDR: torchrun is absent)."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        ctx.monkeypatch.delenv(name, raising=False)
    for name, value in {"WORLD_SIZE": world_size, "RANK": rank, "LOCAL_RANK": "0"}.items():
        ctx.monkeypatch.setenv(name, value)
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(ctx.tmp_path / "r"), "--quiet")


@row("C15")
def _(ctx):
    return run_as_if_under_torchrun(ctx, world_size="2", rank="0")


@row("C16")
def _(ctx):
    return run_as_if_under_torchrun(ctx, world_size="two", rank="0")


@row("C17")
def _(ctx):
    return run_as_if_under_torchrun(ctx, world_size="2", rank="5")


@row("C18")
def _(ctx):
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "run.pt"), "--threads", "0")


@row("C19")
def _(ctx):
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "run.pt"), "--seed", str(2**70))


@row("C21")
def _(ctx):
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "run.pt"), "--temperature", "nan")


@row("C20")
def _(ctx):
    import fwbench.run.allocator

    ctx.monkeypatch.setattr(fwbench.run.allocator, "_applied", None)  # as in a fresh process
    ctx.monkeypatch.setenv("FWBENCH_MALLOC_TUNING", "maybe")
    return cli(ctx, "variants")


@row("C41")
def _(ctx):
    return cli(ctx, "run", "capacity", "--jobs", "0", "--results-dir", str(ctx.tmp_path))


@row("C42")
def _(ctx):
    return cli(ctx, "run", "capacity", "--jobs", "2", "--launcher", "ray", "--results-dir", str(ctx.tmp_path))


@row("C43")
def _(ctx):
    return cli(ctx, "estimate", "capacity", "--steps", "0")


@row("C48")
def _(ctx):
    ctx.monkeypatch.setenv("FWBENCH_PACK", "many")
    return cli(ctx, "run", "capacity", "--results-dir", str(ctx.tmp_path))


@row("C49")
def _(ctx):
    ctx.monkeypatch.setenv(fla_dispatch.FLA_ENV, "maybe")
    ctx.monkeypatch.setattr(fla_dispatch, "_enabled", None)  # read the switch again, as a fresh process would
    return cli(ctx, "run", "capacity", "--results-dir", str(ctx.tmp_path))


# ------------------------------------------------------------------------------------------------
# G: grid files (config).
# ------------------------------------------------------------------------------------------------


@row("G01")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\nseed = 1\nSS = 4\n')


@row("G02")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\nseed = 1\nS = "four"\n')


@row("G03")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\nseed = 1\nS = 4.5\n')


@row("G04")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\nseed = 1\nS = []\n')


@row("G05")
def _(ctx):
    return grid_error(ctx, 'task = "sorting"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n')


@row("G06")
def _(ctx):
    return grid_error(ctx, '[profiles.quick]\nvariant = "linear"\nseed = 1\n')


@row("G07")
def _(ctx):
    return grid_error(ctx, 'task = "retrieval"\n[profiles.quick\n')


@row("G08")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\n')


@row("G09")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "dpfp:nu=1.5"\nseed = 1\n')


@row("G10")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "lineer"\nseed = 1\n')


@row("G11")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\nseed = 1\nsetting = 3\n')


@row("G12")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\nseed = 1\nlr = nan\n')


@row("G13")
def _(ctx):
    return grid_error(ctx, 'task = "retrieval"\n[profile.quick]\nvariant = "linear"\nseed = 1\n')


@row("G14")
def _(ctx):
    return grid_error(ctx, 'task = "retrieval"\n')


@row("G15")
def _(ctx):
    return grid_error(ctx, 'task = "retrieval"\n[profiles]\nquick = 3\n')


@row("G16")
def _(ctx):
    return grid_error(ctx, 'task = "retrieval"\ndefaults = 3\n[profiles.quick]\nvariant = "linear"\nseed = 1\n')


@row("G17")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = ["dpfp", "dpfp:nu=1"]\nseed = 1\n')


@row("G18")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "linear"\nseed = [1, -2]\n')


@row("G60")
def _(ctx):
    return grid_error(ctx, 'task = "retrieval"\nvariant_modules = ["nothere.py"]\n[profiles.quick]\n'
                      'variant = "linear"\nseed = 1\n')


@row("G61")
def _(ctx):
    (ctx.tmp_path / "broken.py").write_text('raise RuntimeError("boom")\n')
    return grid_error(ctx, 'task = "retrieval"\nvariant_modules = ["broken.py"]\n[profiles.quick]\n'
                      'variant = "linear"\nseed = 1\n')


@row("G62")
def _(ctx):
    return grid_error(ctx, 'task = "retrieval"\nvariant_modules = "my.py"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n')


@row("G63")
def _(ctx):
    return grid_error(ctx, GRID_HEAD + 'variant = "tanh-fwm"\nseed = 1\nform = "chunk"\n')


LM_GRID_HEAD = 'task = "shakespeare"\n[profiles.quick]\nvariant = "linear"\nseed = 1\ncontext = 64\n'


@row("G19")
def _(ctx):
    return grid_error(ctx, LM_GRID_HEAD + "sliding_stride = 65\n")


@row("G20")
def _(ctx):
    return grid_error(ctx, LM_GRID_HEAD + "train_segments = 4\nstream_characters = 2048\n")


# ------------------------------------------------------------------------------------------------
# Issue 14's break-it leftovers (rows 80–89 of each section).
# ------------------------------------------------------------------------------------------------

EXITING_MODULE = "import sys\nsys.exit(3)\n"
BROKEN_FORWARD_MODULE = """\
from fwbench.variants import FeatureMap, register_feature_map


class BrokenForward(FeatureMap):
    @classmethod
    def output_size(cls, d_key):
        return d_key

    @property
    def d_dot(self):
        return self.d_key

    def forward(self, x):
        raise RuntimeError("my feature map is broken")


register_feature_map("brokenforward", BrokenForward)
"""


@row("L45")
def _(ctx):
    """Not an error: the softmax read weighs values whose sum passes the largest float as the parallel
    form does (it summed them in the fused kernel before dividing: [inf, −inf])."""
    m = torch.finfo(torch.float32).max * 0.6
    module = variants.build_attention("softmax", d_key=2).eval()  # d_v = d_key: the flash kernel's case
    k = torch.zeros(1, 1, 2, 2)
    v = torch.tensor([[m, -m], [m, -m]]).view(1, 1, 2, 2)
    q = torch.zeros(1, 1, 1, 2)
    read = module.read(q, module.write(k, v))
    parallel = module(torch.cat([k[:, :, :1], q], 2), k, v, form="parallel")[0][:, :, -1:]
    assert torch.equal(read, parallel), (read, parallel)
    return f"no error: read {[f'{x:.3g}' for x in read.flatten().tolist()]}, as the parallel form's last output"


@row("L46")
def _(ctx):
    module = variants.build_attention("softmax", d_key=2)
    state = variants.KVCacheState(torch.randn(1, 1, 3, 2), torch.randn(2, 1, 3, 4), 3)
    return raised(VariantError, module.read, torch.randn(1, 1, 1, 2), state)


@row("L47")
def _(ctx):
    module = variants.build_attention("linear-delta", d_key=2)
    return raised(VariantError, module.read, torch.randn(1, 1, 1, 2), FastWeightState(torch.zeros(4, 2), None, 3))


@row("L48")
def _(ctx):
    module = variants.build_attention("linear", d_key=2)
    k, v = torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 3)
    state = module.write(k, v)
    state.position = None
    return raised(VariantError, module, k, k, v, state=state)


@row("L49")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    tokens = torch.randint(0, 5, (1, 5))
    (_, after_3), (_, after_2) = model(tokens[:, :3]), model(tokens[:, :2])
    return raised(VariantError, model, tokens[:, 3:], [after_2[0], after_3[1]])


@row("L50")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    tokens = torch.randint(0, 5, (1, 5))
    _, states = model(tokens[:, :3])
    for state in states:
        state.position = 3.0
    return raised(VariantError, model, tokens[:, 3:], states)


@row("L51")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    return raised(VariantError, model, torch.tensor([[1, 5, 2]]))


@row("L52")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    return raised(VariantError, model.generate, torch.tensor([[1]]), 2.5)


@row("L53")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    tokens = torch.randint(0, 5, (1, 4))
    _, states = model(tokens[:, :2])
    return raised(VariantError, model, tokens[:, 2:], states[0])


@row("L54")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    return raised(VariantError, model, torch.tensor([[1, 2, 3]], device="meta"))


@row("L55")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    return raised(VariantError, model.generate, torch.tensor([[1]]), 2, 10**400)


@row("L56")
def _(ctx):
    for setting in {"tied_output": "no"}, {"tied_output": 0.5}, {"tied_output": 1}, {"dropout": True}:
        assert raised(VariantError, DecoderConfig, vocab_size=5, **setting).startswith(f"VariantError: {[*setting][0]}:")
    return raised(VariantError, DecoderConfig, vocab_size=5, dropout="0.5")


@row("L57")
def _(ctx):
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=2, d_ff=8))
    return raised(VariantError, model.generate, torch.tensor([[1]]), 2, generator="x")


@row("L80")
def _(ctx):
    """Not an error: second derivatives (create_graph=True) are exact in every form, also through the
    hand-written backwards of the FWM scan and the DPFP op."""
    checked = []
    for spec, form in (("dpfp:nu=1", "chunk"), ("dpfp-fwm:nu=1", "recurrent")):
        module = variants.build_attention(spec, d_key=2).double().eval()
        g = torch.Generator().manual_seed(0)
        inputs = [torch.randn(1, 1, 3, 2, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
        inputs.append(torch.rand(1, 1, 3, generator=g, dtype=torch.float64).requires_grad_())
        checked.append(torch.autograd.gradgradcheck(lambda *x, m=module, f=form: m(*x, form=f, chunk_size=2)[0],
                                                    inputs[:4 if module.uses_beta else 3], raise_exception=False))
    return f"no error: gradgradcheck {checked} (every variant and form: tests/variants/test_double_backward.py)"


@row("L83")
def _(ctx):
    """Not an error: under ``create_graph=True`` a tensor given as q, k and v (self-attention) has its
    gradient counted once, as in the plain backward (it was counted once per place it entered)."""
    worst = 0.0
    for spec in ("softmax", "tanh-fwm", "dpfp-fwm:nu=1"):
        module = variants.build_attention(spec, d_key=3).double().eval()
        x = torch.randn(1, 1, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
        beta = (torch.full((1, 1, 5), 0.5, dtype=torch.float64),) if module.uses_beta else ()
        for form in ("recurrent",) if variants.parse_spec(spec).info.rule == "fwm" else FORMS[1:]:
            loss = module(x, x, x, *beta, form=form)[0].square().sum()
            (plain,) = torch.autograd.grad(loss, x, retain_graph=True)
            (graph,) = torch.autograd.grad(loss, x, create_graph=True)
            worst = max(worst, float((graph.detach() - plain).abs().max() / plain.abs().max()))
    return f"no error: the gradients equal the plain backward's (relative difference {'< 1e-12' if worst < 1e-12 else worst})"


@row("L82")
def _(ctx):
    assert variants.build_attention("favor:m=65536", d_key=D_KEY).d_dot == 2 * 65536  # the largest accepted
    return raised(VariantError, variants.build_attention, "favor:m=9223372036854775807", d_key=D_KEY)


@row("L90")
def _(ctx):
    from fwbench.tasks.retrieval import RetrievalModel

    answers = set()
    for spec in ("softmax", "dpfp:nu=1"):
        model = RetrievalModel(spec, S=6, d_key=4)
        variants.set_check_finite(model, True)
        with torch.no_grad():
            model.key_by_value[4] = 3e38
            model.key_projection.weight.zero_()
            model.key_projection.bias.fill_(3e38)
        answers.add(raised(NonFiniteError, model, torch.tensor([[0, 1, 2]]), torch.tensor([[3, 4, 5]]),
                           torch.tensor([[1]])))
    (answer,) = answers
    return answer


@row("L91")
def _(ctx):
    from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores

    k, phi_q = torch.randn(B, H, T, D_KEY), torch.rand(B, H, 1, 2 * D_KEY * 2)
    return raised(VariantError, dpfp_query_scores, k, phi_q, 2.0)


@row("L92")
def _(ctx):
    from fwbench.tasks.key_rows import KeyRows, table_scores

    table, ids = torch.randn(3, D_KEY), torch.zeros(B, T, dtype=torch.long)
    return raised(ValueError, table_scores, KeyRows(table, ids, table.to("meta"), ids), torch.randn(B, D_KEY), "dot")


@row("L93")
def _(ctx):
    from fwbench.tasks.key_rows import KeyRows
    from fwbench.tasks.one_hot_read import one_hot_write_read

    table, values = torch.randn(5, D_KEY), torch.randint(0, 5, (B, T))
    answers = {raised(VariantError, one_hot_write_read, variants.build_attention(spec, D_KEY),
                      KeyRows(table, values, table, values), values, torch.randn(B, 2, 1, D_KEY), 5)
               for spec in ("dpfp:nu=1", "softmax", "linear")}
    (answer,) = answers
    return answer


@row("L100")
def _(ctx):
    from fwbench.tasks.retrieval import RetrievalModel

    keys, values = torch.arange(8).repeat(2, 1), torch.arange(1, 9).repeat(2, 1)  # value 8 is outside [0, 8)
    answers = {raised(ValueError, RetrievalModel(spec, 8, d_key=8), keys, values, keys[:, :1])
               for spec in ("linear", "softmax", "dpfp:nu=1", "dpfp-delta:nu=1")}  # every read path
    (answer,) = answers
    return answer


@row("L110")
def _(ctx):
    """A floor of 0, a negative one or NaN gave NaN rows silently (0 / 0), inf zero rows, a string a TypeError."""
    from fwbench.variants.kernels import sum_rule_chunk, sum_rule_parallel, sum_rule_read, sum_rule_recurrent
    from fwbench.variants.kernels.dpfp import dpfp

    zeros = torch.zeros(1, 1, 3, 2)
    calls = [lambda floor: variants.sum_normalize(zeros, floor=floor),
             lambda floor: dpfp(zeros, 1, normalize=True, floor=floor),
             lambda floor: sum_rule_parallel(zeros, zeros, zeros, floor=floor),
             lambda floor: sum_rule_chunk(zeros, zeros, zeros, floor=floor),
             lambda floor: sum_rule_recurrent(zeros, zeros, zeros, floor=floor),
             lambda floor: sum_rule_read(zeros, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2), floor=floor)]
    for call in calls:
        for floor in -1.0, math.nan, math.inf, True, "1e-30":
            assert raised(VariantError, call, floor).startswith("VariantError: floor: got"), floor
        out = call(0.5)  # a positive floor is taken: zero rows read 0
        assert not bool((out[0] if isinstance(out, tuple) else out).any())
    return raised(VariantError, calls[0], 0)


@row("L112")
def _(ctx):
    """Sparse inputs reached the kernels, which raised NotImplementedError or a reshape error."""
    answers = set()
    for spec in SPECS + ["linear-fwm"]:
        for form in FORMS:
            if spec == "linear-fwm" and form in ("parallel", "chunk"):
                continue
            module, inputs = attention(spec, form=form), qkvb()
            beta = inputs["beta"] if module.uses_beta else None
            answers.add(raised(VariantError, module, **{**inputs, "q": inputs["q"].to_sparse()}))
            _, state = module(**inputs)
            sparse_state = type(state)(*[x.to_sparse() if isinstance(x, torch.Tensor) else x
                                         for x in vars(state).values()])
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            for call, args, kwargs in ((module, (q, k, v.to_sparse()), {"beta": beta}),
                                       (module, (q, k, v), {"beta": beta, "state": sparse_state}),
                                       (module.read, (q.to_sparse(), state), {}),
                                       (module.write_read, (k, v, q.to_sparse(), beta), {})):
                assert ".layout: got torch.sparse_coo" in raised(VariantError, call, *args, **kwargs)
            if beta is not None:
                assert raised(VariantError, module, **{**inputs, "beta": beta.to_sparse()}).startswith(
                    "VariantError: beta.layout:")
        assert raised(VariantError, AttentionLayer(spec, 8, 2), torch.randn(B, T, 8).to_sparse()).startswith(
            "VariantError: x.layout:")
    assert raised(VariantError, variants.Favor(8, m=4), torch.randn(T, 8).to_sparse()).startswith("VariantError: x.layout:")
    (answer,) = answers
    return answer


@row("L115")
def _(ctx):
    """A nested tensor (torch.nested, strided or jagged) passed the dense-layout check (a strided one has
    the strided layout) and the checks then read its shape: "RuntimeError: Internal error: NestedTensorImpl
    doesn't support sizes", or a jagged one was told to call .to_dense(), which it does not have."""
    def nested(x: torch.Tensor, layout=torch.strided) -> torch.Tensor:
        return torch.nested.nested_tensor(list(x), layout=layout)

    answers = set()
    for layout in torch.strided, torch.jagged:
        for spec in SPECS + ["linear-fwm"]:
            module, inputs = attention(spec, form="recurrent"), qkvb()
            beta = inputs["beta"] if module.uses_beta else None
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            _, state = module(**inputs)
            for name, call, args, kwargs in (("q", module, (nested(q, layout), k, v), {"beta": beta}),
                                             ("k", module, (q, nested(k, layout), v), {"beta": beta}),
                                             ("v", module.write, (k, nested(v, layout), beta), {}),
                                             ("q", module.read, (nested(q, layout), state), {}),
                                             ("q", module.write_read, (k, v, nested(q, layout), beta), {})):
                assert raised(VariantError, call, *args, **kwargs).startswith(f"VariantError: {name}: got a nested tensor")
            x = torch.randn(B, T, 8)
            answers.add(raised(VariantError, AttentionLayer(spec, 8, 2), nested(x, layout)).replace("jagged", "strided"))
        assert raised(VariantError, variants.DPFP(8), nested(torch.randn(B, T, 8), layout)).startswith(
            "VariantError: x: got a nested tensor")
    # the advice works for both layouts
    assert nested(torch.randn(B, T, 8), torch.jagged).to_padded_tensor(0.0).shape == (B, T, 8)
    (answer,) = answers
    return answer


@row("L117")
def _(ctx):
    """A layer quantized with quantize_dynamic computes from fp32 input only: float64, fp16 or bf16 x (under
    autocast too) raised torch's 'expected scalar type Float but found Double' from its first projection,
    a meta x 'quantized::linear_dynamic: We could not find the fake impl for this operator'."""
    import warnings

    answers = set()
    for spec in SPECS + ["linear-fwm"]:
        for modules in {torch.nn.Linear}, {"q_proj"}:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
                layer = torch.ao.quantization.quantize_dynamic(AttentionLayer(spec, 8, 2), modules)
            x = torch.randn(B, T, 8)
            assert layer(x)[0].shape == (B, T, 8)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert layer(x)[0].shape == (B, T, 8)
                answers.add(raised(VariantError, layer, x.bfloat16()).replace("bfloat16", "float64"))
            for dtype in torch.float64, torch.float16, torch.bfloat16:
                answers.add(raised(VariantError, layer, x.to(dtype)).replace(str(dtype), "torch.float64"))
            assert raised(VariantError, layer, x.to("meta")).startswith("VariantError: x.device: got 'meta'")
    (answer,) = answers
    return answer


@row("L118")
def _(ctx):
    """A layer with only its key, value, β or output projection quantized (quantize_dynamic(layer,
    {"k_proj"})) took a bf16 or fp16 x under autocast past the query projection's check, and the quantized
    projection raised torch's 'expected scalar type Float but found BFloat16'; outside autocast the
    query's check answered 'expected the layer's dtype (torch.float32)' for what a quantized layer cannot
    take at all."""
    import warnings

    answers = set()
    for spec in SPECS + ["linear-fwm"]:
        projections = ["k_proj", "v_proj", "out_proj"] + (["beta_proj"] if "delta" in spec or "fwm" in spec else [])
        for projection in projections:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
                layer = torch.ao.quantization.quantize_dynamic(AttentionLayer(spec, 8, 2), {projection})
            x = torch.randn(B, T, 8)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert layer(x)[0].shape == (B, T, 8)
                for dtype in torch.bfloat16, torch.float16:
                    answers.add(raised(VariantError, layer, x.to(dtype)).replace(str(dtype), "torch.bfloat16"))
            for dtype in torch.float64, torch.float16, torch.bfloat16:
                answers.add(raised(VariantError, layer, x.to(dtype)).replace(str(dtype), "torch.bfloat16"))
    (answer,) = answers
    return answer


class _StatefulPhi(variants.FeatureMap):
    """elu + 1 of x times a learnable scale, with a forward that changes its own module: a Python counter of its
    calls, the scale decayed in place under no_grad, and dropout drawn from a torch.Generator of its own."""

    name = "stateful-elu"

    def __init__(self, d_key: int):
        super().__init__(d_key)
        self.calls = 0
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d_key))
        self.generator = torch.Generator().manual_seed(3)

    @property
    def d_dot(self) -> int:
        return self.d_key

    def forward(self, x):
        self.calls += 1
        with torch.no_grad():
            self.scale.mul_(0.8)
        keep = torch.rand(x.shape, generator=self.generator) < 0.7
        return (nn.functional.elu(x * self.scale.clone()) + 1) * keep / 0.7


@row("L120")
def _(ctx):
    """Not an error: a learnable φ whose forward changes its own module, differentiated twice under CPU autocast
    (a second backward through a retained graph, a gradient penalty). run_in_fp32 ran φ again for each, which moved
    its state again or drew another sample (gradients 2-40 % off plain autograd's, break-it passes AB and AC); it
    now keeps φ's graph, so φ runs once a forward, as without autocast."""
    worst, calls = 0.0, set()
    for backward in "retained graph", "gradient penalty":
        results = []
        for autocast in False, True:
            attention = variants.FastWeightAttention(_StatefulPhi(4), rule="sum", form="chunk")
            q = (0.5 * torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(1))).requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = attention(q, q, q)[0].square().sum()
                scale = attention.feature_map.scale
                if backward == "retained graph":
                    loss.backward(retain_graph=True)
                    loss.backward()
                else:
                    first = torch.autograd.grad(loss, [q, scale], create_graph=True)
                    (loss + sum(g.square().sum() for g in first)).backward()
            calls.add(attention.feature_map.calls)
            results.append(torch.cat([q.grad.flatten(), scale.grad, scale.detach()]))
        worst = max(worst, float((results[1] - results[0]).abs().max() / results[0].abs().max()))
    (ran,) = calls
    return f"no error: φ ran {ran} times a forward (query and key, as without autocast); gradients within " \
           f"{'1e-5' if worst < 1e-5 else worst} of plain autograd's (of the largest)"


@row("L119")
def _(ctx):
    """A state made under torch.inference_mode() carried into a call that records autograd: torch's
    'Inference tensors cannot be saved for backward. …' (several lines) from inside a kernel, in the forms
    whose ops saved the state only; a state made under no_grad, or a call that records nothing, is taken
    (also one inside inference_mode with enable_grad nested, which the check refused, and under autocast
    torch raised 'Inference tensors cannot be saved for backward'). Softmax's KV cache is copied instead: the call
    answers with the gradients of a cache made under no_grad (the row refused it, break-it pass X)."""
    answers = set()
    for spec in SPECS + ["linear-fwm"]:
        for form in "auto", "parallel", "chunk", "recurrent":
            if spec.endswith("fwm") and form in ("parallel", "chunk"):
                continue
            attention = variants.build_attention(spec, 8, form=form, chunk_size=2)
            q, k, v = (torch.randn(B, 2, T, 8) for _ in range(3))
            beta = torch.rand(B, 2, T) if attention.uses_beta else None
            with torch.inference_mode():
                _, state = attention(q, k, v, beta)
            with torch.no_grad():
                _, kept = attention(q, k, v, beta)
            graded = q.clone().requires_grad_(True)
            assert attention(q, k, v, beta, state=state)[0].shape == (B, 2, T, 8)  # records nothing
            attention(graded, k, v, beta, state=kept)[0].sum().backward()
            for dtype in None, torch.bfloat16:  # inside inference_mode nothing is recorded, enable_grad or not
                with torch.inference_mode(), torch.enable_grad(), torch.autocast("cpu", dtype, enabled=bool(dtype)):
                    assert attention(graded, k, v, beta, state=state)[0].shape == (B, 2, T, 8)
                    assert attention.write_read(graded, v, graded, beta, state).shape == (B, 2, T, 8)
            if spec == "softmax":  # a KV cache is copied, and the call answers as with one made under no_grad
                for call in "forward", "write then read", "write_read":
                    for carried in state, kept:
                        graded.grad = None
                        if call == "forward":
                            out = attention(graded, k, v, beta, state=carried)[0]
                        elif call == "write then read":
                            out = attention.read(graded, attention.write(k, v, beta, carried))
                        else:
                            out = attention.write_read(graded, v, graded, beta, carried)
                        (out * torch.arange(8.0)).sum().backward()
                        if carried is state:
                            from_inference = graded.grad
                    torch.testing.assert_close(from_inference, graded.grad, rtol=0, atol=0)
                continue
            answers.add(raised(VariantError, attention, graded, k, v, beta, state=state))
            answers.add(raised(VariantError, attention.write, graded, v, beta, state))
            answers.add(raised(VariantError, attention.read, graded, state))
            answers.add(raised(VariantError, attention.write_read, graded, v, graded, beta, state))
        layer = AttentionLayer(spec, 8, 2)
        with torch.inference_mode():
            _, state = layer(torch.randn(B, T, 8))
        if spec == "softmax":  # break-it pass X: 578b132 answered here (a prompt read under inference_mode)
            layer(torch.randn(B, T, 8), state)[0].sum().backward()
            assert all(p.grad is not None for p in layer.parameters())
        else:
            answers.add(raised(VariantError, layer, torch.randn(B, T, 8), state))
    (answer,) = answers
    return answer


@row("L116")
def _(ctx):
    """The FWM rule's answer to a missing or non-tensor β named the delta rule."""
    answers = set()
    for spec in "linear-fwm", "dpfp-fwm:nu=2", "tanh-fwm":
        for form in "auto", "recurrent":
            module, inputs = attention(spec, form=form), qkvb()
            for beta in None, 0.5:
                for call, args in ((module, (inputs["q"], inputs["k"], inputs["v"], beta)),
                                   (module.write, (inputs["k"], inputs["v"], beta)),
                                   (module.write_read, (inputs["k"], inputs["v"], inputs["q"], beta))):
                    answers.add(raised(VariantError, call, *args).replace("'float'", "None"))
    (answer,) = answers
    return answer


@row("L113")
def _(ctx):
    """write() and write_read() check their keys as the q of a forward call, and named them q."""
    answers = set()
    for spec in SPECS + ["linear-fwm"]:
        module, inputs = attention(spec), qkvb()
        k, v, q = inputs["k"], inputs["v"], inputs["q"]
        beta = inputs["beta"] if module.uses_beta else None
        for call, args in ((module.write, (k, v, beta)), (module.write_read, (k, v, q, beta))):
            keys, values = args[0], args[1]
            for bad_keys, bad_values in ((keys[..., :5], values), (keys[0], values), (keys, values.double()),
                                         (keys, values.to("meta")), (keys, values[:, :, :2])):
                answer = raised(VariantError, call, bad_keys, bad_values, *args[2:])
                assert answer.startswith(("VariantError: k", "VariantError: v")), answer
                assert not any(q_named in answer for q_named in ("of q (", "got q ", "q, k, v:")), answer
            answers.add(raised(VariantError, call, keys.long(), values, *args[2:]))
    (answer,) = answers
    return answer


@row("L114")
def _(ctx):
    """The model-walking helpers and sum_normalize took anything: an int raised AttributeError ('modules'),
    a list AttributeError ('to'), and set_check_finite(model, "no") switched the check on."""
    layer = AttentionLayer("linear", 8, 2)
    assert raised(VariantError, variants.set_check_finite, 5).startswith("VariantError: module: got 'int'")
    assert raised(VariantError, variants.set_check_finite, layer, "no").startswith("VariantError: enabled: got 'no'")
    assert not layer.attention.check_finite
    assert variants.set_check_finite(layer, True) == 1 and layer.attention.check_finite
    for phi in [1.0, 2.0], torch.tensor(2.0):
        assert raised(VariantError, variants.sum_normalize, phi).startswith("VariantError: phi: got")
    with variants.using_form(layer, "recurrent") as switched:
        assert switched == 1 and layer.attention.form == "recurrent"
    return raised(VariantError, lambda: variants.using_form(5, "chunk").__enter__())


@row("L105")
def _(ctx):
    """β that is not a tensor (a float, a list) reached beta.shape or beta.device unchecked."""
    answers = set()
    for spec in SPECS[1:] + ["linear-fwm"]:  # softmax takes no β
        for form in FORMS:
            if spec == "linear-fwm" and form in ("parallel", "chunk"):
                continue
            module = attention(spec, form=form)
            for beta in 0.5, [0.5] * T:
                inputs = {**qkvb(), "beta": beta}
                found = {raised(VariantError, module, **inputs),
                         raised(VariantError, module.write, inputs["k"], inputs["v"], beta),
                         raised(VariantError, module.write_read, inputs["k"], inputs["v"], inputs["q"], beta)}
                answers |= {answer.replace("'list'", "'float'") for answer in found}
    # a rule that ignores β takes None; one that needs it does not, and its answer said "or None" too
    (answer,) = {a for a in answers if "or None" not in a and "fwm" not in a}  # the FWM rule's: L116
    assert answers == {answer, answer.replace(" for the delta rule", " or None"), answer.replace("delta", "fwm")}
    return answer


@row("L106")
def _(ctx):
    """write_read's queries were checked against the state written from k, not against k: the fused reads
    took a meta q beside CPU keys (a CPU output), and float64 q beside float32 keys only in form auto."""
    answers, dtype_answers = set(), set()
    for spec in SPECS + ["linear-fwm"]:
        for form in FORMS:
            if spec == "linear-fwm" and form in ("parallel", "chunk"):
                continue
            module, inputs = attention(spec, form=form), qkvb()
            beta = inputs["beta"] if module.uses_beta else None
            answers.add(raised(VariantError, module.write_read, inputs["k"], inputs["v"], inputs["q"].to("meta"), beta))
            # a fast-weight read takes fp16 queries beside fp32 keys (both computed in fp32); softmax's cache does not
            for dtype in (torch.float64, torch.float16) if spec == "softmax" else (torch.float64,):
                dtype_answers.add(raised(VariantError, module.write_read, inputs["k"], inputs["v"],
                                         inputs["q"].to(dtype), beta).split(";")[1])
    assert dtype_answers == {" expected the dtype of k (torch.float32): q, k and v must share one dtype",
                             " expected one computed in the dtype of k (torch.float32): torch.float16, torch.bfloat16 "
                             "or torch.float32"}
    (answer,) = answers
    return answer


@row("L107")
def _(ctx):
    """A layer's input was not checked against its weights: a float64 x into a float32 layer raised torch's
    dtype error from the first projection, a meta x gave softmax a meta output and the others a device error."""
    x = torch.randn(B, T, 8)
    answers, dtype_answers = set(), set()
    for spec in SPECS + ["linear-fwm"]:
        layer = AttentionLayer(spec, 8, 2)
        answers.add(raised(VariantError, layer, x.to("meta")))
        dtype_answers.add(raised(VariantError, layer, x.double()))
        dtype_answers.add(raised(VariantError, AttentionLayer(spec, 8, 2).to(torch.float64), x).replace("float32", "float64")
                          .replace("(torch.float64)", "(torch.float32)", 1))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts x and the weights for the projections,
            for dtype in torch.float16, torch.bfloat16:       # but never float64
                assert layer(x.to(dtype))[0].shape == x.shape
            dtype_answers.add(raised(VariantError, layer, x.double()))
    assert dtype_answers == {"VariantError: x.dtype: got torch.float64; expected the layer's dtype (torch.float32); "
                             "cast x, or the layer with .to(dtype)"}
    (answer,) = answers
    return answer


@row("L101")
def _(ctx):
    from fwbench.tasks.retrieval import RetrievalModel

    keys = torch.arange(8).repeat(2, 1)
    answers = {raised(ValueError, RetrievalModel(spec, 8, d_key=8), keys.to("meta"), keys, keys[:, :1])
               for spec in ("linear", "softmax", "dpfp-delta:nu=1")}
    (answer,) = answers
    return answer


@row("L102")
def _(ctx):
    from fwbench.tasks.mqar import MQARModel

    tokens, labels = torch.tensor([[1, 8, 2]]), torch.tensor([[-100, -100, 1]])  # id 8 is outside [0, 8)
    answers = {raised(ValueError, MQARModel(spec, 8, 8), tokens, labels) for spec in ("linear", "softmax")}
    (answer,) = answers
    return answer


@row("L81")
def _(ctx):
    """Not an error: a huge finite key overflows K Kᵀ inside a chunk, yet stays causal."""
    for spec in ("linear-delta-unnorm", "dpfp-delta-unnorm:nu=1", "linear-delta"):
        module = attention(spec)
        clean = qkvb(T=8)
        huge = {name: x.clone() for name, x in clean.items()}
        huge["k"][0, 1, 5] = 1e20
        for form in FORMS[1:]:
            y, _ = module(**huge, form=form, chunk_size=4)
            y_clean, _ = module(**clean, form=form, chunk_size=4)
            assert torch.isfinite(y[:, :, :5]).all(), (spec, form)
            torch.testing.assert_close(y[:, :, :5], y_clean[:, :, :5], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(y[1], y_clean[1], rtol=1e-5, atol=1e-6)
    return "no error: outputs before token 5 unchanged and finite in every form (as the recurrent form's)"


@row("L121")
def _(ctx):
    """Flags took any truthy value: check_finite="no" switched the check on, bias="no" gave the projections
    biases, sum_normalize="no" sum-normalised φ, all silently."""
    import numpy as np

    for flag in "no", 0.5, 1, None:
        assert raised(VariantError, variants.build_attention, "linear", D_KEY, check_finite=flag) == \
            f"VariantError: check_finite: got {flag!r}; expected True or False"
        for name in "check_finite", "bias":
            assert raised(VariantError, AttentionLayer, "linear", 8, 2, **{name: flag}) == \
                f"VariantError: {name}: got {flag!r}; expected True or False"
        if flag is not None:  # None: the rule's own
            assert raised(VariantError, variants.FastWeightAttention, variants.EluPlusOne(D_KEY), "delta-unnorm",
                          sum_normalize=flag).startswith("VariantError: sum_normalize: got")
    for flag in True, False, np.True_, np.False_:  # bools are taken, NumPy's too (as set_check_finite takes them)
        assert variants.build_attention("linear", D_KEY, check_finite=flag).check_finite is bool(flag)
        layer = AttentionLayer("linear", 8, 2, bias=flag, check_finite=flag)
        assert layer.attention.check_finite is bool(flag) and (layer.q_proj.bias is not None) == bool(flag)
    assert not variants.FastWeightAttention(variants.EluPlusOne(D_KEY), "delta", sum_normalize=False).sum_normalize
    return raised(VariantError, variants.build_attention, "linear", D_KEY, check_finite="no")


@row("L122")
def _(ctx):
    """int() read '3_0' as 30 and other scripts' digits ('٣', '３') as 3: the spec built m = 30, m = 3."""
    for spec in "favor:m=3_0", "favor:m=٣", "favor:m=３", "favor:m=𝟑", "dpfp:nu=٢", "softmax:window=1_0", "favor:m=1_000":
        name, _, rest = spec.partition(":")
        key, _, value = rest.partition("=")
        assert raised(VariantError, variants.parse_spec, spec) == \
            f"VariantError: {name}:{key}: got {value!r}; expected a positive integer in ASCII digits 0-9 " \
            "(no '_' separators or other scripts' digits)"
    for value in "1_0.5", "１.５", "1e3", "0x10", "3.0":  # no integer at all: L03's answer
        assert raised(VariantError, variants.parse_spec, f"favor:m={value}") == \
            f"VariantError: favor:m: got {value!r}; expected a positive integer"
    for spec, canonical in ("favor:m= 16 ", "favor:m=16"), ("dpfp:nu=+2", "dpfp:nu=2"), ("favor:m=007", "favor:m=7"):
        assert str(variants.parse_spec(spec)) == canonical
    return raised(VariantError, variants.build_attention, "favor:m=3_0", d_key=D_KEY)


@row("L123")
def _(ctx):
    """sum_normalize took complex φ (its imaginary part dropped, with a torch warning only) and integer or
    bool φ (cast to fp32) silently."""
    for dtype in torch.complex64, torch.complex128, torch.int64, torch.int32, torch.uint8, torch.bool:
        assert raised(VariantError, variants.sum_normalize, torch.ones(2, 3, dtype=dtype)) == \
            f"VariantError: phi.dtype: got {dtype}; expected a floating-point dtype"
    for dtype in torch.float16, torch.bfloat16, torch.float32, torch.float64:  # floating φ as before
        out = variants.sum_normalize(torch.ones(2, 4, dtype=dtype))
        assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert torch.equal(out, torch.full((2, 4), 0.25, dtype=out.dtype))
    return raised(VariantError, variants.sum_normalize, torch.ones(3, dtype=torch.complex64))


@row("L124")
def _(ctx):
    """Task models took sizes that are not positive integers: RetrievalModel's d_key=0 raised ZeroDivisionError,
    S=0 built a model silently, MQARModel's n_layers=0 one without attention, vocab_size=-1 a RuntimeError."""
    from fwbench.tasks.mqar import MQARModel
    from fwbench.tasks.retrieval import RetrievalModel, official_initial_weights

    for args, kwargs, name in (
            (("linear", 0), {}, "S"), (("linear", "4"), {}, "S"), (("linear", True), {}, "S"),
            (("softmax", 4), {"d_key": 0}, "d_key"), (("linear", 4), {"d_key": 4.0}, "d_key"),
            (("linear", 4), {"d_key": -2}, "d_key"), (("linear", 4), {"embedding_size": 0}, "embedding_size")):
        value = kwargs.get(name, args[1])
        assert raised(ValueError, RetrievalModel, *args, **kwargs) == \
            f"ValueError: {name}: got {value!r}; expected a positive integer (>= 1)"
    for args in ("linear", 4, 8, 0), ("linear", 0, 8, 8), ("linear", 4, 8.0, 8):
        assert raised(ValueError, official_initial_weights, *args).startswith("ValueError: ")
    for args, kwargs, name in ((("linear", -1, 8), {}, "vocab_size"), (("linear", 8, 0), {}, "d_model"),
                               (("linear", 8, 8), {"n_heads": 0}, "n_heads"),
                               (("linear", 8, 8), {"n_layers": 0}, "n_layers"),
                               (("linear", 8, 8), {"n_layers": -1}, "n_layers"),
                               (("linear", 8, 8), {"n_layers": 2.0}, "n_layers")):
        assert raised(ValueError, MQARModel, *args, **kwargs).startswith(f"ValueError: {name}: got "), (args, kwargs)
    assert RetrievalModel("linear", 1, d_key=4).S == 1  # one key is a (small) model
    return raised(ValueError, RetrievalModel, "linear", 4, d_key=0)


@row("H80")
def _(ctx):
    from fwbench.run.training import fit

    config = tasks.RetrievalConfig(S=3, d_key=4, batch_size=2, max_steps=2, eval_every=2, target_loss=-1.0)
    return raised(FwbenchError, fit, "retrieval", "linear", config, 1, torch.device("cpu"))


@row("C80")
def _(ctx):
    (ctx.tmp_path / "exits.py").write_text(EXITING_MODULE)
    return cli(ctx, "variants", "--variant-module", str(ctx.tmp_path / "exits.py"))


@row("C81")
def _(ctx):
    """The reader of stdout goes away before fwbench writes (as `| head -1` does after its line)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(TABLE.parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "fwbench", "variants"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # every write of the child now fails with EPIPE
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    proc.stderr.close()
    return f"exit {proc.returncode}: {err.strip()}"


@row("C82")
def _(ctx):
    """A cell that fails is marked failed in the table (as fwbench run records it); the rest is estimated."""
    from fwbench.variants import registry, rules

    (ctx.tmp_path / "broken_forward.py").write_text(BROKEN_FORWARD_MODULE)
    path = grid_file(ctx, TINY_GRID.replace('task = "retrieval"\n', 'task = "retrieval"\nvariant_modules = '
                                            '["broken_forward.py"]\n').replace('variant = "linear"',
                                                                                'variant = ["linear", "brokenforward"]'))
    saved = [(table, dict(table)) for table in (registry.REGISTRY, registry.FEATURE_MAPS, rules.RULES)]
    ctx.capsys.readouterr()
    try:
        status = main(["estimate", str(path), "--steps", "1"])
    finally:
        for table, before in saved:
            table.clear()
            table.update(before)
    out, err = ctx.capsys.readouterr()
    assert "Traceback" not in err
    cells = {line.split("|")[1].strip(): [line.split("|")[6].strip(), line.split("|")[-2].strip()]  # s/step, core-h
             for line in out.splitlines() if line.startswith("| ") and "|---" not in line}
    assert float(cells["linear"][0]) > 0, out  # the other cell is still timed
    step, core_hours = cells["brokenforward"]
    return f"exit {status}: cell brokenforward: {step}, {core_hours} core-hours"


@row("C83")
def _(ctx):
    return cli(ctx, "estimate", "shakespeare", "--data-dir", str(ctx.tmp_path / "nowhere"))


@row("C90")
def _(ctx):
    return cli(ctx, "estimate", "capacity", "--against", str(ctx.tmp_path / "nowhere"))


@row("G80")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace("seed = 1\n", "seed = 1\ntarget_loss = -0.5\n"))


@row("G81")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace('variant = "linear"', 'variant = "linear-fwm"\nchunk_size = [32, 80]'))


@row("G82")
def _(ctx):
    (ctx.tmp_path / "exits.py").write_text(EXITING_MODULE)
    return grid_error(ctx, 'task = "retrieval"\nvariant_modules = ["exits.py"]\n[profiles.quick]\n'
                      'variant = "linear"\nseed = 1\n')


MQAR_GRID = """\
name = "m"
task = "mqar"
[profiles.quick]
variant = "linear"
vocab_size = 16
seq_len = 8
num_kv_pairs = 2
d_model = 8
seed = 1
"""


@row("C84")
def _(ctx):
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--cpus-per-run", "nan", "--results-dir", str(ctx.tmp_path))


@row("C85")
def _(ctx):
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-num-cpus", "0", "--results-dir", str(ctx.tmp_path))


@row("C92")
def _(ctx):
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--cpus-per-run", "1e-46", "--results-dir", str(ctx.tmp_path))


@row("C93")
def _(ctx):
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--gpus-per-run", "1e300", "--results-dir", str(ctx.tmp_path))


@row("C94")
def _(ctx):
    (ctx.tmp_path / "checkpoints").mkdir()
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "checkpoints"))


@row("C86")
def _(ctx):
    return cli(ctx, "capacity", "--threshold", "inf", "--results-dir", str(ctx.tmp_path))


@row("C87")
def _(ctx):
    return cli(ctx, "probe", "--seed", "-1", "--out", str(ctx.tmp_path))


@row("C88")
def _(ctx):
    records = ctx.tmp_path / "runs.jsonl"
    records.write_text('{"run_id": "x"}\n')
    answer = cli(ctx, "sample", "--checkpoint", str(records))
    assert records.read_text() == '{"run_id": "x"}\n'
    return answer


@row("C89")
def _(ctx):
    (ctx.tmp_path / "report.md").write_text("a file, not a directory")
    return cli(ctx, "reproduce", "--out", str(ctx.tmp_path / "report.md"), "--results-dir", str(ctx.tmp_path / "r"))


@row("C91")
def _(ctx):
    return cli(ctx, "capacity", "--grid", "mqar", "--results-dir", str(ctx.tmp_path))


@row("C95")
def _(ctx):
    return cli(ctx, "capacity", "--grid", "setting2", "--results-dir", str(ctx.tmp_path))


@row("C96")
def _(ctx):
    return cli(ctx, "capacity", "--out", "", "--results-dir", str(ctx.tmp_path))


@row("C97")
def _(ctx):
    return cli(ctx, "estimate", "capacity", "--against", "")


@row("C98")
def _(ctx):
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-num-cpus", str(10**20), "--results-dir", str(ctx.tmp_path))


@row("C99")
def _(ctx):
    return cli(ctx, "run", "capacity", "--threads", "100000", "--results-dir", str(ctx.tmp_path))


@row("C100")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)  # were it accepted, its records would land here, not in the checkout
    return cli(ctx, "run", "capacity", "--results-dir", "")


@row("C101")
def _(ctx):
    return cli(ctx, "run", "shakespeare", "--data-dir", "", "--results-dir", str(ctx.tmp_path))


@row("C102")
def _(ctx):
    return cli(ctx, "sample", "--checkpoint", "")


@row("C103")
def _(ctx):
    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-num-cpus", "1", "--cpus-per-run", "2",
               "--results-dir", str(ctx.tmp_path))


@row("C104")
def _(ctx):
    return cli(ctx, "bench", "--lengths", str(2**63 - 1), "--device", "cpu", "--results-dir", str(ctx.tmp_path))


@row("C105")
def _(ctx):
    return cli(ctx, "run", "capacity", "--ray-num-cpus", "4", "--results-dir", str(ctx.tmp_path))


@row("C106")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)  # were it accepted, the probe would land here, not in the checkout
    answer = cli(ctx, "probe", "--out", "", "--trials", "1", "--d-key", "4")
    assert cli(ctx, "report", "--out", "", "--results-dir", str(ctx.tmp_path)) == answer
    assert not list(ctx.tmp_path.iterdir())
    return answer


@row("C107")
def _(ctx):
    (ctx.tmp_path / "grids.toml").mkdir()
    assert cli(ctx, "run", str(ctx.tmp_path / "grids.toml"), "--results-dir", str(ctx.tmp_path)) == (
        f"exit 2: fwbench: error: grid: {str(ctx.tmp_path / 'grids.toml')!r} is a directory; expected a .toml grid "
        "file or a bundled grid name")
    return cli(ctx, "run", "", "--results-dir", str(ctx.tmp_path))


@row("C108")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    answer = cli(ctx, "probe", "--trials", "99999999999999", "--out", "out")
    assert cli(ctx, "probe", "--d-key", "100000000", "--out", "out").startswith(
        "exit 2: fwbench: error: --d-key, --trials: got 100000000, 4; expected smaller values")  # together, they are
    assert not list(ctx.tmp_path.iterdir())  # refused before the output directory is made
    return answer


@row("C109")
def _(ctx):
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-address", "", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()  # refused before the store is made or Ray starts
    return answer


@row("C110")
def _(ctx):
    ctx.monkeypatch.setattr("fwbench.bench.suite.matmul_peak_gflops", lambda *a, **k: pytest.fail("timed first"))
    return cli(ctx, "bench", "--variants", "linear", "favor:m=65537", "--lengths", "16", "--no-extras", "--quiet",
               "--results-dir", str(ctx.tmp_path / "r"))


@row("C111")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    answer = cli(ctx, "probe", "--d-key", "1", "--out", "out")
    assert not list(ctx.tmp_path.iterdir())  # refused before the output directory is made
    return answer


@row("C112")
def _(ctx):
    ctx.monkeypatch.setenv("FWBENCH_PACK", "²")
    answer = cli(ctx, "run", "capacity", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()  # refused before the store is made
    return answer


@row("C113")
def _(ctx):
    ctx.monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the local launcher's check on a CUDA machine
    ctx.monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cli(ctx, "run", "capacity", "--device", "cuda:²", "--results-dir", str(ctx.tmp_path / "r")) == (
        "exit 2: fwbench: error: --device: got 'cuda:²'; expected cuda:N with N < 2")
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--device", "cuda:²", "--results-dir", str(ctx.tmp_path / "r"))



@row("C120")
def _(ctx):
    ctx.monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # resolve_device's checks on a CUDA machine
    ctx.monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for device in ("cuda:01", "cuda:"):  # torch.device raised "RuntimeError: Invalid device string" for both
        assert cli(ctx, "run", "capacity", "--device", device, "--results-dir", str(ctx.tmp_path / "r")) == (
            f"exit 2: fwbench: error: --device: got {device!r}; expected cuda:N with N < 2")
        assert cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "none.pt"), "--device", device) == (
            f"exit 2: fwbench: error: --device: got {device!r}; expected cuda:N with N < 2")
    assert str(resolve_device("cuda:1")) == "cuda:1" and str(resolve_device("cuda:0")) == "cuda:0"  # still accepted
    assert check_device_name("cuda:10") == "cuda:10"
    assert not (ctx.tmp_path / "r").exists()
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--device", "cuda:01", "--results-dir", str(ctx.tmp_path / "r"))


@row("C121")
def _(ctx):
    import subprocess
    import sys

    from fwbench.bench.regression import check_threshold

    root = Path(__file__).resolve().parents[1]
    for bad in (float("nan"), float("inf"), 1.0, 0.0, -2.0):  # NaN and ≤ 1 errored in every case; inf let all pass
        with pytest.raises(ValueError, match=r"^--threshold: got .*; expected a finite factor > 1"):
            check_threshold(bad)
    assert check_threshold(1.0001) == 1.0001
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "--threshold", "0.5"], cwd=root, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    return f"exit {done.returncode}: {lines[-1]}"


@row("C122")
def _(ctx):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    before = (root / "results" / "baselines" / "perf_baseline.json").read_bytes()
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "-q", "-k", "sum_rule_chunk",
                           "--update-baseline", "--plant-slowdown", "fwbench.variants.kernels.sum_rule:sum_rule_chunk"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert (root / "results" / "baselines" / "perf_baseline.json").read_bytes() == before  # nothing was measured
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    return f"exit {done.returncode}: {lines[-1]}"

@row("C114")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    (ctx.tmp_path / "notes.txt").write_text("x = 1\n")
    (ctx.tmp_path / "mine").mkdir()
    assert cli(ctx, "probe", "--variant-module", "mine/", "--out", "out").startswith(
        f"exit 2: fwbench: error: --variant-module: {str(ctx.tmp_path / 'mine')!r} is a directory; expected a .py file")
    return cli(ctx, "probe", "--variant-module", "./notes.txt", "--out", "out")


@row("C150")
def _(ctx):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "--plant-slowdown", "fwbench.variants.kernels.compiled_scores:row_score"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    return f"exit {done.returncode}: {lines[-1]}"


@row("C151")
def _(ctx):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "--plant-slowdown", ""], cwd=root, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    return f"exit {done.returncode}: {lines[-1]}"


@row("C170")
def _(ctx):
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gate_reliability.py"
    spec = importlib.util.spec_from_file_location("gate_reliability_c170", path)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    # what pytest gives for one selected case whose baseline fixture errored (measured: 28 s a run)
    ctx.monkeypatch.setattr(gate, "selected_cases", lambda extra: ({"sum_rule_chunk_kernel_T1024"}, ""))
    ctx.monkeypatch.setattr(gate, "failed_cases", lambda extra: ({}, 17.0, "13 deselected, 1 error in 4.60s", 1))
    ctx.monkeypatch.setattr(sys, "argv", ["gate_reliability.py", "--runs", "1", "--phases", "unchanged", "-k",
                                          "sum_rule_chunk_kernel"])
    status = gate.main()
    captured = ctx.capsys.readouterr()
    assert captured.out == "", captured.out
    return f"exit {status}: {captured.err.strip()}"


@row("C171")
def _(ctx):
    from fwbench.bench.regression import choose_baseline

    (ctx.tmp_path / "perf_baseline.json").write_text('<<<<<<< HEAD\n{"benchmarks": {}}\n=======\n{}\n>>>>>>> main\n')
    return raised(ValueError, choose_baseline, "AMD EPYC", ctx.tmp_path)


@row("C223")
def _(ctx):  # results/baselines a link to a file: "move the file away", followed, left a link to nothing (C203)
    from fwbench.bench.regression import baseline_path_for, judged_baseline

    (ctx.tmp_path / "notes.txt").write_text("not a directory\n")
    directory = ctx.tmp_path / "baselines"
    directory.symlink_to("notes.txt")
    answer = raised(ValueError, judged_baseline, "AMD EPYC", directory, model="AMD EPYC")
    assert raised(ValueError, baseline_path_for, "AMD EPYC", directory) == answer  # --update-baseline's, before measuring
    return answer


@row("C228")
def _(ctx):  # results/baselines a link under a file: "create the link's target", which no one can
    from fwbench.bench.regression import baseline_path_for, judged_baseline

    (ctx.tmp_path / "notes.txt").write_text("not a directory\n")
    directory = ctx.tmp_path / "baselines"
    directory.symlink_to("notes.txt/sub")
    answer = raised(ValueError, judged_baseline, "AMD EPYC", directory, model="AMD EPYC")
    assert raised(ValueError, baseline_path_for, "AMD EPYC", directory) == answer  # --update-baseline's, before measuring
    return answer


@row("C196")
def _(ctx):
    from fwbench.bench.regression import baseline_path_for, judged_baseline

    directory = ctx.tmp_path / "baselines"
    directory.write_text("not a directory\n")
    answer = raised(ValueError, judged_baseline, "AMD EPYC", directory, model="AMD EPYC")
    assert raised(ValueError, baseline_path_for, "AMD EPYC", directory) == answer  # --update-baseline's, before measuring
    return answer


@row("C203")
def _(ctx):
    from fwbench.bench.regression import baseline_path_for, judged_baseline

    directory = ctx.tmp_path / "baselines"
    directory.symlink_to(ctx.tmp_path / "gone")
    answer = raised(ValueError, judged_baseline, "AMD EPYC", directory, model="AMD EPYC")
    assert raised(ValueError, baseline_path_for, "AMD EPYC", directory) == answer  # --update-baseline's, before measuring
    return answer


@row("C215")
def _(ctx):
    from fwbench.bench.regression import baseline_path_for, judged_baseline

    directory = ctx.tmp_path / "baselines"
    directory.symlink_to(directory)  # a link that loops: its target exists, and no directory can be made there
    answer = raised(ValueError, judged_baseline, "AMD EPYC", directory, model="AMD EPYC")
    assert raised(ValueError, baseline_path_for, "AMD EPYC", directory) == answer  # --update-baseline's, before measuring
    return answer


@row("C255")
def _(ctx):
    from fwbench.bench.regression import baseline_path_for, judged_baseline

    (ctx.tmp_path / "loop").symlink_to("loop")
    directory = ctx.tmp_path / "baselines"
    directory.symlink_to("loop/sub")  # leads into loop's loop; it does not lead back to itself
    answer = raised(ValueError, judged_baseline, "AMD EPYC", directory, model="AMD EPYC")
    assert raised(ValueError, baseline_path_for, "AMD EPYC", directory) == answer
    return answer


@row("C256")
def _(ctx):
    from fwbench.bench.regression import baseline_path_for, judged_baseline

    directory = ctx.tmp_path / "baselines"
    directory.mkdir()
    (directory / "perf_baseline.json").symlink_to("../nodir/p.json")  # no file can be written through it
    answer = raised(ValueError, judged_baseline, "AMD EPYC", directory, model="AMD EPYC")
    assert raised(ValueError, baseline_path_for, "AMD EPYC", directory) == answer  # --update-baseline's, before measuring
    assert not (ctx.tmp_path / "nodir").exists()
    return answer


@row("C259")
def _(ctx):
    """A baseline file that is a named pipe: the gate hung reading it (so it is read in a subprocess, with a timeout)."""
    directory = ctx.tmp_path / "baselines"
    directory.mkdir()
    os.mkfifo(directory / "perf_baseline.json")
    probe = ("import sys; from pathlib import Path\n"
             "from fwbench.bench.regression import judged_baseline\n"
             "try:\n    judged_baseline('AMD EPYC', Path(sys.argv[1]), model='AMD EPYC')\n"
             "except ValueError as exc:\n    print(f'{type(exc).__name__}: {exc}')\n")
    done = subprocess.run([sys.executable, "-c", probe, str(directory)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout.strip()


@row("C254")
def _(ctx):
    """A results directory that is a link into another link's loop: it was called a loop itself."""
    (ctx.tmp_path / "loop").symlink_to("loop")
    results = ctx.tmp_path / "R"
    results.symlink_to("loop/sub")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(ctx.tmp_path / "out"))
    assert not (ctx.tmp_path / "out").exists()
    return answer


@row("C172")
def _(ctx):
    results, out = ctx.tmp_path / "empty", ctx.tmp_path / "out"
    results.mkdir()
    (results / "runs.lock").touch()
    out.mkdir()
    (out / "REPORT.md").write_text("the report a user keeps\n")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    assert (out / "REPORT.md").read_text() == "the report a user keeps\n"
    assert sorted(p.name for p in out.iterdir()) == ["REPORT.md"]
    return answer


@row("C173")
def _(ctx):
    results = ctx.tmp_path / "new"
    for options in (["--profile", "nope"], ["--variants", "lineer"]):
        cli(ctx, "bench", "--results-dir", str(results), *options)
        assert not results.exists(), options
    answer = cli(ctx, "bench", "--results-dir", str(results), "--lengths", "0")
    assert not results.exists()  # nothing made: no empty bench.jsonl, no lock
    return answer


def report_on_unreadable_lines(ctx, text: str, skipped: int, first: str) -> str:
    """``fwbench report`` on a runs.jsonl of ``text`` whose lines are none of them a run record: it
    refuses without writing, counting the ``skipped`` lines and naming the first (``first``: ":1" for a
    line number, or what follows the path for a record that decoded but is no run record: its run id and
    the fields missing or mistyped, ": record 'x' (missing or mistyped: config.S)")."""
    results, out = ctx.tmp_path / "unreadable", ctx.tmp_path / "out"
    results.mkdir()
    (results / "runs.jsonl").write_text(text)
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    assert not out.exists()
    kind = "record(s) skipped as no run record" if first.startswith(": record") else "corrupt or truncated line(s) skipped"
    assert f"{skipped} {kind}, the first {results / 'runs.jsonl'}{first})" in answer
    return answer


@row("C174")
def _(ctx):
    return report_on_unreadable_lines(ctx, '{"run_id": 3}\nnot json\n', 2, ":1")  # a run id that is no string; no JSON


@row("C175")
def _(ctx):  # json raises ValueError and RecursionError, not a decode error
    return report_on_unreadable_lines(ctx, "1" * 5000 + "\n" + "[" * 100_000 + "\n", 2, ":1")


@row("C176")
def _(ctx):  # an object with a run id, none of a run record's fields
    return report_on_unreadable_lines(ctx, '{"run_id": "x"}\n', 1, ": record 'x' (missing or mistyped: task, variant, "
                                      "seed, status, steps, wall_s, config, metrics)")


@row("C195")
def _(ctx):
    """The places in C176's refusal are built from their parts, not read back out of the skipped lines' messages."""
    results, out = ctx.tmp_path / "R: old", ctx.tmp_path / "out"
    results.mkdir()
    (results / "runs.jsonl").write_text('not json\n{"run_id": "x skipped: no run record"}\n')
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    assert not out.exists()
    assert f"the first {results / 'runs.jsonl'}:1; " in answer
    assert f"the first {results / 'runs.jsonl'}: record 'x skipped: no run record' (missing or mistyped: " in answer
    return answer


@row("C204")
def _(ctx):
    """A records file that is a directory: the report's check of an empty store raised IsADirectoryError."""
    results, out = ctx.tmp_path / "R", ctx.tmp_path / "out"
    (results / "runs.jsonl").mkdir(parents=True)
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    assert not out.exists()
    return answer


@row("C214")
def _(ctx):
    """A records file that is a link looping back to itself: read as no file, the store was called empty."""
    results, out = ctx.tmp_path / "R", ctx.tmp_path / "out"
    results.mkdir()
    (results / "runs.jsonl").symlink_to("runs.jsonl")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    assert not out.exists()
    return answer


@row("C222")
def _(ctx):
    """A results directory that is a link looping back to itself: the advice named R/runs.jsonl, neither a directory nor a
    file, and left the link as it was."""
    results = ctx.tmp_path / "R"
    results.symlink_to("R")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")
    assert results.is_symlink() and not (ctx.tmp_path / "runs.jsonl").exists()
    return answer


@row("C224")
def _(ctx):
    """A records file that is a link into a missing directory: the refusal named R/runs.jsonl, R being there."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    (results / "runs.jsonl").symlink_to("../nodir/x.jsonl")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")
    assert not (ctx.tmp_path / "nodir").exists()
    return answer


@row("C227")
def _(ctx):
    """A results directory that is a link to a path under a file: advised to create what no one can."""
    (ctx.tmp_path / "notes.txt").write_text("notes\n")
    results = ctx.tmp_path / "R"
    results.symlink_to("notes.txt/sub")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")
    assert (ctx.tmp_path / "notes.txt").read_text() == "notes\n"
    return answer


@row("C229")
def _(ctx):
    """A results directory to report on that is a link to nothing: it was "not a directory", the link unnamed."""
    results = ctx.tmp_path / "R"
    results.symlink_to("gone")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(ctx.tmp_path / "out"))
    assert not (ctx.tmp_path / "out").exists()
    return answer


@row("C230")
def _(ctx):
    """A lock file that is a link into a missing directory: 'No such file or directory', R being there."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    (results / "runs.lock").symlink_to("../nodir/l")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")
    assert not (ctx.tmp_path / "nodir").exists()
    return answer


@row("C251")
def _(ctx):
    """A claims file that is a link into a missing directory: a traceback from os.open at the first claim."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    (results / "claims.lock").symlink_to("../nodir/c")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")
    assert not (ctx.tmp_path / "nodir").exists() and (results / "runs.jsonl").read_text() == ""
    return answer


@row("C252")
def _(ctx):
    """A lock file that is a directory: 'Is a directory', with no word of what it must be."""
    results = ctx.tmp_path / "R"
    (results / "runs.lock").mkdir(parents=True)
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")


@row("C253")
def _(ctx):
    """A torn-lines file that is a directory: the run trained, then its append named runs.jsonl."""
    results = ctx.tmp_path / "R"
    (results / "runs.jsonl.torn").mkdir(parents=True)
    (results / "runs.jsonl").write_text('{"run_id": "b", "me')
    ctx.capsys.readouterr()
    status = main(["run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet"])
    # two lines: the warning for the torn line, then the refusal
    warning, refusal = ctx.capsys.readouterr().err.splitlines()
    assert warning.endswith("runs.jsonl:1: corrupt or truncated record skipped"), warning
    assert (results / "runs.jsonl").read_text() == '{"run_id": "b", "me'
    return f"exit {status}: {refusal}"


@row("C257")
def _(ctx):
    """A records file to report on that is a link to nothing: the directory was called empty, the link unnamed."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    (results / "runs.jsonl").symlink_to("gone.jsonl")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(ctx.tmp_path / "out"))
    assert not (ctx.tmp_path / "out").exists()
    return answer


@row("C258")
def _(ctx):
    """A records file that is a link to /dev/null: the run said it trained, and its record was gone."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    (results / "runs.jsonl").symlink_to("/dev/null")
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")


@row("C260")
def _(ctx):
    """A checkpoints entry that is a file, with a grid that keeps checkpoints: each run failed at its first one."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    (results / "checkpoints").write_text("notes\n")
    # refused before the corpus is read: the data directory holds none
    grid = grid_file(ctx, LM_GRID + "context = 16\nmax_steps = 4\neval_every = 2\ncheckpoint_every = 2\n")
    answer = cli(ctx, "run", str(grid), "--results-dir", str(results), "--data-dir", str(ctx.tmp_path), "--quiet")
    assert (results / "runs.jsonl").read_text() == ""
    return answer


@row("C271")
def _(ctx):
    """A checkpoints entry that is a named pipe, with a grid that keeps checkpoints: told as 'File exists'."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    os.mkfifo(results / "checkpoints")
    # refused before the corpus is read: the data directory holds none
    grid = grid_file(ctx, LM_GRID + "context = 16\nmax_steps = 4\neval_every = 2\ncheckpoint_every = 2\n")
    answer = cli(ctx, "run", str(grid), "--results-dir", str(results), "--data-dir", str(ctx.tmp_path), "--quiet")
    assert (results / "runs.jsonl").read_text() == ""
    return answer


@row("C272")
def _(ctx):
    """A claims file that is a link to a directory: 'move the directory away' named the link's target."""
    results = ctx.tmp_path / "R"
    results.mkdir()
    (ctx.tmp_path / "P" / "sub").mkdir(parents=True)
    (results / "claims.lock").symlink_to("../P/sub")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")
    assert (results / "runs.jsonl").read_text() == ""
    return answer


@row("C273")
def _(ctx):
    """A results directory that is a link to itself through a linked directory: said to lead into another link."""
    (ctx.tmp_path / "via").symlink_to(ctx.tmp_path)
    results = ctx.tmp_path / "R"
    results.symlink_to(ctx.tmp_path / "via" / "R")
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")


@row("C274")
def _(ctx):
    """A results directory holding a name of 300 bytes: a traceback, 'File name too long'."""
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(ctx.tmp_path / ("a" * 300)), "--quiet")


@row("C275")
def _(ctx):
    """A records file linked into a directory that is not writable: 'Permission denied' at its lock, with no mend."""
    import fwbench.run.store as store_module

    first, second = ctx.tmp_path / "R1", ctx.tmp_path / "R2"
    first.mkdir()
    second.mkdir()
    (first / "runs.jsonl").write_text("")
    (second / "runs.jsonl").symlink_to("../R1/runs.jsonl")
    real_access = os.access  # root may write anywhere: R1's permission is what os.access says
    ctx.monkeypatch.setattr(store_module.os, "access", lambda path, mode: False if Path(path) == first and
                            mode == os.W_OK else real_access(path, mode))
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(second), "--quiet")



@row("C276")
def _(ctx):
    """A results directory that is a link to a name of 260 bytes: said to be a path too long, of 1 byte."""
    ctx.monkeypatch.chdir(ctx.tmp_path)
    os.symlink("é" * 130, "R")
    return cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", "R", "--quiet")


@row("C277")
def _(ctx):
    """A relative results directory under a working directory past the path limit, keeping checkpoints: each run
    failed at its first checkpoint, named by its full path."""
    grid = grid_file(ctx, LM_GRID + "context = 16\nmax_steps = 4\neval_every = 2\ncheckpoint_every = 2\n")
    ctx.monkeypatch.chdir(ctx.tmp_path)
    for _ in range(25):
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    answer = cli(ctx, "run", str(grid), "--results-dir", "R", "--data-dir", str(ctx.tmp_path), "--quiet")
    assert Path("R/runs.jsonl").read_text() == ""
    return answer


@row("C278")
def _(ctx):
    """A bench records file linked into a directory that is not writable: said to want its claims file too."""
    import fwbench.run.store as store_module

    first, second = ctx.tmp_path / "R1", ctx.tmp_path / "R2"
    first.mkdir()
    second.mkdir()
    (first / "bench.jsonl").write_text("")
    (second / "bench.jsonl").symlink_to("../R1/bench.jsonl")
    real_access = os.access  # root may write anywhere: R1's permission is what os.access says
    ctx.monkeypatch.setattr(store_module.os, "access", lambda path, mode: False if Path(path) == first and
                            mode == os.W_OK else real_access(path, mode))
    return cli(ctx, "bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
               "--results-dir", str(second), "--quiet")

@row("C279")
def _(ctx):
    """A records file's link re-pointed to a name of 300 bytes while its run trained: a traceback from the append, 'File
    name too long', and the run's record lost unsaid."""
    import fwbench.run.runner as runner

    ctx.monkeypatch.chdir(ctx.tmp_path)
    for name in ("A", "B", "D"):
        os.mkdir(name)
    os.symlink("../A/runs.jsonl", "B/runs.jsonl")

    def launch(specs, options, progress_for):
        for spec in specs:
            os.symlink("../D/" + "a" * 300, "B/new")
            os.replace("B/new", "B/runs.jsonl")
            yield {"run_id": spec.run_id, "status": "converged", "variant": {"spec": spec.label}}

    ctx.monkeypatch.setattr(runner, "launch", launch)
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", "B", "--quiet")
    assert Path("A/runs.jsonl").read_text() == ""
    return answer


@row("C280")
def _(ctx):
    """A records file's link re-pointed to a name of 300 bytes between two runs: a traceback from the next claim."""
    import fwbench.run.runner as runner

    ctx.monkeypatch.chdir(ctx.tmp_path)
    for name in ("A", "B", "D"):
        os.mkdir(name)
    os.symlink("../A/runs.jsonl", "B/runs.jsonl")
    launched = []

    def launch(specs, options, progress_for):
        for spec in specs:
            launched.append(spec.run_id)
            yield {"run_id": spec.run_id, "status": "converged", "variant": {"spec": spec.label}}
            os.symlink("../D/" + "a" * 300, "B/new")  # after the record is stored, before the next run is claimed
            os.replace("B/new", "B/runs.jsonl")

    ctx.monkeypatch.setattr(runner, "launch", launch)
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID.replace("seed = 1", "seed = [1, 2]"))), "--results-dir", "B", "--quiet",
                 "--no-pack")
    assert len(launched) == 1 and len(Path("A/runs.jsonl").read_text().splitlines()) == 1
    return answer


@row("C225")
def _(ctx):
    """A results directory that is a link to nothing: mkdir met the link, 'File exists'."""
    results = ctx.tmp_path / "R"
    results.symlink_to("gone")
    answer = cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(results), "--quiet")
    assert not (ctx.tmp_path / "gone").exists()
    return answer


@row("C205")
def _(ctx):
    """A --results-dir holding a newline: the refusal's places split its one line in two."""
    results, out = ctx.tmp_path / "R\nnew", ctx.tmp_path / "out"
    results.mkdir()
    (results / "runs.jsonl").write_text("not json\n")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    assert not out.exists()
    return answer


@row("C177")
def _(ctx):
    """Ray sets a GPU task's CUDA_VISIBLE_DEVICES to the GPUs it reserved, numbered from cuda:0 in the
    worker: ``--device cuda:1 --gpus-per-run 1`` failed every run ('expected cuda:N with N < 1')."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    assert cli(ctx, "run", "capacity", "--launcher", "ray", "--device", "cuda:2", "--gpus-per-run", "2",
               "--results-dir", str(ctx.tmp_path / "r")) == (
        "exit 2: fwbench: error: --device: got 'cuda:2' with --launcher ray --gpus-per-run 2; expected cuda or "
        "cuda:N with N < 2 (Ray gives each run 2 GPUs of its own, numbered from cuda:0 in its worker, whatever "
        "their number on the machine)")
    for device, gpus in (("cuda:0", 0.25), ("cuda:1", 2.0), ("cuda:3", 0.0), ("cuda", 1.0)):  # still accepted
        check_ray_resources(LaunchOptions(launcher="ray", device=device, gpus_per_run=gpus))
    assert not (ctx.tmp_path / "r").exists()
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--device", "cuda:1", "--gpus-per-run", "1",
               "--results-dir", str(ctx.tmp_path / "r"))


@row("C179")
def _(ctx):
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--device", "cpu", "--gpus-per-run", "1",
               "--results-dir", str(ctx.tmp_path / "r"))


@row("C180")
def _(ctx):
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    where = ctx.tmp_path / "a$b"
    where.mkdir()
    ctx.monkeypatch.chdir(where)
    ctx.monkeypatch.setenv("PYTHONPATH", "lib$x")  # a '$' of its own and one from the working directory: both fixes
    assert raised(FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cpu")).endswith(
        "; rename the entry's directory and run from a directory without '$', or give the entry as an absolute path "
        "through a link (running from a link does not help: the working directory is read with its links resolved))")
    ctx.monkeypatch.chdir(ctx.tmp_path)
    ctx.monkeypatch.setenv("PYTHONPATH", "/home/me/$lib")
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer


@row("C181")
def _(ctx):
    """C180's '$' reached the workers another way: each PYTHONPATH entry is made absolute against the
    working directory (ray_worker_env), so '.' or an empty entry run from /home/me/$lib gave them
    /home/me/$lib, which Ray expanded ($lib unset: /home/me/)."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    where = ctx.tmp_path / "a$lib"
    where.mkdir()
    ctx.monkeypatch.chdir(where)
    ctx.monkeypatch.setenv("PYTHONPATH", f"/abs/lib{os.pathsep}")  # an empty entry: the working directory
    assert cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r")).startswith(
        f"exit 2: fwbench: error: $PYTHONPATH: got '/abs/lib{os.pathsep}' with --launcher ray, whose entry '' is ")
    ctx.monkeypatch.setenv("PYTHONPATH", "/abs/lib")  # still accepted: absolute entries only
    check_ray_resources(LaunchOptions(launcher="ray", device="cpu"))
    ctx.monkeypatch.setenv("PYTHONPATH", ".")
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer


@row("C184")
def _(ctx):
    """C181's kind with the path separator: a relative or empty PYTHONPATH entry run from /home/me/a:b was
    given to the workers as /home/me/a:b, two entries (/home/me/a and b); the check raised a ValueError
    (zip of one entry against two) and the command ended in a traceback."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources, ray_worker_env, worker_python_path

    where = ctx.tmp_path / f"a{os.pathsep}b"
    where.mkdir()
    ctx.monkeypatch.chdir(where)
    for python_path in (f"/abs/lib{os.pathsep}", "./lib", ".."):  # '..' is the tmp folder: still accepted
        ctx.monkeypatch.setenv("PYTHONPATH", python_path)
        given = ray_worker_env(1)["PYTHONPATH"].split(os.pathsep)[:-1]
        sent = [absolute for _, absolute in worker_python_path(os.environ)]
        if python_path == "..":
            assert given == sent == [str(ctx.tmp_path)]
            check_ray_resources(LaunchOptions(launcher="ray", device="cpu"))
        else:  # the workers would be given more entries than were written: refused
            assert len(given) > len(python_path.split(os.pathsep))
            assert f"expected directories without {os.pathsep!r}" in raised(
                FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cpu"))
    ctx.monkeypatch.setenv("PYTHONPATH", ".")
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    # the local launcher sends no environment: the same PYTHONPATH and working directory run there
    assert cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--results-dir", str(ctx.tmp_path / "local"),
               "--quiet") == "exit 0: "
    return answer


@row("C185")
def _(ctx):
    """A PYTHONPATH entry whose name is not UTF-8 (os.environ and os.getcwd() give its bytes as lone surrogates,
    '\udcff') was sent to the Ray workers as it is: Ray's runtime environment is JSON, its C++ side refused the
    surrogate (nlohmann parse_error) and every worker aborted, each run a WorkerCrashedError (a Ray instance,
    checked). Refused before Ray starts, whether the entry is written so or made so by the working directory."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    options = LaunchOptions(launcher="ray", device="cpu")
    ctx.monkeypatch.setenv("PYTHONPATH", os.fsdecode(b"/abs/a\xffb"))
    assert "whose names are UTF-8" in raised(FwbenchError, check_ray_resources, options)
    ctx.monkeypatch.setenv("PYTHONPATH", "/abs/\u03bd-lib")  # UTF-8, not ASCII: still accepted
    check_ray_resources(options)
    where = Path(os.fsdecode(bytes(ctx.tmp_path) + b"/a\xffb"))
    where.mkdir()
    ctx.monkeypatch.chdir(where)
    for python_path in (".", f"/abs/lib{os.pathsep}"):  # '.' and an empty entry: this working directory
        ctx.monkeypatch.setenv("PYTHONPATH", python_path)
        assert raised(FwbenchError, check_ray_resources, options).endswith(
            "expected directories whose names are UTF-8 (Ray cannot give its workers other bytes: each worker would "
            "crash; run from a directory whose name is UTF-8: neither a link to it nor an absolute entry through one "
            "helps (the working directory is read with its links resolved, and Ray sends it to its workers too))")
    ctx.monkeypatch.setenv("PYTHONPATH", ".")
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer


@row("C186")
def _(ctx):
    """Ray's address 'local' starts a new instance for the command (ray.init's documented meaning), but was taken
    for a cluster's: --ray-num-cpus was not passed and no run was compared with the instance (a hang)."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ctx.monkeypatch.delenv("PYTHONPATH", raising=False)
    # checked first in-process: the old code accepted it, and the command would then have started Ray
    options = LaunchOptions(launcher="ray", device="cpu", cpus_per_run=2.0, ray_num_cpus=1, ray_address="local")
    assert "expected at most 1, the CPUs of the local Ray instance" in raised(FwbenchError, check_ray_resources, options)
    ctx.monkeypatch.setenv("RAY_ADDRESS", "local")
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-num-cpus", "1", "--cpus-per-run", "2",
                 "--results-dir", str(ctx.tmp_path / "env"))
    ctx.monkeypatch.delenv("RAY_ADDRESS")
    assert cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-address", "local", "--ray-num-cpus", "1",
               "--cpus-per-run", "2", "--results-dir", str(ctx.tmp_path / "r")) == answer
    assert not (ctx.tmp_path / "r").exists() and not (ctx.tmp_path / "env").exists()
    return answer


@row("C187")
def _(ctx):
    """--ray-num-cpus sizes a Ray instance started here; with a cluster's address Ray is given none: ignored."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    ctx.monkeypatch.delenv("PYTHONPATH", raising=False)
    ctx.monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert "--ray-num-cpus: got 4 with $RAY_ADDRESS 'auto', where it has no effect" in raised(
        FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cpu", ray_num_cpus=4))
    ctx.monkeypatch.delenv("RAY_ADDRESS")
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-address", "10.0.0.1:6379", "--ray-num-cpus", "4",
               "--results-dir", str(ctx.tmp_path / "r"))

@row("C188")
def _(ctx):
    """Ray's ray.init puts the driver's working directory in the job's configuration, a protobuf whose strings must
    be UTF-8 (ray.job_config.JobConfig._serialize raises UnicodeEncodeError on '\\udcff'): from a directory whose
    name is not UTF-8 it failed once its instance had started, and the error blamed --ray-address ('auto')."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    where = Path(os.fsdecode(bytes(ctx.tmp_path) + b"/a\xffb"))
    where.mkdir()
    ctx.monkeypatch.chdir(where)
    ctx.monkeypatch.delenv("PYTHONPATH", raising=False)
    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:  # what Ray does with it, where Ray is installed: why it is refused
        from ray.job_config import JobConfig
    except ImportError:
        pass
    else:
        config = JobConfig()
        config._py_driver_sys_path.append(os.path.abspath(os.curdir))
        with pytest.raises(UnicodeEncodeError):
            config._serialize()
    # checked first in-process: the old code accepted it, and the command would then have started Ray
    for address in (None, "auto", "local"):
        assert "the working directory: got" in raised(FwbenchError, check_ray_resources,
                                                      LaunchOptions(launcher="ray", device="cpu", ray_address=address))
    check_ray_resources(LaunchOptions(launcher="ray", device="cpu", ray_address="ray://head:10001"))  # sends none
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer

@row("C182")
def _(ctx):
    """The grid's name names `fwbench capacity`'s files (OUT/NAME.csv, OUT/NAME.png): '../up' wrote
    them beside --out, '/tmp/x' to /tmp, '' as hidden files (.csv, .png.png), a NUL raised after training."""
    grid = (Path(__file__).parent.parent / "fwbench" / "grids" / "capacity.toml").read_text()
    out = ctx.tmp_path / "out"
    for name in ("/tmp/x", "", "..", "a\\\\b", "a\\bb", "a\\u0000b", "a\\nb"):
        (ctx.tmp_path / "bad.toml").write_text(grid.replace('name = "capacity"', f'name = "{name}"', 1))
        assert "name: got " in cli(ctx, "capacity", "--grid", str(ctx.tmp_path / "bad.toml"), "--out", str(out),
                                   "--results-dir", str(ctx.tmp_path / "r")), name
    for name in ("my grid", "ν-sweep", "a|b", "a$b"):  # file names: still accepted
        (ctx.tmp_path / "ok.toml").write_text(grid.replace('name = "capacity"', f'name = "{name}"', 1))
        assert load_grid(ctx.tmp_path / "ok.toml").name == name
    (ctx.tmp_path / "g.toml").write_text(grid.replace('name = "capacity"', 'name = "../up"', 1))
    answer = cli(ctx, "capacity", "--grid", str(ctx.tmp_path / "g.toml"), "--out", str(out),
                 "--results-dir", str(ctx.tmp_path / "r"))
    assert not out.exists() and not (ctx.tmp_path / "r").exists() and not (ctx.tmp_path / "up.csv").exists()
    return answer


@row("C183")
def _(ctx):
    """A grid name longer than a file name may be: `fwbench capacity` trained every run, then raised
    OSError "File name too long" writing OUT/NAME.csv (a traceback, no CSV, no figure)."""
    grid = (Path(__file__).parent.parent / "fwbench" / "grids" / "capacity.toml").read_text()
    out = ctx.tmp_path / "out"
    for name in ("g" * 252, "ν" * 126, "g" * 300):  # 252 bytes: NAME.csv is 256, one more than a file name holds
        (ctx.tmp_path / "bad.toml").write_text(grid.replace('name = "capacity"', f'name = "{name}"', 1))
        assert "at most 251 bytes" in cli(ctx, "capacity", "--grid", str(ctx.tmp_path / "bad.toml"), "--out",
                                          str(out), "--results-dir", str(ctx.tmp_path / "r")), name
    for name in ("g" * 251, "ν" * 125 + "g"):  # 251 bytes: the longest name whose files can be written
        (ctx.tmp_path / "ok.toml").write_text(grid.replace('name = "capacity"', f'name = "{name}"', 1))
        assert load_grid(ctx.tmp_path / "ok.toml").name == name
        (out / f"{name}.png").parent.mkdir(exist_ok=True)
        (out / f"{name}.png").write_bytes(b"")  # the file system takes it
    (ctx.tmp_path / "g.toml").write_text(grid.replace('name = "capacity"', f'name = "{"g" * 252}"', 1))
    answer = cli(ctx, "capacity", "--grid", str(ctx.tmp_path / "g.toml"), "--out", str(ctx.tmp_path / "o2"),
                 "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()  # refused before any run trained
    return answer


@row("C178")
def _(ctx):  # a run record but for one field below the top level (config.S a string)
    from dataclasses import asdict

    from fwbench.tasks import RetrievalConfig

    record = {"run_id": "x", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1, "status": "max_steps",
              "steps": 10, "wall_s": 1.0, "config": {**asdict(RetrievalConfig()), "S": "3"},
              "metrics": {"best_eval_loss": 0.5}}
    return report_on_unreadable_lines(ctx, json.dumps(record) + "\n", 1, ": record 'x' (missing or mistyped: config.S)")


@row("C200")
def _(ctx):  # a bench.jsonl record without finished_at: the report's speed section raised KeyError
    from fwbench.bench.suite import BENCH_RECORDS, FORWARD, _record

    case = {"B": 1, "H": 2, "d_head": 8, "device": "cpu", "variant": "linear", "form": "chunk", "mode": FORWARD, "T": 32,
            "status": "ok", "median_s": 0.001}
    record = {k: v for k, v in _record("s", case, {}).items() if k != "finished_at"}
    readable = _record("s", {**case, "T": 64}, {})  # alone, the store is refused (C176's kind)
    results, out = ctx.tmp_path / "bench", ctx.tmp_path / "out"
    results.mkdir()
    (results / BENCH_RECORDS).write_text(json.dumps(readable) + "\n" + json.dumps({**record, "run_id": "x"}) + "\n")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    skipped = [line for line in (out / "REPORT.md").read_text().splitlines() if "skipped: no benchmark" in line]
    return f"{answer.split(':')[0]}; REPORT.md, under Benchmark records skipped: {skipped[0]}"


@row("C202")
def _(ctx):  # an "ok" bench record whose median_s is null: the time table raised TypeError
    from fwbench.bench.suite import BENCH_RECORDS, FORWARD, _record

    case = {"B": 1, "H": 2, "d_head": 8, "device": "cpu", "variant": "linear", "form": "chunk", "mode": FORWARD, "T": 32,
            "status": "ok", "median_s": None}
    results, out = ctx.tmp_path / "bench", ctx.tmp_path / "out"
    results.mkdir()
    readable = _record("s", {**case, "T": 64, "median_s": 0.001}, {})  # alone, the store is refused (C176's kind)
    bad = {**_record("s", case, {}), "run_id": "x"}
    (results / BENCH_RECORDS).write_text(json.dumps(readable) + "\n" + json.dumps(bad) + "\n")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    skipped = [line for line in (out / "REPORT.md").read_text().splitlines() if "skipped: no benchmark" in line]
    return f"{answer.split(':')[0]}; REPORT.md, under Benchmark records skipped: {skipped[0]}"


@row("C212")
def _(ctx):  # an "ok" bench record whose null median_s non_finite lists as 10**400: OverflowError restoring it
    from fwbench.bench.suite import BENCH_RECORDS, FORWARD, _record

    case = {"B": 1, "H": 2, "d_head": 8, "device": "cpu", "variant": "linear", "form": "chunk", "mode": FORWARD, "T": 32,
            "status": "ok", "median_s": None}
    results, out = ctx.tmp_path / "bench", ctx.tmp_path / "out"
    results.mkdir()
    readable = _record("s", {**case, "T": 64, "median_s": 0.001}, {})
    bad = {**_record("s", case, {}), "run_id": "x", "non_finite": {"median_s": 10**400}}
    (results / BENCH_RECORDS).write_text(json.dumps(readable) + "\n" + json.dumps(bad) + "\n")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    skipped = [line for line in (out / "REPORT.md").read_text().splitlines() if "skipped: no benchmark" in line]
    return f"{answer.split(':')[0]}; REPORT.md, under Benchmark records skipped: {skipped[0]}"


@row("C213")
def _(ctx):  # a bench record whose status is none fwbench bench writes: drawn nowhere, named nowhere
    from fwbench.bench.suite import BENCH_RECORDS, FORWARD, _record

    case = {"B": 1, "H": 2, "d_head": 8, "device": "cpu", "variant": "linear", "form": "chunk", "mode": FORWARD, "T": 32,
            "status": "OK", "median_s": 0.002}
    results, out = ctx.tmp_path / "bench", ctx.tmp_path / "out"
    results.mkdir()
    readable = _record("s", {**case, "T": 64, "status": "ok", "median_s": 0.001}, {})
    bad = {**_record("s", case, {}), "run_id": "x"}
    (results / BENCH_RECORDS).write_text(json.dumps(readable) + "\n" + json.dumps(bad) + "\n")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    skipped = [line for line in (out / "REPORT.md").read_text().splitlines() if "skipped: no benchmark" in line]
    return f"{answer.split(':')[0]}; REPORT.md, under Benchmark records skipped: {skipped[0]}"


@row("C216")
def _(ctx):  # bench.jsonl of cases none measured (oom): the report drew an empty figure over --out
    from fwbench.bench.suite import BENCH_RECORDS, FORWARD, _record

    case = {"B": 1, "H": 2, "d_head": 8, "device": "cpu", "variant": "linear", "form": "chunk", "mode": FORWARD, "T": 32,
            "status": "oom", "reason": "OutOfMemoryError: CUDA out of memory"}
    results, out = ctx.tmp_path / "bench", ctx.tmp_path / "out"
    results.mkdir()
    (results / BENCH_RECORDS).write_text(json.dumps(_record("s", case, {})) + "\n")
    answer = cli(ctx, "report", "--results-dir", str(results), "--out", str(out))
    assert not out.exists()
    return answer


@row("C201")
def _(ctx):  # fwbench estimate --against a store whose record of the grid's run holds wall_s "3"
    import fwbench.bench.estimate_command as command
    from fwbench.run.grid import expand, load_grid

    ctx.monkeypatch.setattr(command, "measure_step_seconds", lambda spec, steps: 0.01)  # no timing: not the point
    ctx.monkeypatch.setattr(command, "measure_eval_seconds", lambda spec: (0.5, 0.0))
    grid = ctx.tmp_path / "g.toml"
    grid.write_text(TINY_GRID)
    spec = expand(load_grid(grid), "quick")[0]
    results = ctx.tmp_path / "r"
    results.mkdir()
    (results / "runs.jsonl").write_text(json.dumps({"run_id": spec.run_id, "status": "plateau", "steps": 5,
                                                    "wall_s": "3"}) + "\n")
    ctx.capsys.readouterr()
    status = main(["estimate", str(grid), "--against", str(results)])
    warning = ctx.capsys.readouterr().err.splitlines()[0]  # then a line per timed cell
    return f"exit {status}: {warning}"


@row("C206")
def _(ctx):  # fwbench estimate --against: two records whose steps are 2**1023 (308 digits): OverflowError
    import fwbench.bench.estimate_command as command
    from fwbench.run.grid import expand, load_grid

    ctx.monkeypatch.setattr(command, "measure_step_seconds", lambda spec, steps: 0.01)  # no timing: not the point
    ctx.monkeypatch.setattr(command, "measure_eval_seconds", lambda spec: (0.5, 0.0))
    grid = ctx.tmp_path / "g.toml"
    grid.write_text(TINY_GRID)
    results = ctx.tmp_path / "r"
    results.mkdir()
    (results / "runs.jsonl").write_text("".join(json.dumps({
        "run_id": spec.run_id, "status": "plateau", "steps": 2**1023, "wall_s": 3.0}) + "\n"
        for spec in expand(load_grid(grid), "quick", [1, 2])))  # two runs: one such integer alone sums to itself
    ctx.capsys.readouterr()
    status = main(["estimate", str(grid), "--seeds", "1", "2", "--against", str(results)])
    total = [line for line in ctx.capsys.readouterr().out.splitlines() if line.startswith("| total |")]
    return f"exit {status}: {total[0].split(' | ')[1]} runs compared"


@row("H81")
def _(ctx):
    text = "".join(f"It is line {i % 7}: the quick brown fox jumps.\n" for i in range(100))
    (ctx.tmp_path / "input.txt").write_text(text)
    task = ShakespeareTask(data_dir=ctx.tmp_path, sha256=hashlib.sha256(text.encode()).hexdigest())
    config = ShakespeareConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16, context=16,
                               train_fraction=(len(text) - 200 + 0.5) / len(text))
    return raised(CorpusError, task.build_model, config, "linear")


@row("H82")
def _(ctx):
    store = ResultsStore(ctx.tmp_path / "r")
    specs = [RunSpec("capacity", "retrieval", "linear", 1, asdict(tasks.RetrievalConfig(S=3, d_key=4, max_steps=1)))]
    for quiet in ("no", 1):
        assert raised(FwbenchError, run_grid, specs, store, quiet=quiet) == f"FwbenchError: quiet: got {quiet!r}; " \
                                                                             "expected True or False"
    answer = raised(FwbenchError, run_grid, specs, store, pack="off")
    assert not (ctx.tmp_path / "r" / "runs.jsonl").exists()  # refused before any training
    return answer


@row("H83")
def _(ctx):
    """The retrieval generators drew Setting 2 for any setting but 1 ('1', 3, None), silently."""
    import numpy as np

    from fwbench.tasks.retrieval import generate_sequences, sample_batch

    generator = torch.Generator().manual_seed(0)
    for setting in 3, "1", 0, True, 1.0, None:
        for draw in sample_batch, generate_sequences:
            assert raised(ValueError, draw, setting, 4, 2, generator) == \
                f"ValueError: setting: got {setting!r}; expected 1 (capacity) or 2 (overwriting)"
    assert sample_batch(np.int64(2), 4, 2, generator)["keys"].shape == (2, 8)  # NumPy integers are taken
    return raised(ValueError, sample_batch, 3, 4, 2, generator)


@row("H84")
def _(ctx):
    """The retrieval generators passed S and batch to torch: S=0 raised 'random_ expects 'from' to be less than
    'to'', batch=-1 'Trying to create tensor with negative dimension', a float a TypeError from torch.rand."""
    from fwbench.tasks.retrieval import generate_sequences, sample_batch

    generator = torch.Generator().manual_seed(0)
    for setting in 1, 2:
        for draw in sample_batch, generate_sequences:
            for S, batch, name in (0, 2, "S"), (-3, 2, "S"), (4.0, 2, "S"), ("4", 2, "S"), (4, -1, "batch"), (4, 2.5, "batch"):
                assert raised(ValueError, draw, setting, S, batch, generator).startswith(f"ValueError: {name}: got "), \
                    (setting, S, batch)
        assert sample_batch(setting, 4, 0, generator)["keys"].shape == (0, 4 * setting)  # an empty batch is taken
    assert raised(ValueError, sample_batch, 1, 4, -1, generator) == \
        "ValueError: batch: got -1; expected an integer >= 0 (sequences; 0 draws an empty batch)"
    return raised(ValueError, sample_batch, 1, 0, 2, generator)


@row("H85")
def _(ctx):
    """generate_mqar passed its sizes to torch (negative dimension, 'cannot sample n_sample <= 0 samples',
    TypeErrors) and filled unscored positions randomly for random_non_queries="no"."""
    from fwbench.tasks.mqar import MQARConfig, MQARTask, generate_mqar

    generator = torch.Generator().manual_seed(0)
    for args, name in (((2, 0, 8, 2), "vocab_size"), ((2, -16, 8, 2), "vocab_size"), ((2, "16", 8, 2), "vocab_size"),
                       ((2, 16, -8, 2), "seq_len"), ((2, 16, 0, 2), "seq_len"), ((2, 16, 8.0, 2), "seq_len"),
                       ((2, 16, 8, 0), "num_kv_pairs"), ((2, 16, 8, 2.0), "num_kv_pairs"), ((2.0, 16, 8, 2), "batch")):
        assert raised(ValueError, generate_mqar, *args, 0.5, generator).startswith(f"ValueError: {name}: got "), args
    for flag in "no", 0, 1.0:
        assert raised(ValueError, generate_mqar, 2, 16, 8, 2, 0.5, generator, flag) == \
            f"ValueError: random_non_queries: got {flag!r}; expected True or False"
    assert raised(ValueError, MQARTask().validate, MQARConfig(random_non_queries="no")).startswith(
        "ValueError: random_non_queries: got 'no'")
    inputs, labels = generate_mqar(0, 16, 8, 2, 0.5, generator)  # an empty batch is taken
    assert inputs.shape == labels.shape == (0, 8)
    return raised(ValueError, generate_mqar, -1, 16, 8, 2, 0.5, generator)


@row("H86")
def _(ctx):
    """Break-it pass AI: generate_mqar drew from a valid-looking distribution for power_a 0 or -1 (only the task's
    validate refused them), raised a TypeError deep in the power law for "0.01" or None, and torch's TypeError for
    a generator that is not one, and 10**400 raised an OverflowError; a Fraction is taken as the number it is."""
    from fwbench.tasks.mqar import generate_mqar
    from fwbench.tasks.retrieval import RetrievalModel, sample_batch

    generator = torch.Generator().manual_seed(0)
    for power_a in (0, -1, "0.01", None, float("nan"), float("inf"), True):
        assert raised(ValueError, generate_mqar, 2, 16, 8, 2, power_a, generator).startswith(
            f"ValueError: power_a: got {power_a!r}; expected a finite number > 0"), power_a
    assert raised(ValueError, generate_mqar, 2, 16, 8, 2, 0.5, "x") == \
        "ValueError: generator: got 'x'; expected a torch.Generator"
    for power_a in (10**400, torch.tensor(0.1)):
        assert raised(ValueError, generate_mqar, 2, 16, 8, 2, power_a, generator).startswith("ValueError: power_a: got ")
    assert generate_mqar(2, 16, 8, 2, fractions.Fraction(1, 10), generator)[0].shape == (2, 8)
    # > 0 exactly but 0.0 as a float: refused as "> 0" with no word on why (break-it pass AK)
    for power_a in (fractions.Fraction(1, 10**400), 10**400):
        assert raised(ValueError, generate_mqar, 2, 16, 8, 2, power_a, generator).endswith(
            "expected a finite number > 0 (p(gap = i) ∝ i^(a−1)); it is not one as a float (0.0 or inf)")
    # sizes given as torch tensors are refused in one line: the callers pass them on to torch as they are (break-it
    # pass AJ: accepted, MQARModel's d_model tensor(16) raised "iteration over a 0-d tensor" from nn.LayerNorm)
    assert raised(ValueError, generate_mqar, torch.tensor(2), 16, 8, 2, 0.5, generator).startswith(
        "ValueError: batch: got tensor(2)")
    assert raised(ValueError, RetrievalModel, "linear", torch.tensor(4), d_key=4).startswith("ValueError: S: got tensor(4)")
    for setting in (torch.tensor(1), torch.tensor(3), torch.tensor(1.0), torch.tensor(True)):
        assert raised(ValueError, sample_batch, setting, 4, 2, generator).startswith("ValueError: setting: got tensor(")
    return raised(ValueError, generate_mqar, 2, 16, 8, 2, 0, generator)


@row("H87")
def _(ctx):
    """Break-it pass AK: check_int accepted a narrow NumPy int but its callers kept it, and it overflowed in their
    arithmetic: RetrievalModel(S=np.uint8(200)) raised OverflowError (2.2 · 200), official_initial_weights built a
    144-row key embedding for S = 200 (200 + 200 wrapped), and generate_mqar's 4 · 64 wrapped to 0, so too many pairs
    passed as a bad power_a. The callers now use the ints check_int returns."""
    import numpy as np

    from fwbench.tasks.mqar import MQARModel, generate_mqar
    from fwbench.tasks.retrieval import RetrievalModel, official_initial_weights, sample_batch

    model = RetrievalModel("linear", S=np.uint8(200), d_key=8)
    assert (type(model.S), model.S, model.embedding_size) == (int, 200, 440)
    weights = official_initial_weights("linear", np.uint8(200), np.uint8(100), 8)
    assert tuple(weights["key_embedding"].shape) == (200, 100) and tuple(weights["W_k"].shape) == (8, 300)
    assert sample_batch(np.int8(1), np.uint8(4), np.int16(3), torch.Generator())["keys"].shape == (3, 4)
    assert MQARModel("linear", np.uint8(20), np.uint8(16)).embedding.weight.shape == (20, 16)
    return raised(ValueError, generate_mqar, 2, 300, np.uint8(200), np.uint8(64), 0.01, torch.Generator())


@row("C115")
def _(ctx):
    ctx.monkeypatch.setenv("RAY_ADDRESS", "")
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()  # refused before the store is made or Ray starts
    return answer


def refused_ray_addresses(ctx, environment: str, expected: str, option: str) -> str:
    """Assert that ``$RAY_ADDRESS=environment`` gets ``expected``; return the answer to ``--ray-address option``,
    both refused before the store is made or Ray starts."""
    ctx.monkeypatch.setenv("RAY_ADDRESS", environment)
    assert cli(ctx, "run", "capacity", "--launcher", "ray", "--results-dir", str(ctx.tmp_path / "r")) == expected
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-address", option, "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer


@row("C116")
def _(ctx):
    return refused_ray_addresses(ctx, " ", "exit 2: fwbench: error: $RAY_ADDRESS: got ' '; expected a Ray cluster address "
                                 "such as auto or HOST:6379 (unset it, or leave it out, to start a local instance; "
                                 "--ray-address overrides it)", " ")


@row("C117")
def _(ctx):
    pytest.importorskip("ray")
    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-address", "not-an-address", "--quiet",
               "--results-dir", str(ctx.tmp_path / "r"))


@row("C189")
def _(ctx):
    """Ray reads a scheme other than ray:// as a client module to import: 'rayy://' raised a RuntimeError traceback
    ("Module: rayy does not exist"); 'http://' (the dashboard's address) a ValueError cut at its first line."""
    return refused_ray_addresses(
        ctx, "http://127.0.0.1:8265", "exit 2: fwbench: error: $RAY_ADDRESS: got 'http://127.0.0.1:8265'; expected "
        "auto, HOST:PORT (a cluster's GCS, as HOST:6379) or ray://HOST:PORT (its Ray client server, as "
        "ray://HOST:10001), not http:// (http:// is the dashboard's or job server's address, not the cluster's)",
        "rayy://host:10001")


@row("C190")
def _(ctx):
    """ray.init's RuntimeError where no cluster answers at a well-formed address ("Failed to connect to GCS", with
    lines of its logs) was a traceback; simulated here, since Ray retries for minutes before raising it."""
    ray = pytest.importorskip("ray")

    def no_cluster_there(**_):
        raise RuntimeError("Failed to connect to GCS.  Last 1 lines of error files:\nE gcs timed out\n.Please check "
                           "/tmp/ray/session_x/logs/gcs_server.out for details. Last connection error: timed out")

    ctx.monkeypatch.setattr(ray, "init", no_cluster_there)
    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ctx.monkeypatch.delenv("PYTHONPATH", raising=False)
    return cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-address", "10.0.0.1:6379", "--quiet",
               "--results-dir", str(ctx.tmp_path / "r"))


@row("C191")
def _(ctx):
    """A GPU is one of Ray's unit resources: a task shares one or holds whole ones; 1.5 was accepted."""
    from fwbench.run.launchers import LaunchOptions, check_ray_resources

    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ctx.monkeypatch.delenv("PYTHONPATH", raising=False)
    # checked first in-process: the old code accepted it, and the command would then have started Ray
    for gpus in (1.5, 2.0001, 100.5):
        assert f"--gpus-per-run: got {gpus:g}; expected a fraction" in raised(
            FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cuda", gpus_per_run=gpus,
                                                             ray_address="10.0.0.1:6379"))
    for gpus in (0.0, 0.5, 1.0, 2.0, 3):  # still accepted (an int too)
        check_ray_resources(LaunchOptions(launcher="ray", device="cuda", gpus_per_run=gpus, ray_address="10.0.0.1:6379"))
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--gpus-per-run", "1.5", "--results-dir",
                 str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer


@row("C207")
def _(ctx):
    """Numbers the Ray checks refuse were written with :g, six digits: a refused 2.0000000001 GPUs read "got 2",
    which the same check accepts; likewise a request just above the local instance's CPUs ("got 1; expected at
    most 1") and one just below Ray's unit."""
    from fwbench.run.launchers import LaunchOptions, check_fits_local_ray, check_ray_resources

    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ctx.monkeypatch.delenv("PYTHONPATH", raising=False)
    assert "--cpus-per-run: got 1.0000001; expected at most 1," in raised(
        FwbenchError, check_fits_local_ray, LaunchOptions(launcher="ray", cpus_per_run=1.0000001), {"CPU": 1.0})
    assert "--cpus-per-run: got 9.99999999e-05; expected a number in [0.0001," in raised(
        FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cpu", cpus_per_run=9.99999999e-05))
    for gpus, shown in ((1.5, "1.5"), (2.0000000001, "2.0000000001")):  # the short form where it is the number
        assert f"--gpus-per-run: got {shown}; expected a fraction" in raised(
            FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cuda", gpus_per_run=gpus,
                                                             ray_address="10.0.0.1:6379"))
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--gpus-per-run", "2.0000000001", "--results-dir",
                 str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer


@row("C217")
def _(ctx):
    """The numbers of the Ray resource messages were written with :g (the bound a local instance holds) or repr (the
    request, where :g was not the same number): an instance of 1234567 CPUs read "expected at most 1.23457e+06", a
    bound above the refused request, which read "got 1234568.0"; 5e-324 read "got 4.94066e-324"."""
    from fwbench.run.launchers import LaunchOptions, check_fits_local_ray, check_ray_resources

    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ctx.monkeypatch.delenv("PYTHONPATH", raising=False)
    assert "--gpus-per-run: got 3; expected at most 2.5, the GPUs" in raised(
        FwbenchError, check_fits_local_ray, LaunchOptions(launcher="ray", gpus_per_run=3.0), {"GPU": 2.5})
    assert "--cpus-per-run: got 100000; expected at most 2, the CPUs" in raised(  # :g's form where it is as short
        FwbenchError, check_fits_local_ray, LaunchOptions(launcher="ray", cpus_per_run=1e5), {"CPU": 2})
    for cpus, shown in ((5e-324, "5e-324"), (1e-300, "1e-300"), (1e16, "1e+16")):
        assert f"--cpus-per-run: got {shown}; expected a number in [0.0001," in raised(
            FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cpu", cpus_per_run=cpus))
    for gpus, shown in ((123456789.123, "123456789.123"), (1.0000000000000002, "1.0000000000000002")):
        assert f"--gpus-per-run: got {shown}; expected a fraction" in raised(
            FwbenchError, check_ray_resources, LaunchOptions(launcher="ray", device="cuda", gpus_per_run=gpus,
                                                             ray_address="10.0.0.1:6379"))
    answer = cli(ctx, "run", "capacity", "--launcher", "ray", "--ray-num-cpus", "1234567", "--cpus-per-run", "1234568",
                 "--results-dir", str(ctx.tmp_path / "r"))
    assert not (ctx.tmp_path / "r").exists()
    return answer


@row("C118")
def _(ctx):
    ctx.monkeypatch.setenv("FWBENCH_DATA_DIR", "~nosuchuser-fwbench/data")
    assert cli(ctx, "run", "shakespeare", "--quiet", "--results-dir", str(ctx.tmp_path / "r")) == (
        "exit 2: fwbench: error: $FWBENCH_DATA_DIR: got '~nosuchuser-fwbench/data'; expected a directory path "
        "('~nosuchuser-fwbench' names no user's home directory on this machine)")
    ctx.monkeypatch.setenv("FWBENCH_DATA_DIR", str(ctx.tmp_path))
    ctx.monkeypatch.setenv("FWBENCH_CACHE_DIR", "~nosuchuser-fwbench/cache")
    ctx.monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return cli(ctx, "run", "shakespeare", "--launcher", "ray", "--quiet", "--results-dir", str(ctx.tmp_path / "r"))


@row("C119")
def _(ctx):
    return refused_ray_addresses(ctx, "localhost:0", "exit 2: fwbench: error: $RAY_ADDRESS: got 'localhost:0'; expected "
                                 "a Ray cluster address such as auto or HOST:6379 (port 0 is outside 1 to 65535)",
                                 "localhost:99999")


LM_GRID = 'name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'


@row("G83")
def _(ctx):
    return grid_error(ctx, MQAR_GRID + "power_a = 1e300\n")


@row("G84")
def _(ctx):
    return grid_error(ctx, LM_GRID + "train_segments = 1\ntruncated_bptt = [true, false]\n")


@row("G96")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace('variant = "linear"\nS = 3', 'variant = "linear-delta"\nsetting = 2\n'
                                             'S = 60\nchunk_size = [60, 64]'))


@row("G85")
def _(ctx):
    return grid_error(ctx, MQAR_GRID.replace("vocab_size = 16", "vocab_size = 9223372036854775807"))


@row("G86")
def _(ctx):
    return grid_error(ctx, LM_GRID + "sample_tokens = 0\ntemperature = [0.5, 1.0]\n")


@row("G87")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace("eval_every = 2", "eval_every = [3, 100]"))


@row("G88")
def _(ctx):
    assert grid_error(ctx, TINY_GRID.replace('variant = "linear"', 'variant = "dpfp:nu=6"').replace(
        "d_key = 4", "d_key = 3")).startswith(
        "FwbenchError: grid one profile quick: variant dpfp:nu=6 at d_key 3: nu: got 6; expected an integer in [1, 5]")
    return grid_error(ctx, TINY_GRID.replace('variant = "linear"', 'variant = "favor:m=65537"'))


@row("G89")
def _(ctx):
    return grid_error(ctx, MQAR_GRID.replace('variant = "linear"', 'variant = "softmax"\nform = ["auto", "parallel"]'))


@row("G91")
def _(ctx):
    return grid_error(ctx, LM_GRID_HEAD + "dropout = [0.0, -0.0]\n")


@row("G92")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace("S = 3", "S = 20\nembedding_factor = [2.2, 2.21]"))


@row("G93")
def _(ctx):
    return grid_error(ctx, MQAR_GRID.replace('variant = "linear"', 'variant = ["softmax", "softmax:window=8"]'))


@row("G94")
def _(ctx):
    return grid_error(ctx, LM_GRID_HEAD + "checkpoint_every = [0, 125]\n")


@row("G131")
def _(ctx):
    return grid_error(ctx, MQAR_GRID.replace("seq_len = 8\nnum_kv_pairs = 2", "seq_len = 4\nnum_kv_pairs = 1")
                      + "power_a = [0.01, 0.5]\n")


@row("G132")
def _(ctx):
    return grid_error(ctx, MQAR_GRID.replace("seq_len = 8", "seq_len = 16") + "power_a = [0.01, 0.010000001]\n")


@row("G95")
def _(ctx):
    return grid_error(ctx, LM_GRID_HEAD + "eval_segments = [0, 100000]\n")

@row("G97")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace('variant = "linear"', 'variant = ["softmax", "softmax:window=3"]\nform = "chunk"'))


@row("G98")
def _(ctx):
    blocks = "".join(f'[[profiles.quick]]\nvariant = "{variant}"\ncheckpoint_every = {every}\nseed = 1\n'
                     for variant, every in (("softmax", 2), ("softmax:window=16", 4)))
    return grid_error(ctx, f'name = "lm"\ntask = "shakespeare"\n[defaults]\ncontext = 16\n{blocks}')

@row("G99")
def _(ctx):
    return grid_error(ctx, LM_GRID_HEAD + "train_fraction = [0.9, 0.9000001]\n")

@row("G100")
def _(ctx):
    return grid_error(ctx, LM_GRID_HEAD.replace("context = 64", "context = 32") + "chunk_size = [32, 64]\n")

@row("G101")
def _(ctx):
    blocks = "".join(f'[[profiles.quick]]\nvariant = "linear"\nseed = 1\nchunk_size = {size}\ncheckpoint_every = {every}\n'
                     for size, every in ((32, 0), (64, 100)))
    return grid_error(ctx, f'name = "lm"\ntask = "shakespeare"\n[defaults]\ncontext = 32\n{blocks}')


@row("G102")
def _(ctx):
    return grid_error(ctx, TINY_GRID + "patience = [1, 10]\n")


@row("G103")
def _(ctx):
    return grid_error(ctx, LM_GRID + 'sample_tokens = 0\nprompt = ["It is", "To be"]\n')


@row("G104")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace('variant = "linear"', 'variant = "linear-fwm"\nform = ["auto", "recurrent"]'))


@row("G105")
def _(ctx):
    return grid_error(ctx, LM_GRID.replace("seed = 1\n", "seed = 1\ncontext = 16\n") + "chunk_size = [6, 7]\n")


@row("G130")
def _(ctx):
    return grid_error(ctx, LM_GRID + "context = 64\nstream_eval = false\nstream_characters = 100\nsliding_stride = [36, 64]\n")


@row("G106")
def _(ctx):
    return grid_error(ctx, TINY_GRID.replace('variant = "linear"', 'variant = "linear"\nform = ["chunk", "parallel"]'))


@row("G107")
def _(ctx):
    return grid_error(ctx, LM_GRID.replace('"linear"', '"softmax"') + "train_segments = 2\ntruncated_bptt = [false, true]\n")


@row("G116")
def _(ctx):
    text = LM_GRID.replace("seed = 1\n", 'seed = 1\ncontext = 16\nprompt = "It is a"\n') + "chunk_size = [6, 7]\n"
    assert load_grid(grid_file(ctx, text))  # 5 characters are sampled: 6 and 7 cut the 7-character prompt apart
    return grid_error(ctx, text + "sample_tokens = 0\n")


@row("H88")
def _(ctx):
    """Break-it pass AK: sizes above torch's largest (2**63 − 1) passed check_int and raised torch's TypeError
    ("Overflow when unpacking long long") or an OverflowError from the generators and task models."""
    from fwbench.tasks.mqar import MQARModel, generate_mqar
    from fwbench.tasks.retrieval import RetrievalModel, sample_batch

    huge = 10**20
    for call, name in ((lambda: generate_mqar(huge, 16, 8, 2, 0.01, torch.Generator()), "batch"),
                       (lambda: generate_mqar(2, 16, huge, 2, 0.01, torch.Generator()), "seq_len"),
                       (lambda: MQARModel("linear", huge, 8), "vocab_size"),
                       (lambda: RetrievalModel("linear", S=4, d_key=huge), "d_key"),
                       (lambda: sample_batch(1, huge, 2, torch.Generator()), "S")):
        assert raised(ValueError, call) == (f"ValueError: {name}: got {huge}; expected at most 9223372036854775807 "
                                            "(2**63 - 1, the largest size a torch tensor has)")
    return raised(ValueError, generate_mqar, 2, huge, 8, 2, 0.01, torch.Generator())


@row("L125")
def _(ctx):
    """Layer and attention sizes above 2**63 − 1 passed positive_int and raised torch's TypeError from
    nn.Linear; one of over 4300 digits is named by its length (its repr raises a ValueError of its own)."""
    expected = "expected at most 9223372036854775807 (2**63 - 1, the largest size a torch tensor has)"
    for call, name in ((lambda: variants.AttentionLayer("linear", 10**20, 1), "d_model"),
                       (lambda: variants.AttentionLayer("linear", 16, 10**20), "n_heads"),
                       (lambda: variants.AttentionLayer("linear", 16, 1, d_key=10**20), "d_key"),
                       (lambda: variants.build_attention("linear", d_key=16, chunk_size=2**63), "chunk_size")):
        message = raised(VariantError, call)
        assert message.startswith(f"VariantError: {name}: got ") and message.endswith(expected), message
    assert raised(VariantError, variants.AttentionLayer, "linear", 10**5000, 1) == (
        f"VariantError: d_model: got an integer of 5001 digits; {expected}")
    return raised(VariantError, variants.AttentionLayer, "linear", 10**20, 1)


@row("H89")
def _(ctx):
    """MQARModel(n_layers=10**30) (and a DecoderConfig's) built layers one by one until memory ran out, for hours."""
    from fwbench.tasks.lm_model import DecoderConfig
    from fwbench.tasks.mqar import MQARModel

    assert raised(VariantError, DecoderConfig, vocab_size=5, n_layers=10**30) == (
        "VariantError: n_layers: got 1000000000000000000000000000000; expected at most 4096 "
        "(a model's layers are built one by one)")
    assert raised(VariantError, DecoderConfig, vocab_size=5, n_layers=4097).endswith("expected at most 4096 "
                                                                                       "(a model's layers are built one by one)")
    assert DecoderConfig(vocab_size=5, n_layers=4096).n_layers == 4096
    import numpy as np  # a NumPy int is an integer too: it was refused as "expected a positive integer (>= 1)"
    config = DecoderConfig(vocab_size=np.int64(5), n_layers=np.int64(2))
    assert (type(config.n_layers), config.n_layers, type(config.vocab_size)) == (int, 2, int)
    return raised(ValueError, MQARModel, "linear", 16, 8, n_layers=10**30)


@row("G133")
def _(ctx):
    """A grid's n_layers above the models' limit passed the loader and failed (or ran for hours) in every worker."""
    assert grid_error(ctx, LM_GRID + "n_layers = 5000\n").endswith(
        "n_layers: got 5000; expected at most 4096 (a model's layers are built one by one)")
    return grid_error(ctx, MQAR_GRID + "n_layers = 100000\n")


@row("H90")
def _(ctx):
    """A RunSpec built in Python with a config key its task does not have: run_grid raised the dataclass's bare
    TypeError ("RetrievalConfig.__init__() got an unexpected keyword argument 'nokey'") while hashing the run id."""
    spec = RunSpec(grid="g", task="retrieval", variant="linear", seed=1, config={"S": 4, "nokey": 1})
    store = ResultsStore(ctx.tmp_path / "r")
    answer = raised(FwbenchError, run_grid, [spec], store, quiet=True)
    runs = ctx.tmp_path / "r" / "runs.jsonl"
    assert not runs.exists() or not runs.read_text().strip()  # refused before any record
    unknown_task = RunSpec(grid="g", task="nosuchtask", variant="linear", seed=1, config={})
    assert raised(FwbenchError, unknown_task.task_config) == (  # a bare KeyError before
        "FwbenchError: task: got 'nosuchtask'; expected one of mqar, retrieval, shakespeare")
    return answer


@row("H91")
def _(ctx):
    """A RunSpec built in Python skips the grid loader's type check, and validate compared only ranges: S=True
    trained as S = 1 would not (True >= 1), max_steps=2.0 trained, and LM eval_segments=True or 64.0 passed."""
    store = ResultsStore(ctx.tmp_path / "r")
    for task, config, name in (("shakespeare", {"eval_segments": True}, "eval_segments"),
                               ("shakespeare", {"eval_segments": 64.0}, "eval_segments"),
                               ("mqar", {"n_layers": 2.0}, "n_layers"), ("retrieval", {"S": True}, "S")):
        spec = RunSpec(grid="g", task=task, variant="linear", seed=1, config=config)
        assert f"{task} config: {name}: got {config[name]!r} ({type(config[name]).__name__}); expected int" == raised(
            FwbenchError, run_grid, [spec], store, quiet=True).removeprefix("FwbenchError: "), (task, config)
    spec = RunSpec(grid="g", task="retrieval", variant="linear", seed=1, config={"S": 4, "max_steps": 2.0})
    return raised(FwbenchError, run_grid, [spec], store, quiet=True)


@row("L126")
def _(ctx):
    """Break-it pass AL: a message about an integer of over 4300 digits raised Python's own ValueError ('Exceeds the
    limit (4300 digits) for integer string conversion') while it was built, naming no argument: a negative size of
    any such length (only too large ones were shown by their length). Integers of over 40 digits are now named by
    their digit count (exact: 10**41 - 1 has 41)."""
    for call, name in ((lambda: variants.AttentionLayer("linear", 8, 2, chunk_size=-10**5000), "chunk_size"),
                       (lambda: DecoderConfig(vocab_size=-10**5000), "vocab_size")):
        assert raised(VariantError, call) == (f"VariantError: {name}: got a negative integer of 5001 digits; "
                                              "expected a positive integer (>= 1)")
    assert raised(VariantError, variants.AttentionLayer, "linear", 10**41 - 1, 1).startswith(
        "VariantError: d_model: got an integer of 41 digits; expected at most")
    return raised(VariantError, variants.AttentionLayer, "linear", -10**5000, 2)


@row("H92")
def _(ctx):
    """Break-it pass AL: task messages about integers of over 4300 digits raised Python's own ValueError while they
    were built (check_int, sample_batch's setting, generate_mqar's power_a), and power_a of 400 digits filled the line."""
    from fwbench.tasks.base import check_int
    from fwbench.tasks.mqar import generate_mqar
    from fwbench.tasks.retrieval import sample_batch

    generator = torch.Generator()
    assert raised(ValueError, sample_batch, 10**5000, 4, 2, generator) == (
        "ValueError: setting: got an integer of 5001 digits; expected 1 (capacity) or 2 (overwriting)")
    for power_a, shown in ((10**5000, "an integer of 5001 digits"), (-10**5000, "a negative integer of 5001 digits"),
                           (fractions.Fraction(1, 10**5000), "Fraction(1, an integer of 5001 digits)")):
        assert raised(ValueError, generate_mqar, 2, 64, 16, 2, power_a, generator).startswith(
            f"ValueError: power_a: got {shown}; expected a finite number > 0"), power_a
    return raised(ValueError, check_int, "S", -10**5000)


@row("G134")
def _(ctx):
    """Break-it pass AL: a grid holding an integer of over 4300 digits (tomllib's int() refuses it) ended in a
    traceback; so did one inside a variant spec (parse_spec's int()), and a softmax window above 2**63 - 1 passed the
    loader and failed every run."""
    digits = "9" * 5000
    assert grid_error(ctx, TINY_GRID.replace('variant = "linear"', f'variant = "softmax:window={digits}"')).endswith(
        "softmax:window: got an integer of 5000 digits; expected at most 9223372036854775807 (2**63 - 1, the largest "
        "size a torch tensor has)")
    assert grid_error(ctx, TINY_GRID.replace('variant = "linear"', 'variant = "softmax:window=9223372036854775808"')
                      ).endswith("softmax:window: got 9223372036854775808; expected at most 9223372036854775807 "
                                 "(2**63 - 1, the largest size a torch tensor has)")
    return grid_error(ctx, TINY_GRID.replace("S = 3", f"S = {digits}"))


@row("L127")
def _(ctx):
    """Break-it pass AL: each size in range, but n_heads · d_key (or d_value) above 2**63 - 1 raised torch's TypeError
    ('Overflow when unpacking long long') from nn.Linear, and a product in range but past 2**63 - 1 bytes its
    'Storage size calculation overflowed with sizes=[…]', naming no argument."""
    assert raised(VariantError, variants.AttentionLayer, "linear", 8, 2, d_value=2**63 - 1).startswith(
        "VariantError: d_model, n_heads, d_value: got 8, 2, 9223372036854775807; expected sizes whose")
    assert raised(VariantError, variants.AttentionLayer, "linear", 2**40, 2**20).startswith(
        "VariantError: d_model, n_heads, d_key: got 1099511627776, 1048576, 1048576; expected sizes whose")
    assert variants.AttentionLayer("linear", 16, 2, d_key=2**20).q_proj.weight.shape == (2**21, 16)  # 256 MiB: built
    return raised(VariantError, variants.AttentionLayer, "linear", 8, 2**62, d_key=4)


@row("H93")
def _(ctx):
    """Break-it pass AL: task sizes each in range whose tensors no storage holds raised torch's 'Storage size
    calculation overflowed with sizes=[…]' (a RuntimeError naming no argument); RetrievalModel(S=2**62) named an
    embedding_size the user never gave (2.2 · S)."""
    from fwbench.tasks.mqar import MQARModel, generate_mqar
    from fwbench.tasks.retrieval import RetrievalModel, sample_batch

    generator = torch.Generator()
    for call, names in ((lambda: MQARModel("linear", 2**62, 8, n_heads=2, n_layers=1), "vocab_size, d_model"),
                        (lambda: RetrievalModel("linear", 2**62, d_key=4), "S"),
                        (lambda: RetrievalModel("linear", 4, d_key=4, embedding_size=2**62), "S, embedding_size"),
                        (lambda: sample_batch(1, 4, 2**62, generator), "batch, S"),
                        (lambda: generate_mqar(2, 64, 2**63 - 2, 4, 0.01, generator), "batch, seq_len")):
        assert raised(ValueError, call).startswith(f"ValueError: {names}: got "), names
    assert raised(VariantError, DecoderConfig, vocab_size=65, d_model=2**62, n_heads=2**62).startswith(
        "VariantError: vocab_size, d_model: got 65, 4611686018427387904; expected sizes whose (vocab_size, d_model) "
        "weight (65 × 4611686018427387904 elements) fits in 2**63 - 1 bytes")
    return raised(ValueError, sample_batch, 1, 2**62, 2, generator)


@row("H94")
def _(ctx):
    """Break-it pass AL: generate(n_tokens=2**62) (and `fwbench sample --tokens 2**62`) sampled until killed: no
    tensor could hold the (B, n_tokens) ids it returns."""
    import fwbench.tasks.lm_model as lm_model

    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=1, d_ff=8))
    assert model.generate(torch.tensor([[1]]), 3, 0)[0].shape == (1, 3)

    def no_sampling(*args, **kwargs):  # the old code sampled for ever: fail at its first token instead of hanging
        raise AssertionError("generate sampled a token of a length no tensor holds")

    ctx.monkeypatch.setattr(lm_model, "sample_next", no_sampling)
    return raised(VariantError, model.generate, torch.tensor([[1]]), 2**62)


@row("C282")
def _(ctx):
    """Break-it pass AL: an in-range --steps of 2**63 - 2 was refused as 'retrieval config: max_steps: got 2**63',
    naming a setting the user never gave (max_steps is --steps + 2)."""
    return cli(ctx, "estimate", "capacity", "--profile", "quick", "--steps", str(2**63 - 2))


@row("C283")
def _(ctx):
    """Break-it pass AL: a checkpoint whose config holds a key this version's config lacks raised the dataclass's
    TypeError ('ShakespeareConfig.__init__() got an unexpected keyword argument') from `fwbench sample`."""
    from fwbench.run.checkpoint import save_checkpoint

    config = {**asdict(ShakespeareConfig()), "old_key": 1}
    save_checkpoint(ctx.tmp_path / "run.pt", {"task": "shakespeare", "variant": "linear", "seed": 1, "config": config,
                                              "model": {}, "loop": {"step": 1, "finished": True}})
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "run.pt"), "--tokens", "2")


@row("H95")
def _(ctx):
    """Break-it pass AM: a (context, d_model) position embedding is only built with positional = "learned"; the
    storage check of 0ba325c refused a context of 10**17 without it, naming a tensor that was never built."""
    assert DecoderConfig(vocab_size=65, d_model=128, n_heads=4, context=10**17).context == 10**17
    return raised(VariantError, DecoderConfig, vocab_size=65, d_model=128, n_heads=4, context=10**17,
                  positional="learned")


@row("H96")
def _(ctx):
    """Break-it pass AM: with an empty batch the storage check counted 0 bytes, so sample_batch(1, 2**62, 0) raised
    torch's 'Storage size calculation overflowed', generate_mqar(0, …, 2**62, …) likewise, and generate() of 2**62
    tokens for B = 0 sampled until killed; RetrievalModel(2**31, embedding_size=1) overflowed in its (S, S) codes."""
    import fwbench.tasks.lm_model as lm_model
    from fwbench.tasks.mqar import generate_mqar
    from fwbench.tasks.retrieval import RetrievalModel, sample_batch

    generator = torch.Generator()
    assert raised(ValueError, generate_mqar, 0, 512, 2**62, 1, 0.01, generator).startswith(
        "ValueError: batch, seq_len: got 0, 4611686018427387904; expected sizes whose")
    assert raised(ValueError, RetrievalModel, "linear", 2**31, embedding_size=1).startswith(
        "ValueError: S: got 2147483648; expected sizes whose (S, S) value codes")
    assert sample_batch(1, 4, 0, generator)["keys"].shape == (0, 4)  # an empty batch of sane sizes is drawn

    def no_sampling(*args, **kwargs):
        raise AssertionError("generate sampled a token of a length no tensor holds")

    ctx.monkeypatch.setattr(lm_model, "sample_next", no_sampling)
    model = DecoderLM("linear", DecoderConfig(vocab_size=5, d_model=4, n_heads=1, n_layers=1, d_ff=8))
    assert raised(VariantError, model.generate, torch.zeros(0, 3, dtype=torch.long), 2**62).startswith(
        "VariantError: n_tokens: got 4611686018427387904; expected sizes whose")
    return raised(ValueError, sample_batch, 1, 2**62, 0, generator)


@row("H97")
def _(ctx):
    """Break-it pass AM: a RunSpec built in Python with a value of the wrong type crashed in the run id before
    validate's one-line check (S='4': "can't multiply sequence by non-int"; MQAR seq_len='64'; LM context=16.0;
    a NumPy int, which json.dumps refuses; LM eval_segments=None; retrieval setting=1.0 and patience=None ran and
    failed), and an MQAR seq_len of 2**62 raised torch's RuntimeError from the run id's gap distribution. The
    grid loader's type check and validate now run first."""
    import numpy as np

    store = ResultsStore(ctx.tmp_path / "r")
    for task, config, answer in (
            ("mqar", {"seq_len": "64"}, "seq_len: got '64' (str); expected int"),
            ("shakespeare", {"context": 16.0}, "context: got 16.0 (float); expected int"),
            ("retrieval", {"S": np.int64(4)}, "S: got np.int64(4) (int64); expected int"),
            ("shakespeare", {"eval_segments": None}, "eval_segments: got None (NoneType); expected int"),
            ("retrieval", {"setting": 1.0}, "setting: got 1.0 (float); expected int"),
            ("retrieval", {"patience": None}, "patience: got None (NoneType); expected int"),
            ("mqar", {"seq_len": 2**62}, "batch_size, seq_len: got 64, 4611686018427387904; expected sizes whose"),
            # break-it pass AO: an int factor, checked and no longer converted, overflowed float() (OverflowError)
            ("retrieval", {"S": 4, "embedding_factor": 10**308},
             "embedding_factor: got an integer of 309 digits with S=4; expected a finite key embedding size")):
        spec = RunSpec(grid="g", task=task, variant="linear", seed=1, config=config)
        assert raised(FwbenchError, run_grid, [spec], store, quiet=True).startswith(
            f"FwbenchError: {task} config: {answer}"), (task, config)
    assert RunSpec(grid="g", task="retrieval", variant="linear", seed=1, config={"S": 4, "chunk_size": None}).run_id
    spec = RunSpec(grid="g", task="retrieval", variant="linear", seed=1, config={"S": "4"})
    return raised(FwbenchError, run_grid, [spec], store, quiet=True)


@row("G135")
def _(ctx):
    """Break-it pass AM: grid sizes whose tensors no storage holds passed the loader and failed every run, and
    the messages named what the user never set: retrieval S = 2**62 as 'embedding_size: got 10145709240540254208'
    (build_model's int(embedding_factor · S)), an MQAR seq_len as 'batch, seq_len: got 1, …' (validate's trial
    draw of one sequence); a Shakespeare d_ff = 2**62 passed the loader."""
    assert grid_error(ctx, MQAR_GRID.replace("seq_len = 8", f"seq_len = {2**62}")).startswith(
        "FwbenchError: grid m profile quick: batch_size, seq_len: got 64, 4611686018427387904; expected sizes whose")
    assert "d_ff, d_model: got 4611686018427387904, " in grid_error(ctx, LM_GRID + f"d_ff = {2**62}\n")
    return grid_error(ctx, TINY_GRID.replace("S = 3", f"S = {2**40}"))


@row("C284")
def _(ctx):
    """Break-it pass AM: `fwbench sample --tokens 2**62` was refused as 'n_tokens: got …', an argument the command
    does not have (only negative counts were named --tokens)."""
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "run.pt"), "--tokens", str(2**62))


@row("C285")
def _(ctx):
    """Break-it pass AM: `fwbench variants --d-key 2**63` printed the table's header, then refused 'd_key'."""
    answer = cli(ctx, "variants", "--d-key", str(2**63))
    assert "d_dot" not in ctx.capsys.readouterr().out
    return answer


@row("G136")
def _(ctx):
    """Break-it pass AN: eval_sequences = 2**62 passed the loader, trained, then failed naming 'batch' (a key no grid
    sets); a Shakespeare sample_tokens = 2**62 failed at the run's end, after training."""
    assert "sample_tokens: got 4611686018427387904; expected at most 1000000 (one model step" in grid_error(
        ctx, LM_GRID + f"sample_tokens = {2**62}\n")
    assert "eval_sequences, seq_len: got 4611686018427387904, 8; expected sizes whose" in grid_error(
        ctx, MQAR_GRID + f"eval_sequences = {2**62}\n")
    return grid_error(ctx, TINY_GRID.replace("eval_sequences = 2", f"eval_sequences = {2**62}"))


@row("G137")
def _(ctx):
    """Break-it pass AN: an integer past float's range in a float key (lr = 1 and 400 zeros) raised a bare
    OverflowError from the grid loader's int-to-float conversion."""
    return grid_error(ctx, TINY_GRID.replace("max_steps = 2", f"max_steps = 2\nlr = {10**400}"))


@row("G138")
def _(ctx):
    """Break-it pass AQ: seeds 1 and 2**32 + 1 were two run ids with bit-identical curves (torch's generator
    reads only a seed's low 32 bits), counted by the statistics as two independent seeds; also by --seeds."""
    assert cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--seeds", str(2**31), "--results-dir",
               str(ctx.tmp_path)).endswith("seed: got 2147483648; expected a non-negative integer below 2**31")
    return grid_error(ctx, GRID_HEAD + f'variant = "linear"\nseed = [1, {2**32 + 1}]\n')


@row("C286")
def _(ctx):
    """Break-it pass AQ: `fwbench sample --seed 4294967297` sampled what --seed 1 samples."""
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "run.pt"), "--seed", str(2**32 + 1))


@row("H98")
def _(ctx):
    """Break-it pass AQ: a RunSpec built in Python with seed 2**32 + 1 trained seed 1's run under another id."""
    spec = RunSpec(grid="g", task="retrieval", variant="linear", seed=2**32 + 1, config={"S": 4})
    return raised(FwbenchError, run_grid, [spec], ResultsStore(ctx.tmp_path / "r"), quiet=True)


@row("G139")
def _(ctx):
    """Break-it pass AQ: sample_tokens = 2**60 - 1 (below the storage bound) passed the loader, trained, then
    sampled until killed, with no record written."""
    return grid_error(ctx, LM_GRID + f"sample_tokens = {2**60 - 1}\n")


@row("C287")
def _(ctx):
    """Break-it pass AQ: `fwbench sample --tokens 2**60 - 1` printed nothing and sampled until killed."""
    return cli(ctx, "sample", "--checkpoint", str(ctx.tmp_path / "run.pt"), "--tokens", str(2**60 - 1))


def fake_corpus_task(ctx: Context) -> None:
    """The grid loader's Shakespeare task reading a 4,100-character corpus in ``ctx.tmp_path`` (its own checksum)."""
    from fwbench.tasks import TASKS

    text = "".join(f"It is line {i % 7}: the quick brown fox jumps.\n" for i in range(100))
    (ctx.tmp_path / "input.txt").write_text(text)
    task = ShakespeareTask(data_dir=ctx.tmp_path, sha256=hashlib.sha256(text.encode()).hexdigest())
    ctx.monkeypatch.setitem(TASKS, "shakespeare", task)


@row("G140")
def _(ctx):
    """Break-it pass AQ: a prompt character outside the corpus's vocabulary passed the grid loader; the local
    launcher trained the grid's earlier runs, then stopped it naming `text` (no grid, profile or block), and
    `--jobs 2` recorded a failed run and exited 0. Refused where the grid loads (the corpus being here)."""
    fake_corpus_task(ctx)
    return grid_error(ctx, LM_GRID + 'context = 8\nprompt = "Z€"\n')


@row("G141")
def _(ctx):
    """Break-it pass AQ: a train_fraction leaving no training window (1e-300, 0.001) passed the grid loader and stopped
    the grid mid-way naming `context × train_segments`; one leaving no validation window likewise."""
    fake_corpus_task(ctx)
    assert grid_error(ctx, LM_GRID + "context = 8\ntrain_fraction = 0.9999\n").endswith(
        "which leaves 1 validation characters; expected at least context + 1 = 9")
    return grid_error(ctx, LM_GRID + "context = 8\ntrain_fraction = 0.001\n")


@row("G142")
def _(ctx):
    """Break-it pass AQ: float settings below float32's smallest normal number passed and acted as 0 (training runs
    in float32 with denormals flushed): grad_clip = 1e-320 trained exactly as grad_clip = 0 (no clipping), lr =
    1e-50 and 1e-300 trained nothing under two run ids, MQAR power_a = 5e-324 failed every run as 'got 0.0'."""
    assert grid_error(ctx, TINY_GRID.replace("max_steps = 2", "max_steps = 2\nlr = [1e-50, 1e-300]")).startswith(
        "FwbenchError: grid one profile quick: lr: got 1e-50; expected a magnitude of at least 1.1754943508222875e-38")
    # break-it pass AS: float64 keys (MQAR's power law) act down to float64's smallest normal; a subnormal is refused
    assert "power_a: got 5e-324; expected a magnitude of at least 2.2250738585072014e-308" in grid_error(
        ctx, MQAR_GRID + "power_a = 5e-324\n")
    assert [spec.config["power_a"] for spec in expand(load_grid(grid_file(ctx, MQAR_GRID + "power_a = 1e-39\n")),
                                                      "quick")] == [1e-39]
    spec = RunSpec(grid="g", task="retrieval", variant="linear", seed=1, config={"S": 4, "lr": 1e-45})
    assert "lr: got 1e-45; expected a magnitude" in raised(
        FwbenchError, run_grid, [spec], ResultsStore(ctx.tmp_path / "r"), quiet=True)
    # break-it pass AR: a tiny temperature acts (sampling divides in float64: greedy), as the command's does
    assert [spec.config["temperature"] for spec in expand(load_grid(grid_file(ctx, LM_GRID + "temperature = 1e-39\n")),
                                                           "quick")] == [1e-39]
    # break-it pass AT: AS's zero test read 2.848094538889218e-306 (a normal float64) and six subnormals as 0
    for value in (2.848094538889218e-306, 6.3e-322, 6.953355807835e-310):
        assert f"grad_clip: got {value!r}; expected a magnitude of at least" in grid_error(
            ctx, LM_GRID + f"grad_clip = {value!r}\n")
    assert [spec.config["power_a"] for spec in expand(load_grid(grid_file(
        ctx, MQAR_GRID + "power_a = 2.848094538889218e-306\n")), "quick")] == [2.848094538889218e-306]
    # break-it pass AS: in a process flushing denormals, Python's comparisons read 1e-320 as 0, and it passed
    from fwbench.variants.kernels.precision import denormals_are_flushed

    was_on = denormals_are_flushed()
    if torch.set_flush_denormal(True):
        try:
            flushed = RunSpec(grid="g", task="shakespeare", variant="linear", seed=1, config={"grad_clip": 1e-320})
            with pytest.raises(FwbenchError, match="grad_clip: got .*; expected a magnitude of at least"):
                flushed.run_id  # noqa: B018
        finally:
            torch.set_flush_denormal(was_on)
    return grid_error(ctx, LM_GRID + "grad_clip = [0.0, 1e-320]\n")


@row("C288")
def _(ctx):
    """Break-it pass AQ: `fwbench bench --variants linear linear` (or `--lengths 8 16 16`) measured every case,
    appended them, then failed on a pandas traceback in the summary; `--lengths 4 4` measured its cases twice."""
    assert cli(ctx, "bench", "--no-extras", "--quiet", "--variants", "linear", "--lengths", "8", "16", "16",
               "--results-dir", str(ctx.tmp_path / "b")).endswith("--lengths: lists 16 twice; list each value once")
    assert not (ctx.tmp_path / "b").exists()
    return cli(ctx, "bench", "--no-extras", "--quiet", "--variants", "linear", "dpfp", "dpfp:nu=1",
               "--results-dir", str(ctx.tmp_path / "b"))


@row("G143")
def _(ctx):
    """Break-it pass AQ: MQAR d_model = 2**63 - 1 passed the grid loader (validate had no storage check; the model's
    constructor had), and every run failed; d_model = 2**32 failed every run on torch's allocator."""
    assert grid_error(ctx, MQAR_GRID.replace("d_model = 8", f"d_model = {2**32}")).endswith(
        "d_model: got 4294967296; expected sizes whose (d_model, d_model) attention projection (4294967296 × "
        "4294967296 elements) fits in 2**63 - 1 bytes (torch's largest tensor, at 8 bytes per element)")
    return grid_error(ctx, MQAR_GRID.replace("d_model = 8", f"d_model = {2**63 - 1}"))


@row("L128")
def _(ctx):
    """Break-it pass AQ: DecoderLM's vocabulary = 3 (an int) raised a bare TypeError ('object of type 'int' has no
    len()'), and "aab" (a repeated symbol: two ids decoding as one character) was accepted."""
    from fwbench.tasks.lm_model import DecoderConfig, DecoderLM

    config = DecoderConfig(vocab_size=3, d_model=8, n_heads=2)
    assert raised(VariantError, DecoderLM, "linear", config, vocabulary=3) == (
        "VariantError: vocabulary: got 3; expected None or a string of the 3 symbols (vocab_size), in id order")
    assert DecoderLM("linear", config, vocabulary="abc").vocabulary_codes.tolist() == [97, 98, 99]
    return raised(VariantError, DecoderLM, "linear", config, vocabulary="aab")


@row("L129")
def _(ctx):
    """Break-it pass AR: orthogonal_gaussian's dtype (new in AQ) was not checked: float16 raised a bare
    NotImplementedError ('geqrf_cpu'), int64 a RuntimeError from linalg.qr, 'float64' 'Invalid device string',
    and complex64 returned a complex Ω."""
    from fwbench.variants.feature_maps import orthogonal_gaussian

    for dtype in (torch.int64, "float64", torch.complex64):
        assert raised(VariantError, orthogonal_gaussian, 4, 4, dtype=dtype).startswith(f"VariantError: dtype: got {dtype!r}")
    return raised(VariantError, orthogonal_gaussian, 4, 4, dtype=torch.float16)


@row("C289")
def _(ctx):
    """Break-it pass AR: `fwbench reproduce --seeds 4294967297` made --out and located the corpus (a download where
    none was here) before its seeds and grids were checked, so offline it answered with the corpus's error."""
    from fwbench.tasks import corpus

    ctx.monkeypatch.delenv(corpus.DATA_DIR_ENV, raising=False)
    ctx.monkeypatch.setenv(corpus.CACHE_DIR_ENV, str(ctx.tmp_path / "empty-cache"))

    def no_download(*args, **kwargs):
        raise AssertionError("a download before the options were checked")

    ctx.monkeypatch.setattr(corpus, "urllib_fetch", no_download)
    answer = cli(ctx, "reproduce", "--seeds", str(2**32 + 1), "--results-dir", str(ctx.tmp_path / "r"),
                 "--out", str(ctx.tmp_path / "out"))
    assert not (ctx.tmp_path / "out").exists()
    return answer


@row("C290")
def _(ctx):
    """Break-it pass AS: a data or cache folder whose name the OS refuses (300 characters: 'File name too long')
    raised a bare OSError traceback from `fwbench grids` and every LM grid load (the load-time corpus check of
    4b2fc73) and from `fwbench run --data-dir`."""
    from fwbench.tasks import corpus

    long_name = str(ctx.tmp_path / ("a" * 300))
    ctx.monkeypatch.setenv(corpus.DATA_DIR_ENV, long_name)
    assert cli(ctx, "grids") == "exit 0: "  # the grids are listed: the check is skipped, the run will say why
    ctx.monkeypatch.delenv(corpus.DATA_DIR_ENV)
    ctx.monkeypatch.setenv(corpus.CACHE_DIR_ENV, long_name)
    assert raised(corpus.CorpusError, corpus.locate_corpus, download=False).startswith(
        f"CorpusError: $FWBENCH_CACHE_DIR: cannot look for the corpus at '{long_name}/tinyshakespeare/input.txt' (")
    return cli(ctx, "run", "shakespeare", "--profile", "smoke", "--data-dir", long_name,
               "--results-dir", str(ctx.tmp_path / "r"))


@row("G144")
def _(ctx):
    """Break-it pass AS: a context no train_fraction could fit was blamed on train_fraction ('train_fraction: got
    0.9, which leaves … training characters'), though the whole corpus is shorter than the window."""
    fake_corpus_task(ctx)
    # break-it pass AT: the long-context stream too (16 × the window) was still blamed on train_fraction
    assert grid_error(ctx, LM_GRID + "context = 250\n").endswith(
        "the corpus holds 4100 characters, fewer than a training window (context × train_segments + 1 = 251) and "
        "the long-context evaluation's stream (16 × context × train_segments + 1 = 4001) together (or stream_eval = "
        "false)")
    return grid_error(ctx, LM_GRID + "context = 4000\nstream_eval = false\n")


@row("G145")
def _(ctx):
    """Break-it pass AU: dropout = 1e-30 trained exactly as dropout = 0 (its keep probability 1 − p is 1) under a run
    id of its own; 1e-39 was refused with the float32-tiny reason. Break-it pass AV: the refusal must not reach a p
    that acts: the CPU draws which units to keep in float64, so p = 2.9e-8 (below float32's resolution of 1 − p)
    drops units."""
    from fwbench.tasks.shakespeare import SMALLEST_DROPOUT

    below = math.nextafter(SMALLEST_DROPOUT, 0.0)
    assert (1.0 - below, 1.0 - SMALLEST_DROPOUT < 1.0) == (1.0, True)
    x = torch.ones(1_000_000)
    assert torch.equal(nn.functional.dropout(x, below, training=True), x)
    torch.manual_seed(0)
    x = torch.ones(20_000_000)
    assert sum(int((nn.functional.dropout(x, 2.9e-8, training=True) == 0).sum()) for _ in range(10)) > 0
    assert "dropout: got 1e-39; expected 0 or at least 5.551115123125784e-17" in grid_error(ctx, LM_GRID + "dropout = 1e-39\n")
    assert [spec.config["dropout"] for spec in expand(load_grid(grid_file(
        ctx, LM_GRID + f"dropout = [{SMALLEST_DROPOUT!r}, 2.9e-8]\n")), "quick")] == [SMALLEST_DROPOUT, 2.9e-8]
    return grid_error(ctx, LM_GRID + "dropout = [0.0, 1e-30]\n")


@row("G146")
def _(ctx):
    """Break-it pass AU: one range check named two or three keys ('lr, power_a: got 0.001, 0.0; expected > 0'), and
    the float32-tiny rule ran before the tasks' own: embedding_factor = 1e-39 (computed in float64) was given the
    float32 reason, grad_clip = -1e-39 'a magnitude of at least 1.18e-38', then -1.2e-38 'grad_clip >= 0'."""
    assert grid_error(ctx, LM_GRID + "lr = 0.0\n").endswith(": lr: got 0.0; expected > 0")
    assert grid_error(ctx, LM_GRID + "grad_clip = -1e-39\n").endswith(": grad_clip: got -1e-39; expected >= 0")
    assert grid_error(ctx, TINY_GRID.replace("max_steps = 2", "max_steps = 2\nlr = 0.0")).endswith(
        ": lr: got 0.0; expected > 0")
    assert grid_error(ctx, TINY_GRID.replace("max_steps = 2", "max_steps = 2\nembedding_factor = 1e-39")).endswith(
        ": embedding_factor: got 1e-39 with S=3, a key embedding of int(1e-39 × 3) = 0 features; expected "
        "embedding_factor × S >= 1")
    return grid_error(ctx, MQAR_GRID + "power_a = -0.0\n")


@row("G147")
def _(ctx):
    """Break-it pass AU: a RunSpec built in Python with -0.0 hashed it as '-0.0', a second run id for the run of
    0.0, which the grid path reads as 0.0 (run_grid retrained a run the store held)."""
    def run_id(task: str, **config) -> str:
        return RunSpec(grid="g", task=task, variant="linear", seed=1, config=config).run_id

    for task, key in (("shakespeare", "dropout"), ("shakespeare", "grad_clip"), ("shakespeare", "temperature"),
                      ("mqar", "target_loss")):
        assert run_id(task, **{key: -0.0}) == run_id(task, **{key: 0.0}), key
    # break-it pass AW: the record stored the config as given, -0.0, where a grid's record stores 0.0
    from fwbench.run.execute import build_record
    from fwbench.run.training import FitResult

    spec = RunSpec(grid="g", task="mqar", variant="linear", seed=1, config={"target_loss": -0.0})
    result = FitResult(status="max_steps", steps=0, best_eval={}, final_eval={}, best_step=0)
    record = build_record(spec, result, torch.device("cpu"), "2026-12-07T00:00:00Z")
    assert json.dumps(record["config"]) == '{"target_loss": 0.0}'
    from fwbench.run.launchers import failed_record  # break-it pass AX: a failed record stored -0.0 too

    assert json.dumps(failed_record(spec, "boom")["config"]) == '{"target_loss": 0.0}'
    return "no error: the run id of -0.0 is that of 0.0 (dropout, grad_clip, temperature, MQAR target_loss)"


@row("G148")
def _(ctx):
    """Break-it pass AU: lr = [1e-20, 1e-30] trained with identical metrics under two run ids. Both are normal float32
    numbers and act: one Adam step moves a weight at 0 by each (the LM's LayerNorm biases start at 0); that the
    moves round away against the other weights depends on the weights, which no loader sees."""
    specs = expand(load_grid(grid_file(ctx, LM_GRID + "lr = [1e-20, 1e-30]\n")), "quick")
    assert len({spec.run_id for spec in specs}) == 2
    moved = []
    for lr in (1e-20, 1e-30):
        weight = nn.Parameter(torch.zeros(1))
        optimiser = torch.optim.Adam([weight], lr=lr)
        weight.grad = torch.ones(1)
        optimiser.step()
        moved.append(weight.item())
    assert moved == [pytest.approx(-1e-20, rel=1e-6), pytest.approx(-1e-30, rel=1e-6)]
    return "no error: two runs (one Adam step moves a weight at 0 by -1e-20 and -1e-30: each acts)"


@row("G149")
def _(ctx):
    """Break-it pass AU: temperature = [0.0, 1e-300] sampled identical texts under two run ids. A positive
    temperature samples: where the top logits tie it draws among them, where 0 takes the first; which temperatures
    sample alike elsewhere depends on the trained logits, which no loader sees."""
    from fwbench.tasks.lm_model import sample_next

    specs = expand(load_grid(grid_file(ctx, LM_GRID + "temperature = [0.0, 1e-300]\n")), "quick")
    assert len({spec.run_id for spec in specs}) == 2
    logits = torch.tensor([[1.0, 1.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    greedy = {sample_next(logits, 0.0, generator).item() for _ in range(40)}
    tiny = {sample_next(logits, 1e-300, generator).item() for _ in range(40)}
    assert (greedy, tiny) == ({0}, {0, 1})
    return f"no error: two runs (over tied top logits 0 draws {sorted(greedy)}, 1e-300 draws {sorted(tiny)})"


@row("C291")
def _(ctx):
    """Break-it pass AU: FWBENCH_DATA_DIR naming a file was searched as a folder ('…/input.txt (absent)'), then a
    download was tried; --data-dir naming a file was refused as not a directory."""
    (ctx.tmp_path / "afile").write_text("not a folder")
    ctx.monkeypatch.setenv("FWBENCH_DATA_DIR", str(ctx.tmp_path / "afile"))
    return cli(ctx, "run", "shakespeare", "--quiet", "--results-dir", str(ctx.tmp_path / "r"))


@row("C292")
def _(ctx):
    """Break-it pass AU: `--temperature -1e-5` (or -inf) was answered by argparse 'expected one argument' (it read
    the value as an option: before Python 3.13 only -1 and -0.5 read as numbers); `--temperature -0.0` printed
    'temperature -0.0' in the sample's header."""
    import fwbench.run.sampling

    checkpoint = str(ctx.tmp_path / "run.pt")
    answer = cli(ctx, "sample", "--checkpoint", checkpoint, "--temperature", "-1e-5")
    assert cli(ctx, "sample", "--checkpoint", checkpoint, "--temperature", "-inf") == (
        "exit 2: fwbench: error: --temperature: got -inf; expected a finite number >= 0 (0 = greedy)")
    assert cli(ctx, "sample", "--checkpoint", checkpoint, "--temperature", "-1e5_0") == (  # float() reads it
        "exit 2: fwbench: error: --temperature: got -1e+50; expected a finite number >= 0 (0 = greedy)")
    ctx.monkeypatch.setattr(fwbench.run.sampling, "sample_from_checkpoint",
                            lambda *args, **kwargs: ("It is", {"variant": "linear", "step": 3}))
    assert cli(ctx, "sample", "--checkpoint", checkpoint, "--temperature", "-0.0") == (
        "exit 0: # linear, step 3, temperature 0.0, seed 1")
    return answer


@row("G150")
def _(ctx):
    """Break-it pass AV: once the float32-tiny rule ran after validate, only the run id made it: ``execute`` of a
    RunSpec built in Python trained 3000 steps with lr = 1e-320 (0 under the training's flushed denormals), then
    its record's run id refused it; MQAR power_a = 5e-324 stopped training on a bare ValueError ('got 0.0')."""
    from fwbench.run.execute import execute
    from fwbench.tasks import TASKS

    def no_training(*args, **kwargs):
        raise AssertionError("a training batch was drawn")

    ctx.monkeypatch.setattr(TASKS["mqar"], "train_batch", no_training)
    config = {"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2, "d_model": 8, "n_layers": 1, "batch_size": 2,
              "eval_sequences": 4, "max_steps": 3000, "eval_every": 3000}
    spec = RunSpec(grid="g", task="mqar", variant="linear", seed=1, config={**config, "lr": 1e-320})
    assert raised(FwbenchError, execute, spec, torch.device("cpu")).startswith(
        "FwbenchError: mqar config: lr: got 1e-320; expected a magnitude of at least 1.1754943508222875e-38")
    spec = RunSpec(grid="g", task="mqar", variant="linear", seed=1, config={**config, "power_a": 5e-324})
    return raised(FwbenchError, execute, spec, torch.device("cpu"))


@row("G151")
def _(ctx):
    """Break-it pass AV: in a process flushing denormals (DAZ), Python's own comparisons and repr read a subnormal
    as 0, and the checks said so: dropout = 5e-324 'got 0.0; expected a magnitude of at least …' (0 is allowed),
    grad_clip = -1e-320 given the magnitude reason, not 'grad_clip >= 0', MQAR power_a = 5e-324 'got 0.0'."""
    from fwbench.variants.kernels.precision import denormals_are_flushed

    def run_id_error(task: str, **config) -> str:
        return raised(FwbenchError, lambda: RunSpec(grid="g", task=task, variant="linear", seed=1, config=config).run_id)

    was_on = denormals_are_flushed()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-denormal mode")
    try:
        assert run_id_error("shakespeare", dropout=5e-324).startswith(
            "FwbenchError: shakespeare config: dropout: got 5e-324; expected 0 or at least 5.551115123125784e-17")
        assert run_id_error("shakespeare", grad_clip=-1e-320) == (
            "FwbenchError: shakespeare config: grad_clip: got -1e-320; expected >= 0")
        answer = run_id_error("mqar", power_a=5e-324)
        assert denormals_are_flushed()  # the mode is restored
    finally:
        torch.set_flush_denormal(was_on)
    return answer


@row("C293")
def _(ctx):
    """Break-it pass AV: ``$FWBENCH_DATA_DIR`` naming a file passed ``--jobs 2`` and ``--launcher ray``, which then
    recorded every LM run failed and exited 0 (the local launcher stopped at the first); a broken or looping link, or
    a path through a file, was still searched as a folder (C291)."""
    (ctx.tmp_path / "afile").write_text("not a folder")
    (ctx.tmp_path / "broken").symlink_to(ctx.tmp_path / "nowhere")
    (ctx.tmp_path / "loop").symlink_to(ctx.tmp_path / "loop")
    results = str(ctx.tmp_path / "r")
    for name in ("broken", "loop", "afile/sub"):
        ctx.monkeypatch.setenv("FWBENCH_DATA_DIR", str(ctx.tmp_path / name))
        assert cli(ctx, "estimate", "shakespeare").endswith(f"/{name}', which is not a directory; expected a "
                                                            "directory holding tinyshakespeare/input.txt or input.txt")
    ctx.monkeypatch.setenv("FWBENCH_DATA_DIR", str(ctx.tmp_path / "absent"))  # a folder yet to be made: searched
    assert cli(ctx, "run", str(grid_file(ctx, TINY_GRID)), "--quiet", "--results-dir", results).startswith("exit 0")
    ctx.monkeypatch.setenv("FWBENCH_DATA_DIR", str(ctx.tmp_path / "afile"))
    answer = cli(ctx, "run", "shakespeare", "--jobs", "2", "--quiet", "--results-dir", results)
    assert not (ctx.tmp_path / "r" / "checkpoints").exists()
    return answer


@row("C294")
def _(ctx):
    """Break-it pass AV: `fwbench probe --d-key -8` named a key in range too ('--d-key, --trials: got -8, 4')."""
    ctx.monkeypatch.chdir(ctx.tmp_path)
    assert cli(ctx, "probe", "--trials", "0") == "exit 2: fwbench: error: --trials: got 0; expected a positive integer"
    return cli(ctx, "probe", "--d-key", "-8")


@row("G152")
def _(ctx):
    """Break-it pass AW: a grid loaded in a process flushing denormals: Python's float() read 1e-320 as 0.0 and
    -1e-320 as -0.0 before any check, so dropout = -1e-320 (out of range) ran as 0.0 under the run id of 0, and
    retrieval embedding_factor = 1e-320 was refused as 'got 0.0'. The TOML is now read with denormals kept."""
    from fwbench.variants.kernels.precision import denormals_are_flushed

    was_on = denormals_are_flushed()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-denormal mode")
    try:
        assert grid_error(ctx, TINY_GRID.replace("max_steps = 2", "max_steps = 2\nembedding_factor = 1e-320")).endswith(
            "embedding_factor: got 1e-320 with S=3, a key embedding of int(1e-320 × 3) = 0 features; expected "
            "embedding_factor × S >= 1")
        answer = grid_error(ctx, LM_GRID + "dropout = -1e-320\n")
        assert denormals_are_flushed()
    finally:
        torch.set_flush_denormal(was_on)
    return answer


@row("G153")
def _(ctx):
    """Break-it pass AW: fit() and the packed path (fit_packed, execute_packed) with a config built in code skipped
    the grid's checks: fit_packed trained lr = 1e-320 to max_steps (0 under flushed denormals) and raised torch's
    'Invalid learning rate: -1.0'; fit raised 'Invalid learning rate: nan' and a TypeError for lr = '0.001'."""
    from fwbench.run.packing import fit_packed
    from fwbench.run.training import fit
    from fwbench.tasks.mqar import MQARConfig
    from fwbench.tasks.retrieval import RetrievalConfig

    cpu = torch.device("cpu")
    mqar = {"vocab_size": 16, "seq_len": 16, "num_kv_pairs": 2, "d_model": 8, "n_layers": 1, "batch_size": 2,
            "eval_sequences": 4, "max_steps": 2, "eval_every": 2}
    assert raised(FwbenchError, fit, "mqar", "linear", MQARConfig(**mqar, lr=math.nan), 1, cpu) == (
        "FwbenchError: mqar config: lr: got nan; expected a finite number")
    assert raised(FwbenchError, fit, "mqar", "linear", MQARConfig(**mqar, lr="0.001"), 1, cpu) == (
        "FwbenchError: mqar config: lr: got '0.001' (str); expected float")
    retrieval = {"S": 3, "d_key": 4, "eval_every": 2, "eval_sequences": 2, "batch_size": 2, "max_steps": 2}
    assert raised(FwbenchError, lambda: list(fit_packed("linear", [RetrievalConfig(**retrieval, lr=-1.0)], [1], cpu))) == (
        "FwbenchError: retrieval config: lr: got -1.0; expected > 0")
    # break-it pass AX: fit and fit_packed make no run id, so a NumPy scalar is taken as its number (it trained
    # before: 'S: got np.int64(3) (int64); expected int', and json's TypeError in fit_packed), and a config that
    # is not a dataclass is validated only (asdict's TypeError); a registered task's own tiny default is its choice
    import types
    from dataclasses import dataclass as make_dataclass

    import numpy as np

    from fwbench.tasks import TASKS
    from fwbench.tasks.retrieval import RetrievalTask

    assert fit("retrieval", "linear", RetrievalConfig(**{**retrieval, "S": np.int64(3)}, lr=np.float32(1e-3)), 1,
               cpu).status == "max_steps"
    assert [result.status for _, result in fit_packed(
        "linear", [RetrievalConfig(**retrieval, lr=np.float32(1e-3))] * 2, [1, 2], cpu)] == ["max_steps"] * 2
    assert fit("retrieval", "linear", types.SimpleNamespace(**vars(RetrievalConfig(**retrieval))), 1,
               cpu).status == "max_steps"

    @make_dataclass(frozen=True)
    class OwnConfig(RetrievalConfig):
        eps: float = 1e-300

    class OwnTask(RetrievalTask):
        name = "own"
        config_class = OwnConfig

    # break-it pass AY: each number was checked as its Python number but trained as given: np.float32(1e-40) passed
    # the tiny rule (read as 0 in training), Fraction(1, 1000) reached torch's Adam (TypeError), np.int8 sizes and
    # np.int64(2**32) wrapped in the size checks; Fraction(10**400) raised OverflowError; a config class, TypeError
    import fractions

    for run in (lambda config: fit("retrieval", "linear", config, 1, cpu),
                lambda config: list(fit_packed("linear", [config], [1], cpu))):
        assert "lr: got 9.99994610111476e-41; expected a magnitude of at least" in raised(
            FwbenchError, run, RetrievalConfig(**retrieval, lr=np.float32(1e-40)))
        assert raised(FwbenchError, run, RetrievalConfig(**retrieval, lr=fractions.Fraction(10**400))) == (
            "FwbenchError: retrieval config: lr: got Fraction(an integer of 401 digits, 1); expected a finite number")
        assert "S: got 4294967296; expected sizes whose (S, S) value codes" in raised(
            FwbenchError, run, RetrievalConfig(**{**retrieval, "S": np.int64(2**32)}))
        run(RetrievalConfig(**{**retrieval, "S": np.int8(100), "batch_size": np.int8(127)},
                            lr=fractions.Fraction(1, 1000)))  # trains
    assert raised(FwbenchError, fit, "retrieval", "linear", RetrievalConfig, 1, cpu) == (
        "FwbenchError: retrieval config: got the class RetrievalConfig; expected an instance of it")
    ctx.monkeypatch.setitem(TASKS, "own", OwnTask())
    assert fit("own", "linear", OwnConfig(**retrieval), 1, cpu).status == "max_steps"
    assert "eps: got 1e-301; expected a magnitude of at least" in raised(
        FwbenchError, fit, "own", "linear", OwnConfig(**retrieval, eps=1e-301), 1, cpu)
    return raised(FwbenchError, lambda: list(fit_packed("linear", [RetrievalConfig(**retrieval, lr=1e-320)], [1], cpu)))


@row("C295")
def _(ctx):
    """Break-it pass AW: a data folder without the corpus (offline; here, a copy failing its checksum) under ``--jobs
    2``: every LM run was recorded failed and the command exited 0, where the local launcher stops at the first run
    with the corpus error."""
    (ctx.tmp_path / "data").mkdir()
    (ctx.tmp_path / "data" / "input.txt").write_text("not the corpus")  # refused by its checksum, never downloaded
    ctx.monkeypatch.setenv("FWBENCH_DATA_DIR", str(ctx.tmp_path / "data"))
    grid = grid_file(ctx, LM_GRID.replace('variant = "linear"', 'variant = ["linear", "softmax"]') + (
        "d_model = 8\nn_heads = 1\nn_layers = 1\nd_ff = 8\ncontext = 8\nmax_steps = 2\neval_every = 2\n"
        "stream_eval = false\nsample_tokens = 0\n"))
    answer = cli(ctx, "run", str(grid), "--jobs", "2", "--quiet", "--results-dir", str(ctx.tmp_path / "r"))
    runs = ctx.tmp_path / "r" / "runs.jsonl"
    assert not runs.exists() or not runs.read_text().strip()  # no failed records
    # break-it pass AX: a run finished in the same wait as the corpus error lost its record (the pool is faked: every
    # future is done at once, and the set of them is read in no fixed order)
    from concurrent.futures import Future

    import fwbench.run.launchers as launchers

    class DonePool:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, spec, *args):
            future = Future()
            if spec.seed in (1, 4, 8):
                future.set_exception(CorpusError("no corpus here"))
            else:
                future.set_result({"run_id": spec.run_id, "status": "max_steps"})
            return future

    ctx.monkeypatch.setattr(launchers, "ProcessPoolExecutor", DonePool)
    specs = [RunSpec(grid="g", task="retrieval", variant="linear", seed=seed, config={"S": 4}) for seed in range(1, 9)]
    yielded = []
    with pytest.raises(CorpusError, match="no corpus here"):
        for record in launchers.launch_local_jobs(specs, LaunchOptions(jobs=2, device="cpu")):
            yielded.append(record["run_id"])
    assert sorted(yielded) == sorted(spec.run_id for spec in specs if spec.seed not in (1, 4, 8))
    return answer


# ------------------------------------------------------------------------------------------------
# The table and the tests.
# ------------------------------------------------------------------------------------------------

ROW_LINE = re.compile(
    r"^\| (?P<id>[A-Z]\d{2,}) \|(?P<where>[^|]*)\|(?P<input>.*)\| `(?P<answer>[^`]*)` \|(?P<test>[^|]*)\|$"
)


def table_rows() -> dict[str, str]:
    """Row id → the answer the table promises (text inside the answer column's backticks)."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        match = ROW_LINE.match(line)
        if match:
            assert match["id"] not in rows, f"row {match['id']} appears twice in {TABLE.name}"
            assert f"test_bad_input[{match['id']}]" in match["test"], line
            rows[match["id"]] = match["answer"]
    return rows


def answer_pattern(answer: str) -> re.Pattern:
    """The table's answer as a regex: literal text, with ``…`` matching anything."""
    return re.compile(".*".join(re.escape(part) for part in answer.split("…")), re.DOTALL)


def test_table_has_at_least_30_rows_and_every_row_has_a_test():
    rows = table_rows()
    assert len(rows) >= 30
    assert set(rows) == set(ROWS), f"in the table only: {set(rows) - set(ROWS)}; here only: {set(ROWS) - set(rows)}"
    assert {row_id[0] for row_id in rows} == {"L", "H", "C", "G"}  # library, harness, CLI, config


@pytest.mark.parametrize("row_id", sorted(ROWS))
def test_bad_input(row_id, tmp_path, capsys, monkeypatch):
    promised = table_rows()[row_id]
    answer = ROWS[row_id](Context(tmp_path, capsys, monkeypatch))
    assert answer_pattern(promised).fullmatch(answer), f"\nthe table says: {promised}\nthe code says:  {answer}"

