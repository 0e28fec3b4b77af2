"""Markdown tables keep their columns whatever a cell holds."""

import pandas as pd

from fwbench.report.markdown import markdown_table


def _columns(line: str) -> int:
    # the separators GFM splits a row on: '|' not escaped by a backslash
    count, escaped = 0, False
    for char in line:
        if char == "|" and not escaped:
            count += 1
        escaped = char == "\\" and not escaped
    return count - 1


def test_pipes_and_line_breaks_stay_inside_their_cell():
    frame = pd.DataFrame({"variant": ["my|variant", "x\\|y", "two\nlines"], "loss | nats": [0.5, 1.0, 2.0]})
    lines = markdown_table(frame).splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per row: the line break did not end a row
    assert [_columns(line) for line in lines] == [2] * 5
    assert lines[0] == "| variant | loss \\| nats |"
    assert lines[2] == "| my\\|variant | 0.5 |"
    assert lines[3] == "| x\\\\\\|y | 1.0 |"  # the cell's own backslash cannot unescape the pipe after it
    assert lines[4] == "| two<br>lines | 2.0 |"


def test_plain_cells_are_unchanged():
    frame = pd.DataFrame({"a": ["dpfp:nu=1", "**INDICATIVE** (leans PASS)"], "b": [1, 2]})
    assert markdown_table(frame) == ("| a | b |\n| --- | --- |\n| dpfp:nu=1 | 1 |\n"
                                     "| **INDICATIVE** (leans PASS) | 2 |")


def _bench_record(variant: str, form: str, mode: str) -> dict:
    # the fields of a `fwbench bench` record that the report's bench section reads
    return {"kind": "bench", "session": "s1", "status": "ok", "device": "cpu", "dtype": "float32", "B": 2, "H": 8,
            "T": 16, "d_head": 64, "d_dot": 64, "chunk_size": 32, "rule": "sum", "variant": variant, "form": form,
            "mode": mode, "median_s": 0.0004, "min_s": 0.0004, "peak_mem_bytes": 806912, "repeats": 2,
            "finished_at": "2026-12-06T07:46:39+00:00", "run_id": f"{variant}-{form}-{mode}"}


def test_the_bench_sections_tables_keep_their_columns_for_a_variant_named_with_a_pipe(tmp_path):
    """The report's speed tables were written by a Markdown helper of their own that escaped nothing:
    `fwbench bench --variant-module m.py --variants 'my|map' linear --lengths 16` then `fwbench report`
    gave the row '| my|map | chunk | 0.4 [1] |', 4 columns under a 3-column header."""
    import json

    from fwbench.bench.suite import BENCH_RECORDS, FORWARD
    from fwbench.report.bench_section import section_bench

    records = [_bench_record(v, "chunk", FORWARD) for v in ("my|map", "linear")]
    (tmp_path / BENCH_RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
    frame = pd.DataFrame()
    frame.attrs["results_dir"] = str(tmp_path)
    table = [line for line in section_bench(frame, tmp_path).splitlines() if line.startswith("|")]
    assert table[0] == "| variant | form | T=16 |"
    assert "| my\\|map | chunk | 0.4 [1] |" in table
    assert [_columns(line) for line in table] == [3] * len(table)


def test_estimate_tables_keep_their_columns_for_a_variant_or_grid_named_with_a_pipe():
    """`fwbench estimate` prints Markdown tables built line by line: a grid's registered variant
    'my|map' (or a grid named 'a|b', in the comparison with --against) split its row the same way."""
    from fwbench.bench.estimate import CellEstimate, format_estimate
    from fwbench.bench.estimate_against import format_cells
    from fwbench.run.grid import RunSpec

    cell = CellEstimate("my|map", {"setting": 1, "S": 20}, 1, 10, "official", 0.5)
    rows = [line for line in format_estimate([cell], "t").splitlines() if line.startswith("| my")]
    assert rows and rows[0].startswith("| my\\|map | setting=1, S=20 | 1 | 10 |")
    assert _columns(rows[0]) == 9

    spec = RunSpec("a|b", "retrieval", "linear", 1, {"setting": 1, "S": 20})
    record = {"steps": 10, "wall_s": 4.0, "status": "converged"}
    linear = CellEstimate("linear", {"setting": 1, "S": 20}, 1, 10, "official", 0.5)
    lines = format_cells([("a|b", [spec])], [linear], {spec.run_id: record}).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| a\\|b | linear | setting=1, S=20 | 1 |")
    assert [_columns(line) for line in lines] == [11] * 3
