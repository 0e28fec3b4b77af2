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
