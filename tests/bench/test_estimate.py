"""``fwbench estimate`` (issue 16 item 1): steps per run from the official logs (capped by
max_steps) when the cell has the official run's lr and batch size, or the cap, times a step time
measured once per step shape, summed into core-hours. The arithmetic is checked with a fake step
timer; one real measurement checks the timer."""

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
    cells = estimate(specs, fake_timer(calls))
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
    cells = estimate(expand(load_grid(path), "quick"), lambda spec: 0.01)
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

    cells = estimate(specs, timer)
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
