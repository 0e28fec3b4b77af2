"""The training loop itself: its saved state, the evaluation of the final model, the exact step
early stopping ends at, FAVOR+'s redraw every step, and the record's strict JSON (issue 14 items
5 and 6, the loop's planted faults of item 14; issue 15 item 4)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn

from fwbench import tasks
from fwbench.run.environment import denormal_flushing_supported, portable_argv
from fwbench.run.grid import RunSpec, load_grid
from fwbench.run.launchers import LaunchOptions
from fwbench.run.runner import run_grid
from fwbench.run.store import ResultsStore
from fwbench.run.training import LoopState, fit, redraw_random_features
from fwbench.tasks.retrieval import RetrievalConfig
from fwbench.variants import Favor
from fwbench.variants.kernels.precision import denormals_are_flushed


@dataclass(frozen=True)
class ScriptedConfig:
    """A task whose evaluation losses are ``losses`` in turn (then the last one again)."""

    losses: tuple[float, ...] = (1.0,)
    batch_size: int = 2
    lr: float = 0.01
    eval_every: int = 2
    patience: int = 3
    target_loss: float = 0.0
    max_steps: int = 40


class ScriptedTask:
    """Trains a 2×2 linear map; ``evaluate`` returns the scripted loss and the step it ran after."""

    name: ClassVar[str] = "scripted"
    config_class: ClassVar[type] = ScriptedConfig

    def validate(self, config):
        pass

    def build_model(self, config, variant):
        model = nn.Linear(2, 2)
        model.steps, model.evaluations = 0, 0
        return model

    def train_batch(self, config, generator):
        return torch.randn(config.batch_size, 2, generator=generator)

    def loss(self, model, x, config):
        model.steps += 1
        return model(x).pow(2).mean()

    def evaluate(self, model, config, generator, device):
        loss = config.losses[min(model.evaluations, len(config.losses) - 1)]
        model.evaluations += 1
        return {"loss": loss, "after_step": float(model.steps)}


@pytest.fixture(autouse=True)
def scripted_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "scripted", ScriptedTask())


def test_the_model_a_run_ends_with_is_evaluated_whatever_the_schedule():
    """eval_every 10, max_steps 19: evaluations at 10 and at 19 (the issue's 100/190, scaled down)."""
    result = fit("scripted", "linear", ScriptedConfig(losses=(0.5, 0.25), eval_every=10, max_steps=19), 1,
                 torch.device("cpu"))
    assert result.status == "max_steps" and result.steps == 19
    assert [point["step"] for point in result.curve] == [10, 19]
    assert result.final_eval == {"loss": 0.25, "after_step": 19.0}
    assert result.best_eval["loss"] == 0.25 and result.best_step == 19
    assert "train_loss" not in result.curve[-1]  # no training step belongs to the extra evaluation


def test_a_run_whose_budget_is_a_multiple_of_eval_every_is_evaluated_once_per_evaluation_step():
    result = fit("scripted", "linear", ScriptedConfig(eval_every=5, max_steps=20), 1, torch.device("cpu"))
    assert [point["step"] for point in result.curve] == [5, 10, 15, 20]


def test_a_real_task_is_evaluated_at_its_last_step():
    config = RetrievalConfig(S=4, d_key=8, batch_size=4, eval_every=5, eval_sequences=4, max_steps=7, target_loss=0.0)
    result = fit("retrieval", "linear", config, 2, torch.device("cpu"))
    assert [point["step"] for point in result.curve] == [5, 7]
    assert result.final_eval["loss"] == result.curve[-1]["eval_loss"]


def test_early_stopping_ends_at_the_evaluation_that_completes_the_patience():
    """Best at step 4, then three worse evaluations (6, 8, 10): patience 3 stops at step 10, not 12."""
    config = ScriptedConfig(losses=(1.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95), eval_every=2, patience=3, max_steps=40)
    result = fit("scripted", "linear", config, 1, torch.device("cpu"))
    assert result.status == "plateau"
    assert result.steps == 10 and result.best_step == 4 and result.best_eval["loss"] == 0.5
    assert [point["step"] for point in result.curve] == [2, 4, 6, 8, 10]


def test_a_plateau_needs_evaluations_without_a_new_best_not_equal_ones():
    """An improvement resets the count: 1.0, 0.9 (best), 0.95, 0.8 (best), 0.85, 0.85, 0.85 → stops at step 14."""
    config = ScriptedConfig(losses=(1.0, 0.9, 0.95, 0.8, 0.85), eval_every=2, patience=3, max_steps=40)
    result = fit("scripted", "linear", config, 1, torch.device("cpu"))
    assert result.status == "plateau" and result.steps == 14 and result.best_step == 8


def test_reaching_the_target_converges_at_that_evaluation():
    config = ScriptedConfig(losses=(1.0, 0.5, 0.01), eval_every=3, target_loss=0.01)
    result = fit("scripted", "linear", config, 1, torch.device("cpu"))
    assert result.status == "converged" and result.steps == 9


def test_training_a_favor_model_draws_new_features_every_step():
    """The loop calls the redraw: Ω differs at every step, and the draws repeat with the seed."""
    config = RetrievalConfig(S=4, d_key=8, batch_size=4, eval_every=3, eval_sequences=4, max_steps=6, target_loss=0.0)

    def omegas_per_step(seed: int) -> list[torch.Tensor]:
        seen: list[torch.Tensor] = []
        model_maps: list[Favor] = []
        original = Favor.redraw_features

        def recording(self):
            original(self)
            model_maps.append(self)
            seen.append(self.omega.detach().clone())

        Favor.redraw_features = recording
        try:
            fit("retrieval", "favor:m=8", config, seed, torch.device("cpu"))
        finally:
            Favor.redraw_features = original
        assert len({id(m) for m in model_maps}) >= 1
        return seen

    draws = omegas_per_step(5)
    per_step = len(draws) // config.max_steps
    assert per_step >= 1 and len(draws) == per_step * config.max_steps  # every step, every feature map
    for before, after in zip(draws, draws[per_step:]):
        assert not torch.equal(before, after)
    assert all(torch.equal(a, b) for a, b in zip(draws, omegas_per_step(5)))


def test_redrawing_from_a_stream_leaves_the_global_generator_alone():
    model = nn.Sequential(Favor(8, m=4))
    stream = torch.Generator().manual_seed(7)
    before = torch.get_rng_state()
    redraw_random_features(model, stream)
    first = model[0].omega.clone()
    assert torch.equal(torch.get_rng_state(), before)
    redraw_random_features(model, torch.Generator().manual_seed(7))
    assert torch.equal(model[0].omega, first)  # the same stream state, the same Ω


def test_loop_state_saves_and_restores_itself():
    loop = LoopState(step=12, curve=[{"step": 10, "eval_loss": 0.5}], best_eval={"loss": 0.5}, best_step=10,
                     since_best=1, train_s=2.5, wall_s=3.0)
    saved = loop.state_dict()
    assert "clock" not in saved and "resumed_at" not in saved and saved["wall_s"] >= 3.0
    restored = LoopState.from_state_dict(json.loads(json.dumps(saved)))  # a plain, JSON-able dict
    assert restored.resumed_at == 12
    for name in ("step", "curve", "best_eval", "best_step", "since_best", "status", "train_s", "finished"):
        assert getattr(restored, name) == getattr(loop, name), name


def strict(line: str) -> dict:
    """Parse ``line`` as strict JSON: NaN, Infinity and -Infinity are errors."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(line, parse_constant=refuse)


def test_a_run_that_diverges_before_any_evaluation_writes_strict_json(tmp_path):
    """lr 1e12: diverged at step 2; its best loss was never measured, so null, not Infinity. DPFP: linear's
    queries are scaled per token since break-it pass AH, and it trains on finite (lr 1e20 diverges it)."""
    config = RetrievalConfig(S=4, d_key=8, batch_size=4, eval_every=50, eval_sequences=4, max_steps=100, lr=1e12)
    spec = RunSpec("diverge", "retrieval", "dpfp:nu=1", 1, config.__dict__)
    store = ResultsStore(tmp_path)
    run_grid([spec], store, LaunchOptions(device="cpu"), quiet=True)
    line, = store.path.read_text().splitlines()
    record = strict(line)
    assert record["status"] == "diverged" and record["diverged_at"] == 2
    assert record["diverged_reason"] == "training loss is nan"
    assert record["metrics"]["best_eval_loss"] is None and record["metrics"]["final_eval_loss"] is None


def test_every_non_finite_value_is_written_as_null_with_its_reason(tmp_path):
    store = ResultsStore(tmp_path)
    record = {"run_id": "x", "metrics": {"loss": float("inf"), "ok": 1.5},
              "curve": [{"step": 2, "eval_loss": float("nan")}, {"step": 4, "eval_loss": -float("inf")}]}
    store.append(record)
    written = strict(store.path.read_text())
    assert written["metrics"] == {"loss": None, "ok": 1.5}
    assert written["curve"] == [{"step": 2, "eval_loss": None}, {"step": 4, "eval_loss": None}]
    assert written["non_finite"] == {"metrics.loss": "inf", "curve.0.eval_loss": "nan", "curve.1.eval_loss": "-inf"}
    assert record["metrics"]["loss"] == float("inf")  # the caller's record is left as it was
    bench = ResultsStore(tmp_path, "bench.jsonl")
    bench.append({"run_id": "b", "ratio": float("nan")})
    assert strict(bench.path.read_text())["ratio"] is None


def test_numpy_and_torch_numbers_in_a_record_are_written_as_json_numbers(tmp_path):
    """A metric averaged with NumPy is a numpy.float32, which json cannot write: the record (and
    the finished run) would be lost. Scalars, arrays and tensors become numbers and lists."""
    store = ResultsStore(tmp_path)
    store.append({"run_id": "np", "metrics": {"loss": np.float32(0.25), "steps": np.int64(7), "nan": np.float32("nan"),
                                              "per_key": np.array([0.5, np.inf], dtype=np.float32),
                                              "peak": torch.tensor(3.0), "ok": np.bool_(True)}})
    written = strict(store.path.read_text())
    assert written["metrics"] == {"loss": 0.25, "steps": 7, "nan": None, "per_key": [0.5, None], "peak": 3.0, "ok": True}
    assert written["non_finite"] == {"metrics.nan": "nan", "metrics.per_key.1": "inf"}


def test_csv_tables_hold_empty_cells_for_non_finite_values(tmp_path):
    import pandas as pd

    from fwbench.run.strict_json import write_csv

    write_csv(pd.DataFrame({"a": [1.0, float("inf"), float("nan")], "b": ["x", "y", "z"]}), tmp_path / "t.csv",
              index=False)
    assert (tmp_path / "t.csv").read_text().splitlines() == ["a,b", "1.0,x", ",y", ",z"]


def test_the_grid_loader_warns_when_the_budget_falls_between_evaluations(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
                    'max_steps = [190, 200]\neval_every = 100\n')
    grid = load_grid(path)
    assert grid.warnings == ("grid g profile quick: max_steps 190 is not a multiple of eval_every 100; runs that "
                             "reach it are also evaluated at step 190, off the every-100 schedule",)


def test_the_grid_loader_warns_of_a_budget_below_the_first_evaluation(tmp_path):
    """max_steps below eval_every falls between step 0 and the first scheduled evaluation: the run is
    evaluated at its last step only, off the schedule, and is warned of as any other budget between two
    evaluations (a planted ``steps > every`` condition in _schedule_warnings survived the tests)."""
    path = tmp_path / "g.toml"
    path.write_text('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
                    'max_steps = 50\neval_every = 100\n')
    assert load_grid(path).warnings == ("grid g profile quick: max_steps 50 is not a multiple of eval_every 100; "
                                        "runs that reach it are also evaluated at step 50, off the every-100 schedule",)


def test_tables_still_count_a_run_diverged_before_any_evaluation_as_failed():
    from fwbench.analysis.records import records_frame

    record = {"run_id": "x", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1, "status": "diverged",
              "steps": 2, "wall_s": 0.1, "config": {"S": 4}, "metrics": {"best_eval_loss": None}}
    assert records_frame([record])["best_eval_loss"].tolist() == [float("inf")]


def test_fwbench_run_prints_the_schedule_warning_and_evaluates_the_last_step(tmp_path, capsys):
    from fwbench.cli import main

    grid = tmp_path / "w.toml"
    grid.write_text('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nS = 4\nd_key = 8\n'
                    'batch_size = 4\neval_sequences = 4\nmax_steps = 3\neval_every = 2\ntarget_loss = 0.0\n')
    assert main(["run", str(grid), "--results-dir", str(tmp_path / "r"), "--quiet"]) == 0
    assert ("fwbench: warning: grid w profile quick: max_steps 3 is not a multiple of eval_every 2; runs that "
            "reach it are also evaluated at step 3, off the every-2 schedule") in capsys.readouterr().err
    record, = ResultsStore(tmp_path / "r").records()
    assert [point["step"] for point in record["curve"]] == [2, 3]
    assert record["metrics"]["final_eval_loss"] == record["curve"][-1]["eval_loss"]


def _denormal_survives() -> bool:
    return not denormals_are_flushed()


@pytest.mark.skipif(not denormal_flushing_supported(), reason="this CPU cannot flush denormals")
def test_training_and_evaluation_flush_denormals_and_the_mode_is_restored(monkeypatch):
    """Denormal operands slowed FAVOR+ delta steps 5x (37 → 155 ms of CPU over 3000 steps); the loop
    trains and evaluates with them flushed to zero, and leaves the caller's mode as it was."""
    seen = []
    task = tasks.TASKS["scripted"]
    monkeypatch.setattr(task, "train_batch", lambda config, generator: (seen.append(("train", _denormal_survives())),
                                                                      torch.ones(config.batch_size, 2))[1])
    evaluate = task.evaluate
    monkeypatch.setattr(task, "evaluate", lambda *a: (seen.append(("eval", _denormal_survives())), evaluate(*a))[1])
    assert _denormal_survives()
    fit("scripted", "linear", ScriptedConfig(eval_every=2, max_steps=4), 1, torch.device("cpu"))
    assert seen and not any(survives for _, survives in seen) and {kind for kind, _ in seen} == {"train", "eval"}
    assert _denormal_survives()  # restored
    torch.set_flush_denormal(True)
    try:
        fit("scripted", "linear", ScriptedConfig(eval_every=2, max_steps=4), 1, torch.device("cpu"))
        assert not _denormal_survives()  # a caller that had it on keeps it on
    finally:
        torch.set_flush_denormal(False)


def test_the_record_says_denormals_flushed_only_when_every_thread_flushes():
    """torch.set_flush_denormal sets the calling thread's mode; with 2 torch threads the other
    one computed half of a large product with denormals, so a record of such a run must not say
    ``denormals_flushed: true``."""
    from fwbench.run.environment import describe_environment

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert describe_environment(torch.device("cpu"))["denormals_flushed"] == denormal_flushing_supported()
        torch.set_num_threads(2)
        assert describe_environment(torch.device("cpu"))["denormals_flushed"] is False
    finally:
        torch.set_num_threads(threads)


def test_a_record_keeps_no_absolute_path_of_this_machine(tmp_path, monkeypatch):
    """`--results-dir /abs/…` under the working directory is recorded relative to it, one under the
    home directory as ~/…; other arguments are untouched."""
    home = tmp_path / "home"
    work = home / "repo"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    argv = ["run", "setting2", "--results-dir", str(work / "results" / "paper"), "--data-dir", str(home / "data"),
            "--out", "/elsewhere/reports", "--jobs", "2"]
    assert portable_argv(argv) == ["run", "setting2", "--results-dir", "results/paper", "--data-dir",
                                   str(Path("~") / "data"), "--out", "/elsewhere/reports", "--jobs", "2"]
    # the same paths as `--option=value` (argparse takes both): kept absolute before
    argv = [f"--results-dir={work / 'results'}", f"--data-dir={home / 'data'}", "--out=/elsewhere", "-x=1", "a=/b"]
    assert portable_argv(argv) == ["--results-dir=results", f"--data-dir={Path('~') / 'data'}", "--out=/elsewhere",
                                   "-x=1", "a=/b"]
