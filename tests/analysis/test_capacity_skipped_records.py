"""``fwbench capacity`` on a store where every record of the grid's runs is skipped as no run record (a
hand-edited line): the runs are not retrained (their run ids are stored), and the command ended with
"no fast-weight runs to estimate a capacity from", as if the grid had no fast-weight variant; it now says
how many of its runs were skipped and how to retrain them."""

from __future__ import annotations

import json

from fwbench.cli import main

GRID = """\
name = "cap"
task = "retrieval"
[defaults]
setting = 1
eval_every = 2
eval_sequences = 2
batch_size = 2
max_steps = 2
d_key = 4
[profiles.quick]
variant = "linear"
S = [3, 4]
seed = 1
"""


def test_capacity_names_the_skipped_records_of_its_runs(tmp_path, capsys):
    grid, results, out = tmp_path / "g.toml", tmp_path / "r", tmp_path / "out"
    grid.write_text(GRID)
    assert main(["capacity", "--grid", str(grid), "--results-dir", str(results), "--out", str(out)]) == 0
    store = results / "runs.jsonl"
    records = [json.loads(line) for line in store.read_text().splitlines()]
    assert len(records) == 2
    store.write_text("".join(json.dumps({**r, "config": {**r["config"], "S": str(r["config"]["S"])}}) + "\n"
                             for r in records))
    capsys.readouterr()
    assert main(["capacity", "--grid", str(grid), "--results-dir", str(results), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("skipped: no run record (missing or mistyped: config.S)") == 2
    assert err.splitlines()[-1] == (
        "fwbench: error: grid cap: no fast-weight runs to estimate a capacity from (2 of its runs have a record "
        "skipped as no run record, named above; delete those lines from the store to retrain them)")
    assert len(store.read_text().splitlines()) == 2  # nothing retrained
