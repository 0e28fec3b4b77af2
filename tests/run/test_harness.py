"""The harness as a user meets it: grids, the results store, resuming, the CLI and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from fwbench.cli import main
from fwbench.errors import FwbenchError
from fwbench.run.grid import expand, load_grid
from fwbench.run.store import ResultsStore

TINY_GRID = """
name = "tiny"
task = "retrieval"

[defaults]
setting = 1
eval_every = 5
eval_sequences = 4
batch_size = 8
max_steps = 10
d_key = 8

[profiles.quick]
variant = ["linear", "dpfp-delta:nu=1"]
S = [4, 6]
seed = [1]
"""


@pytest.fixture
def tiny_grid(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_GRID)
    return path


def write_grid(tmp_path, text: str):
    path = tmp_path / "grid.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_bundled_capacity_grid_expands_to_the_product_of_its_axes():
    grid = load_grid("capacity")
    specs = expand(grid, "quick")
    assert len(specs) == 5 * 4 + 1  # variants × S values × 1 seed, and the block of FAVOR+ m=128 at S=20
    assert len({s.run_id for s in specs}) == len(specs)
    assert {s.config["S"] for s in specs} == {20, 40, 80, 160}


def test_run_id_depends_on_config_not_on_grid_name(tiny_grid, tmp_path):
    a = expand(load_grid(tiny_grid), "quick")
    renamed = tmp_path / "other.toml"
    renamed.write_text(TINY_GRID.replace('name = "tiny"', 'name = "other"'))
    b = expand(load_grid(renamed), "quick")
    assert [s.run_id for s in a] == [s.run_id for s in b]
    assert a[0].run_id != expand(load_grid(tiny_grid), "quick", seeds=[2])[0].run_id


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nSS = 4\n', "unknown key 'SS'"),
        ('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nS = "four"\n', "S: got 'four'"),
        ('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nS = []\n', "empty list"),
        ('task = "retrieval"\n[profiles.quick]\nvariant = "dpfp:nu=0"\nseed = 1\n', "positive integer"),
        ('task = "retrieval"\n[profiles.quick]\nvariant = "lineer"\nseed = 1\n', "one of softmax"),
        ('task = "sorting"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n', "task: got 'sorting'"),
        ('task = "retrieval"\n[profiles.quick\n', "malformed TOML"),
        ('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\n', "missing key 'seed'"),
        ('task = "retrieval"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nsetting = 3\n', "setting: got 3"),
    ],
)
def test_malformed_grid_is_one_clear_error(tmp_path, text, expected):
    with pytest.raises(FwbenchError, match=expected):
        load_grid(write_grid(tmp_path, text))


def test_unknown_profile_lists_the_profiles(tiny_grid):
    with pytest.raises(FwbenchError, match="has quick"):
        expand(load_grid(tiny_grid), "huge")


def test_store_skips_a_corrupt_line_and_reports_its_number(tmp_path):
    store = ResultsStore(tmp_path)
    store.append({"run_id": "a", "x": 1})
    with open(store.path, "a") as handle:
        handle.write('{"run_id": "b", "x":\n')  # a line cut short by a crash
    store.append({"run_id": "c", "x": 3})
    loaded = store.load()
    assert [r["run_id"] for r in loaded.records] == ["a", "c"]
    assert loaded.problems == [f"{store.path}:2: corrupt or truncated record skipped"]


def test_a_later_record_of_a_run_replaces_its_failed_one(tmp_path):
    """A failed run is retried and its finished record appended after the failed one: the later record
    is the run's (load's docstring), so the run counts as finished and is not trained again (a planted
    'first record wins' in load passed tests/run and test_bad_input)."""
    store = ResultsStore(tmp_path)
    assert store.append({"run_id": "a", "status": "failed"})
    assert "a" not in store.finished_ids()
    assert store.append({"run_id": "a", "status": "converged"})
    assert [r["status"] for r in store.records()] == ["converged"]
    assert store.finished_ids() == {"a"}
    assert not store.append({"run_id": "a", "status": "converged"})


def test_store_skips_lines_json_cannot_read_as_corrupt(tmp_path):
    """A line of an integer past Python's 4300 digits, or of arrays nested past the recursion limit,
    is no record: skipped and reported as any corrupt line. load raised ValueError ('Exceeds the limit
    (4300 digits) ...') or RecursionError, a traceback from fwbench report and run; append's torn-tail
    check raised them too, where now such a tail is set aside."""
    store = ResultsStore(tmp_path)
    store.append({"run_id": "a", "x": 1})
    with open(store.path, "a") as handle:
        handle.write("1" * 5000 + "\n" + "[" * 100_000 + "\n")
    store.append({"run_id": "c", "x": 3})
    loaded = store.load()
    assert [r["run_id"] for r in loaded.records] == ["a", "c"]
    assert loaded.problems == [f"{store.path}:{n}: corrupt or truncated record skipped" for n in (2, 3)]
    with open(store.path, "a") as handle:
        handle.write("9" * 5000)  # a torn tail json cannot read: set aside, not a traceback
    assert store.append({"run_id": "d"})
    assert [r["run_id"] for r in store.records()] == ["a", "c", "d"]


def test_store_never_duplicates_a_run_and_mends_a_truncated_tail(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.append({"run_id": "a"})
    assert not store.append({"run_id": "a"})
    with open(store.path, "a") as handle:
        handle.write('{"run_id": "half')  # no newline: the next append must not glue onto it
    assert store.append({"run_id": "b"})
    assert [r["run_id"] for r in store.records()] == ["a", "b"]


def test_unwritable_results_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(FwbenchError, match="--results-dir"):
        ResultsStore(blocker / "results").append({"run_id": "a"})


def test_run_writes_one_record_per_cell_and_a_rerun_trains_nothing(tiny_grid, tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["run", str(tiny_grid), "--results-dir", str(results), "--quiet", "--device", "cpu"]) == 0
    records = ResultsStore(results).records()
    assert len(records) == 4
    record = records[0]
    assert record["status"] in {"converged", "plateau", "max_steps", "diverged"}
    assert record["steps"] <= 10 and record["curve"][0]["step"] == 5
    assert record["environment"]["threads"] == 1 and record["environment"]["device"] == "cpu"
    assert 0.0 <= record["metrics"]["best_eval_loss"] <= record["curve"][0]["eval_loss"] + 1e-12
    capsys.readouterr()
    assert main(["run", str(tiny_grid), "--results-dir", str(results), "--quiet"]) == 0
    assert "0 trained now, 4 already" in capsys.readouterr().out
    assert len(ResultsStore(results).records()) == 4


def test_same_config_and_seed_give_identical_records(tiny_grid, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for directory in (first, second):
        assert main(["run", str(tiny_grid), "--results-dir", str(directory), "--quiet"]) == 0
    by_id = [{r["run_id"]: (r["metrics"], r["curve"], r["steps"]) for r in ResultsStore(d).records()}
             for d in (first, second)]
    assert by_id[0] == by_id[1]


@pytest.mark.slow
def test_report_has_claims_table_and_capacity_figure(tiny_grid, tmp_path):
    results, out = tmp_path / "results", tmp_path / "reports"
    main(["run", str(tiny_grid), "--results-dir", str(results), "--quiet"])
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert "## Claims" in text and "C1:" in text and "C2:" in text
    assert "NOT RUN" in text  # the tiny grid has no softmax and a single ν
    assert (out / "capacity.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "no-such-grid"], "grid: got 'no-such-grid'"),
        (["run", "capacity", "--profile", "huge"], "--profile: got 'huge'"),
        (["run", "capacity", "--device", "tpu"], "--device: got 'tpu'"),
        (["run", "capacity", "--threads", "0"], "--threads: got 0"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fwbench: error:") and expected in err and "\n" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where CUDA is absent")
def test_cuda_requested_where_none_is_exits_2(capsys):
    assert main(["run", "capacity", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_console_command_lists_variants_with_d_dot():
    out = subprocess.run([sys.executable, "-m", "fwbench", "variants", "--d-key", "32"],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    rules = ("", "-delta", "-delta-unnorm", "-fwm")
    assert set(rows) == {"softmax", "tanh-fwm"} | {f"{m}{r}" for m in ("linear", "favor", "dpfp") for r in rules}
    assert rows["dpfp"][2] == "64" and rows["favor"][2] == "128" and rows["linear"][2] == "32"
    assert rows["tanh-fwm"][2] == "32" and rows["dpfp-fwm"][1] == "fwm"


@pytest.mark.slow
def test_console_command_grid_error_exits_2_without_traceback(tmp_path):
    bad = write_grid(tmp_path, 'task = "retrieval"\n[profiles.quick]\nvariant = "favor:m=-1"\nseed = 1\n')
    done = subprocess.run([sys.executable, "-m", "fwbench", "run", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "favor:m" in done.stderr
    json.dumps(done.stderr)


def test_report_of_a_store_whose_every_run_failed(tmp_path):
    """Runs that all failed (failed_record: metrics {}) leave no metric column in the frame; the report
    raised KeyError: 'best_eval_loss' (capacity.measured_loss), now it is written, the claims NOT RUN."""
    results, out = tmp_path / "results", tmp_path / "out"
    ResultsStore(results).append({
        "run_id": "r1", "grid": "g", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1,
        "config": {"S": 20, "setting": 1, "d_key": 8}, "status": "failed", "error": "boom",
        "metrics": {}, "curve": [], "steps": 0, "wall_s": 0.0})
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    assert "**NOT RUN**" in (out / "REPORT.md").read_text()


@pytest.mark.parametrize("line", [
    '{"run_id": "x"}',                                                             # a run id and nothing else
    '{"run_id": "x", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1, "steps": 0, "wall_s": 0.0, '
    '"config": {}, "metrics": {}}',                                                 # no status
    '{"run_id": "x", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1, "status": "failed", '
    '"steps": 0, "wall_s": 0.0, "config": [1], "metrics": {}}',                      # a config that is no object
], ids=["run id only", "no status", "config a list"])
def test_report_skips_and_names_a_record_that_is_no_run_record(line, tmp_path, capsys):
    """A JSON object with a string run_id but not the fields a run record holds (hand-edited, another
    tool's line) is skipped and named in the report's store problems, beside the run records, and a store
    of such records only is refused, the first named with its fields (C176). The report raised KeyError: 'task'
    (or 'status'; TypeError for a config that is a list), a traceback."""
    results, out = tmp_path / "results", tmp_path / "out"
    store = ResultsStore(results)
    store.append({"run_id": "r1", "grid": "g", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1,
                  "config": {"S": 20, "setting": 1, "d_key": 8}, "status": "failed", "error": "boom",
                  "metrics": {}, "curve": [], "steps": 0, "wall_s": 0.0})
    with open(store.path, "a") as handle:
        handle.write(line + "\n")
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    assert f"- {store.path}: record 'x' skipped: no run record (missing or mistyped: " in (out / "REPORT.md").read_text()
    lone = tmp_path / "lone"
    ResultsStore(lone).append(json.loads(line))
    capsys.readouterr()
    assert main(["report", "--results-dir", str(lone), "--out", str(tmp_path / "out2")]) == 2
    assert f"1 record(s) skipped as no run record, the first {lone / 'runs.jsonl'}: record 'x' (missing or mistyped: " \
        in capsys.readouterr().err
