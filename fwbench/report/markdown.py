"""Markdown building blocks shared by every report section."""

from __future__ import annotations

import pandas as pd

from fwbench.bench.summary import markdown_cell


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of ``frame`` (index dropped); ``|`` and line breaks inside a
    cell are escaped, so every row keeps the header's columns."""
    header = "| " + " | ".join(markdown_cell(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(markdown_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])
