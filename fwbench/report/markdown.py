"""Markdown building blocks shared by every report section."""

from __future__ import annotations

import pandas as pd


def _cell(value: object) -> str:
    # a '|' inside a cell (a registered variant's name, a claim's text) would split it into two
    # columns and shift every cell after it; a line break would end the row
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of ``frame`` (index dropped); ``|`` and line breaks inside a
    cell are escaped, so every row keeps the header's columns."""
    header = "| " + " | ".join(_cell(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])
