"""Markdown building blocks shared by every report section."""

from __future__ import annotations

import pandas as pd


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of ``frame`` (index dropped)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])
