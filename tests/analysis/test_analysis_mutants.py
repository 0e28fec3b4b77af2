"""Values of the analysis modules checked one by one (issue 14 item 14: surviving mutants of
``fwbench/analysis/capacity.py`` that the value tests of ``test_capacity_values.py`` leave alive)."""

from __future__ import annotations

import csv

import pandas as pd

from fwbench.analysis.capacity import CAPACITY_COLUMNS, write_capacity_csv


def test_the_capacity_csv_is_written_into_new_nested_folders_and_rewritten_in_place(tmp_path):
    """Two missing folder levels are made; a second write into the existing folder replaces the
    file; floats keep 4 significant digits, exponents in lower case (``%.4g``)."""
    path = tmp_path / "reports" / "capacity" / "capacity.csv"
    write_capacity_csv(pd.DataFrame({"variant": ["linear"], "capacity_mean": [123456.0]}), path)
    write_capacity_csv(pd.DataFrame({"variant": ["softmax"], "capacity_mean": [654321.0]}), path)
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == CAPACITY_COLUMNS
    assert [(row["variant"], row["capacity_mean"]) for row in rows] == [("softmax", "6.543e+05")]
