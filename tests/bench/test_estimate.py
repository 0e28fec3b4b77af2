"""``fwbench estimate`` (issue 16 item 1): steps per run from the official logs (capped by
max_steps) when the cell has the official run's lr and batch size, or the cap, times a step time
measured once per step shape, plus ⌈steps / eval_every⌉ evaluations times an evaluation time measured
once per evaluation shape, summed into core-hours; the wall time of ``--jobs N`` as the launcher's
schedule; ``--against`` beside a results store. The arithmetic is checked with fake timers; real
measurements check the timers."""

from __future__ import annotations

import pytest

from fwbench.bench.estimate import CAP, CAP_OTHER_SETUP, OFFICIAL, estimate, format_estimate, measure_step_seconds, step_shape
from fwbench.cli import main
from fwbench.run.grid import expand, load_grid

GRID = """
name = "estimate-tiny"
task = "retrieval"

[defaults]
setting = 1
d_key = 8
batch_size = 32
eval_sequences = 4

[profiles.quick]
variant = ["dpfp:nu=1", "linear"]
S = [20, 40, 7]
seed = [1, 2]
lr = [1e-3, 3e-4]
max_steps = 150
"""


@pytest.fixture
def specs(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    return expand(load_grid(path), "quick")


def fake_timer(calls):
    def timer(spec):
        calls.append(step_shape(spec))
        return 0.01 * spec.config["S"] + (0.5 if spec.variant == "linear" else 0.0)
    return timer


def test_estimate_multiplies_official_or_capped_steps_by_one_step_time_per_shape(specs):
    calls = []
    cells = estimate(specs, fake_timer(calls), eval_timer=None)  # training only: the step arithmetic
    assert len(specs) == 24 and len(cells) == 12  # seeds share a cell
    assert len(calls) == len(set(calls)) == 6  # one timing per (variant, S): lr and seed do not change a step
    by_key = {(c.variant, c.config["S"], c.config["lr"]): c for c in cells}
    # official dpfp ν=1 Setting 1 logs: S=20 stopped at step 100, S=40 at 200 (capped here at 150)
    assert (by_key["dpfp:nu=1", 20, 1e-3].steps, by_key["dpfp:nu=1", 20, 1e-3].source) == (100, OFFICIAL)
    assert (by_key["dpfp:nu=1", 40, 1e-3].steps, by_key["dpfp:nu=1", 40, 1e-3].source) == (150, OFFICIAL)
    assert (by_key["dpfp:nu=1", 7, 1e-3].steps, by_key["dpfp:nu=1", 7, 1e-3].source) == (150, CAP)
    # the same (variant, S) at lr 3e-4 is another setup than the official run's: its log does not count
    assert (by_key["dpfp:nu=1", 20, 3e-4].steps, by_key["dpfp:nu=1", 20, 3e-4].source) == (150, CAP_OTHER_SETUP)
    cell = by_key["linear", 20, 3e-4]
    assert cell.runs == 2 and cell.step_s == pytest.approx(0.7)
    # linear S=20: official last step, capped at 150; 2 runs × 150 steps × 0.7 s
    assert cell.core_hours == pytest.approx(2 * min(150, cell.steps) * 0.7 / 3600)
    total = sum(c.core_hours for c in cells)
    expected = sum(2 * c.steps * c.step_s for c in cells) / 3600
    assert total == pytest.approx(expected)
    text = format_estimate(cells, "tiny", jobs=2)
    assert f"24 runs, {total:.2f} core-hours" in text and "with --jobs 2" in text


SETTING2_FWM = """
name = "estimate-fwm"
task = "retrieval"

[defaults]
setting = 2
d_key = 8
max_steps = 50000

[profiles.quick]
variant = ["tanh-fwm", "dpfp-fwm:nu=1"]
S = 20
seed = 1
lr = [1e-3, 1e-4]
batch_size = [32, 128]
"""


def test_official_steps_count_only_for_the_official_lr_and_batch_of_the_variant(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(SETTING2_FWM)
    cells = estimate(expand(load_grid(path), "quick"), lambda spec: 0.01, eval_timer=None)
    source = {(c.variant, c.config["lr"], c.config["batch_size"]): (c.steps, c.source) for c in cells}
    # official Setting 2 S=20 logs: tanh-fwm (lr 1e-4, batch 128) stopped at 15400; dpfp-fwm (lr 1e-3,
    # batch 32) at its own step; every other (lr, batch) of the same variant and S is capped
    assert source["tanh-fwm", 1e-4, 128] == (15400, OFFICIAL)
    assert source["tanh-fwm", 1e-3, 32] == (50000, CAP_OTHER_SETUP)
    assert source["tanh-fwm", 1e-4, 32] == (50000, CAP_OTHER_SETUP)
    assert source["dpfp-fwm:nu=1", 1e-3, 32][1] == OFFICIAL and source["dpfp-fwm:nu=1", 1e-3, 32][0] < 50000
    assert source["dpfp-fwm:nu=1", 1e-4, 128] == (50000, CAP_OTHER_SETUP)
    assert source["dpfp-fwm:nu=1", 1e-3, 128] == (50000, CAP_OTHER_SETUP)
    text = format_estimate(cells, "fwm", jobs=2)
    assert "| tanh-fwm | setting=2, S=20 | 1 | 50000 | cap (max_steps; lr/batch ≠ official run) |" in text
    capped = sum(c.core_hours for c in cells if c.source != OFFICIAL)
    assert f"{capped:.2f} core-hours are cells without an official log of their setup" in text


def test_measured_step_time_is_positive_and_small_for_a_tiny_model(specs):
    seconds = measure_step_seconds(specs[0], steps=2)
    assert 0 < seconds < 5


@pytest.mark.slow
def test_estimate_command_prints_the_table_and_the_total(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text(GRID.replace('S = [20, 40, 7]', 'S = [20]').replace('lr = [1e-3, 3e-4]', 'lr = 1e-3'))
    assert main(["estimate", str(path), "--profile", "quick", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "| dpfp:nu=1 | setting=1, S=20 | 2 | 100 | official log |" in out and "4 runs" in out


def test_a_run_that_stops_at_once_is_timed_outside_the_loop(specs, monkeypatch):
    import fwbench.run.training

    monkeypatch.setattr(fwbench.run.training, "fit", lambda *args, **kwargs: None)  # no step reported
    seconds = measure_step_seconds(specs[0], steps=2)
    assert 0 < seconds < 5


@pytest.mark.slow
def test_estimate_reproduce_covers_every_grid_of_the_profile_and_counts_shared_runs_once(monkeypatch, capsys):
    """`fwbench estimate reproduce --profile paper`: capacity, setting2, capacity_nu and shakespeare (no
    MQAR: it has no paper profile); capacity_nu's paper cells are the capacity grid's (same run ids), so
    the total counts them once."""
    import fwbench.bench.estimate_command as command

    monkeypatch.setattr(command, "measure_step_seconds", lambda spec, steps: 0.01)
    monkeypatch.setattr(command, "measure_eval_seconds", lambda spec: (0.0, 0.0))
    unique = {spec.run_id for name in ("capacity", "setting2", "capacity_nu", "shakespeare")
              for spec in expand(load_grid(name), "paper")}
    assert main(["estimate", "reproduce", "--profile", "paper"]) == 0
    out = capsys.readouterr()
    assert "reproduce [paper] (capacity, setting2, capacity_nu, shakespeare)" in out.out
    assert f": {len(unique)} runs" in out.out and f"Total (estimated): {len(unique)} runs" in out.out
    assert "grid mqar has no profile 'paper': skipped" in out.err
    assert len(unique) < sum(len(expand(load_grid(n), "paper")) for n in ("capacity", "setting2", "capacity_nu",
                                                                           "shakespeare"))


def test_a_cell_that_fails_is_marked_failed_and_a_setup_error_ends_the_estimate(specs):
    """As fwbench run: a cell whose model or task raises is recorded failed (0 core-hours, its message
    in the table) and the others are still estimated; an FwbenchError (the user's setup) propagates."""
    from fwbench.errors import FwbenchError

    def timer(spec):
        if spec.variant == "linear":
            raise RuntimeError("cannot build\nsecond line")
        return 0.25

    cells = estimate(specs, timer, eval_timer=None)
    failed = [c for c in cells if c.error is not None]
    assert {c.variant for c in failed} == {"linear"} and len(failed) == 6
    assert all(c.error == "RuntimeError: cannot build" and c.core_hours == 0.0 for c in failed)
    ok = [c for c in cells if c.error is None]
    assert sum(c.core_hours for c in ok) == pytest.approx(sum(c.runs * c.steps * 0.25 for c in ok) / 3600)
    table = format_estimate(cells, "t")
    assert "| failed: RuntimeError: cannot build |" in table
    assert "6 cell(s) (12 runs) failed to build or train" in table

    def setup_error(spec):
        raise FwbenchError("no corpus")

    with pytest.raises(FwbenchError, match="no corpus"):
        estimate(specs, setup_error)


EVAL_GRID = """
name = "estimate-eval"
task = "retrieval"

[defaults]
setting = 1
d_key = 8
batch_size = 32
eval_every = 30
max_steps = 150

[profiles.quick]
variant = "dpfp:nu=1"
S = [20, 7]
seed = [1, 2]
eval_sequences = [4, 8]
"""


def test_each_run_counts_its_evaluations_at_the_time_of_one_evaluation_per_shape(tmp_path):
    """dpfp ν=1 at S=20 stops at the official log's step 100, S=7 at the cap of 150; every 30 steps
    and at a last step between: 4 and 5 evaluations. Fake timers: 0.01 s a step, 0.2 s an evaluation of
    4 sequences, 0.4 s of 8, 3 s the final evaluation; eval_sequences changes the evaluation's cost
    only, so steps are timed per S (2 calls) and evaluations per (S, eval_sequences) (4 calls)."""
    path = tmp_path / "grid.toml"
    path.write_text(EVAL_GRID)
    step_calls, eval_calls = [], []

    def step_timer(spec):
        step_calls.append(spec.run_id)
        return 0.01

    def eval_timer(spec):
        eval_calls.append(spec.run_id)
        return (0.05 * spec.config["eval_sequences"], 3.0)

    cells = estimate(expand(load_grid(path), "quick"), step_timer, eval_timer=eval_timer)
    assert (len(step_calls), len(eval_calls)) == (2, 4)
    run_s = {(c.config["S"], c.config["eval_sequences"]): (c.steps, c.evaluations, c.run_s) for c in cells}
    assert run_s[20, 4] == (100, 4, pytest.approx(100 * 0.01 + 4 * 0.2 + 3.0))  # 4.8 s
    assert run_s[20, 8] == (100, 4, pytest.approx(100 * 0.01 + 4 * 0.4 + 3.0))  # 5.6 s
    assert run_s[7, 4] == (150, 5, pytest.approx(150 * 0.01 + 5 * 0.2 + 3.0))   # 5.5 s
    assert run_s[7, 8] == (150, 5, pytest.approx(150 * 0.01 + 5 * 0.4 + 3.0))   # 6.5 s
    assert sum(c.core_hours for c in cells) == pytest.approx(2 * (4.8 + 5.6 + 5.5 + 6.5) / 3600)
    text = format_estimate(cells, "eval", jobs=2)
    assert "| dpfp:nu=1 | setting=1, S=20 | 2 | 100 | official log | 0.0100 | 4 | 0.2000 + final 3.00 |" in text


def test_the_evaluation_count_is_the_training_loops():
    """fit evaluates at steps 3 and 6 and at the last step 7 of a 7-step run (eval_every 3): ⌈7/3⌉."""
    from dataclasses import replace

    import torch

    from fwbench.bench.estimate import evaluations_per_run
    from fwbench.run.training import fit
    from fwbench.tasks.retrieval import RetrievalConfig

    config = replace(RetrievalConfig(setting=1, S=5, d_key=8, batch_size=4, eval_sequences=2), max_steps=7, eval_every=3)
    result = fit("retrieval", "linear", config, 1, torch.device("cpu"))
    assert [point["step"] for point in result.curve] == [3, 6, 7]
    assert evaluations_per_run(result.steps, 3) == len(result.curve) == 3
    assert (evaluations_per_run(6, 3), evaluations_per_run(100, 100), evaluations_per_run(101, 100)) == (2, 1, 2)


def test_measured_evaluation_time_is_positive_and_retrieval_has_no_final_evaluation(specs):
    from fwbench.bench.estimate import measure_eval_seconds

    eval_s, final_s = measure_eval_seconds(specs[0], repeats=1)
    assert 0 < eval_s < 5 and final_s == 0.0


def test_runs_are_scheduled_in_launch_order_on_the_first_free_worker():
    """Known run times on 2 workers: four 1 s runs then a 10 s run end at 12 s (2 + 10), not at
    core-seconds / 2 = 7 s; a sequence of grids takes the sum of their schedules; 1 worker: the sum."""
    from fwbench.bench.schedule import grids_wall_seconds, makespan
    from fwbench.errors import FwbenchError

    assert makespan([1, 1, 1, 1, 10], 2) == 12
    assert makespan([3, 3, 2, 2, 2], 2) == 7  # 3|3, 5|5, 7|5
    assert makespan([10, 1, 1, 1, 1], 2) == 10  # the long run first: the others fit beside it
    assert makespan([1, 1, 1, 1, 10], 1) == 14 and makespan([], 3) == 0
    assert grids_wall_seconds([[1, 1, 1, 1, 10], [4, 4]], 2) == 16
    # more workers than runs: the longest run (a --jobs of 10**20 once asked for 10**20 free times)
    assert makespan([1, 1, 1, 1, 10], 10**20) == 10 and makespan([], 10**20) == 0
    assert makespan((t for t in [2, 3]), 5) == 3  # a generator is read once
    with pytest.raises(FwbenchError, match="--jobs: got 0; expected a positive integer"):
        makespan([1.0], 0)


#: dpfp ν=1 and linear at S=20, lr 1e-3, seeds 1 and 2, up to 1000 steps
AGAINST_GRID = GRID.replace("S = [20, 40, 7]", "S = 20").replace("lr = [1e-3, 3e-4]", "lr = 1e-3").replace(
    "max_steps = 150", "max_steps = 1000")


def test_against_prints_predicted_beside_measured_with_exact_ratios(tmp_path, monkeypatch, capsys):
    """Predicted (fake timers, 0.01 s a step, 0.5 s an evaluation every 100 steps): dpfp ν=1 S=20
    stops at the official step 100 (1 + 0.5 = 1.5 s a run), linear S=20 at step 800 (8 + 4 = 12 s).
    The store: dpfp seeds 1, 2 and linear seed 1 measured at twice their predicted wall_s and the
    official steps, linear seed 2 failed (left out of both sides): core 15 s predicted, 30 s measured
    (ratio 2.00, steps ratio 1.00, s/step ratio 2.00); in training steps (steps / steps_per_s) 2 + 2 + 20
    s against 1 + 1 + 8 predicted (2.40 per step), outside them 5 of 15 s predicted, 6 of 30 measured;
    schedule on 2 workers in grid order (1.5 | 1.5, then 12): 13.5 s predicted; first start → last end
    54 s measured: ratio 4.00."""
    import json

    import fwbench.bench.estimate_command as command

    monkeypatch.setattr(command, "measure_step_seconds", lambda spec, steps: 0.01)
    monkeypatch.setattr(command, "measure_eval_seconds", lambda spec: (0.5, 0.0))
    path = tmp_path / "grid.toml"
    path.write_text(AGAINST_GRID)
    specs = expand(load_grid(path), "quick")
    results = tmp_path / "results"
    results.mkdir()
    measured = [(specs[0], 100, 3.0, 50.0, "00:00:00", "00:00:03"), (specs[1], 100, 3.0, 50.0, "00:00:00", "00:00:03"),
                (specs[2], 800, 24.0, 40.0, "00:00:03", "00:00:54")]
    lines = [{"run_id": spec.run_id, "status": "plateau", "steps": steps, "wall_s": wall, "steps_per_s": rate,
              "started_at": f"2026-11-30T{start}+00:00", "ended_at": f"2026-11-30T{end}+00:00"}
             for spec, steps, wall, rate, start, end in measured]
    lines.append({"run_id": specs[3].run_id, "status": "failed", "steps": 0, "wall_s": 0.0})
    (results / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [(s.variant, s.seed) for s in specs] == [("dpfp:nu=1", 1), ("dpfp:nu=1", 2), ("linear", 1), ("linear", 2)]
    assert main(["estimate", str(path), "--profile", "quick", "--jobs", "2", "--against", str(results)]) == 0
    out = capsys.readouterr().out
    row = "3 of 4 | 0.00 | 0.01 | 2.00 | 1.00 | 2.00 | 2.40 | 33.3% / 20.0% | 0.2 min | 0.9 min | 4.00 |"
    assert f"| estimate-tiny | {row}" in out and f"| total | {row}" in out
    assert "| estimate-tiny | linear | setting=1, S=20, lr=0.001 | 1 | 800 | 800 | 0.0150 | 0.0300 | 12 | 24 | 2.00 |" in out
    # the whole grid: 27 s on one core; on 2 workers 1.5 | 1.5, then 13.5 | 13.5
    assert "wall 0.5 min on one core, 0.2 min with --jobs 2" in out
    from fwbench.bench.estimate import estimate
    from fwbench.bench.estimate_against import compare

    cells = estimate(specs, lambda spec: 0.01, eval_timer=lambda spec: (0.5, 0.0))
    records = {line["run_id"]: line for line in lines}
    part = compare("g", specs, cells, records, jobs=2)
    assert (part.predicted_core_s, part.measured_core_s, part.predicted_wall_s, part.measured_wall_s) == (
        pytest.approx(15.0), 30.0, pytest.approx(13.5), 54.0)
    assert (part.core_ratio, part.wall_ratio, part.steps_ratio) == (pytest.approx(2.0), pytest.approx(4.0), 1.0)
    assert (part.predicted_train_s, part.measured_train_s) == (pytest.approx(10.0), pytest.approx(24.0))


def test_against_a_directory_without_records_fails_in_one_line_before_any_timing(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text(AGAINST_GRID)
    assert main(["estimate", str(path), "--profile", "quick", "--against", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "--against: no records file" in err and "measured" not in err


def test_the_final_evaluation_is_timed_only_for_a_model_that_evaluates_finite(specs, monkeypatch):
    """A model whose evaluation loss is non-finite from the start (an unnormalised rule) trains into a
    diverged run, which fit gives no final evaluation: timed 0.0; a finite one's final evaluation is
    timed once."""
    from fwbench.bench.estimate import measure_eval_seconds
    from fwbench.tasks import TASKS

    task = TASKS[specs[0].task]
    finals = []
    monkeypatch.setattr(task, "final_evaluation", lambda *args: finals.append(args), raising=False)
    monkeypatch.setattr(task, "evaluate", lambda *args: {"loss": float("nan")})
    assert measure_eval_seconds(specs[0], repeats=1)[1] == 0.0 and finals == []
    monkeypatch.setattr(task, "evaluate", lambda *args: {"loss": 0.5})
    eval_s, _ = measure_eval_seconds(specs[0], repeats=2)
    assert len(finals) == 1 and eval_s >= 0.0


def test_against_leaves_out_and_names_a_record_it_cannot_sum(tmp_path, monkeypatch, capsys):
    """A record holding ``wall_s`` as "3" (a hand-edited line) made ``--against`` a TypeError traceback,
    one without ``started_at`` a KeyError, one whose ``ended_at`` is no timestamp a ValueError. The first is
    left out and named; the others are summed, with the measured wall n/a (a window from some runs' times
    alone would understate it)."""
    import json

    import fwbench.bench.estimate_command as command

    monkeypatch.setattr(command, "measure_step_seconds", lambda spec, steps: 0.01)
    monkeypatch.setattr(command, "measure_eval_seconds", lambda spec: (0.5, 0.0))
    path = tmp_path / "grid.toml"
    path.write_text(AGAINST_GRID)
    specs = expand(load_grid(path), "quick")
    results = tmp_path / "results"
    results.mkdir()
    lines = [{"run_id": spec.run_id, "status": "plateau", "steps": 100, "wall_s": 3.0, "steps_per_s": 50.0,
              "started_at": "2026-11-30T00:00:00+00:00", "ended_at": "2026-11-30T00:00:03+00:00"} for spec in specs]
    lines[0]["wall_s"] = "3"
    del lines[1]["started_at"]
    (results / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["estimate", str(path), "--profile", "quick", "--against", str(results)]) == 0
    out, err = capsys.readouterr()
    assert (f"fwbench: warning: {results / 'runs.jsonl'}: record {specs[0].run_id!r} left out of the comparison "
            "(missing or mistyped: wall_s)") in err
    assert "| total | 3 of 4 |" in out and "| n/a (a record without its start or end) | nan |" in out
    lines[1]["started_at"] = "2026-11-30T00:00:00+00:00"
    lines[2]["ended_at"] = "yesterday"
    (results / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["estimate", str(path), "--profile", "quick", "--against", str(results)]) == 0
    assert "| total | 3 of 4 |" in (out := capsys.readouterr().out) and "n/a (a record without its start or end)" in out
    lines[2]["ended_at"] = "2026-11-30T00:00:03+00:00"
    (results / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["estimate", str(path), "--profile", "quick", "--against", str(results)]) == 0
    assert "| total | 3 of 4 |" in (out := capsys.readouterr().out) and "| 0.1 min |" in out


@pytest.mark.parametrize("field", ["steps", "wall_s"])
def test_against_sums_integers_whose_sum_is_beyond_a_float(tmp_path, monkeypatch, capsys, field):
    """Break-it finding (h-breakA): each record's steps (or wall_s) an integer of 308 digits, within a float's range
    (so the record was read), but their sum not: the ratios raised OverflowError (int too large to convert to float),
    a traceback. They are summed as floats, as a wall_s written 8e307 was: the comparison is printed."""
    import json

    import fwbench.bench.estimate_command as command

    monkeypatch.setattr(command, "measure_step_seconds", lambda spec, steps: 0.01)
    monkeypatch.setattr(command, "measure_eval_seconds", lambda spec: (0.5, 0.0))
    path = tmp_path / "grid.toml"
    path.write_text(AGAINST_GRID)
    results = tmp_path / "results"
    results.mkdir()
    lines = [{"run_id": spec.run_id, "status": "plateau", "steps": 100, "wall_s": 3.0, "steps_per_s": 50.0,
              "started_at": "2026-11-30T00:00:00+00:00", "ended_at": "2026-11-30T00:00:03+00:00", field: 8 * 10**307}
             for spec in expand(load_grid(path), "quick")]
    (results / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["estimate", str(path), "--profile", "quick", "--against", str(results)]) == 0
    assert "| total | 4 of 4 |" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["directory", "link looping back"])
def test_against_a_records_file_it_cannot_read_is_named_as_it_is_before_any_timing(tmp_path, capsys, kind):
    """Break-it finding (h-breakC): --against R whose runs.jsonl is a directory, or a link looping back to itself, was
    told "no records file 'R/runs.jsonl'" (the file is there, unreadable); it is named as ResultsStore.load names it,
    under --against, before any step is timed."""
    path = tmp_path / "grid.toml"
    path.write_text(AGAINST_GRID)
    records = tmp_path / "results" / "runs.jsonl"
    if kind == "directory":
        records.mkdir(parents=True)
    else:
        records.parent.mkdir()
        records.symlink_to("runs.jsonl")
    why, remedy = (("Is a directory", "move the directory or file away") if kind == "directory" else
                   ("Too many levels of symbolic links", "remove the link or point it at the records file"))
    assert main(["estimate", str(path), "--profile", "quick", "--against", str(records.parent)]) == 2
    assert capsys.readouterr().err == (f"fwbench: error: --against: cannot read {str(records)!r}: {why}; expected a "
                                       f"file of records, one JSON line each ({remedy})\n")


def test_against_a_directory_holding_a_newline_is_named_on_the_headings_one_line(tmp_path, monkeypatch, capsys):
    """Break-it finding (h-breakC): --against $'R\\nnew' ended the comparison's heading there
    ('### Predicted vs measured (R' / 'new; ratio = ...)'); it is written escaped, as C205's places are."""
    import json

    import fwbench.bench.estimate_command as command

    monkeypatch.setattr(command, "measure_step_seconds", lambda spec, steps: 0.01)
    monkeypatch.setattr(command, "measure_eval_seconds", lambda spec: (0.5, 0.0))
    path = tmp_path / "grid.toml"
    path.write_text(AGAINST_GRID)
    results = tmp_path / "R\nnew"
    results.mkdir()
    lines = [{"run_id": spec.run_id, "status": "plateau", "steps": 100, "wall_s": 3.0}
             for spec in expand(load_grid(path), "quick")]
    (results / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["estimate", str(path), "--profile", "quick", "--against", str(results)]) == 0
    assert f"### Predicted vs measured ({tmp_path}/R\\nnew; ratio = measured / predicted)" in capsys.readouterr().out
