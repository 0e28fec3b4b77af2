"""The console's verdict line after ``fwbench report`` / ``reproduce``: a new user read only the console
("report written to reports/REPORT.md") and had to open the report to learn that no claim was decided
(new-user run of 7 December)."""

from __future__ import annotations

import re

from test_overflowed_perplexity import overflowed_lm_record

from fwbench.analysis.verdicts import FAIL, INDICATIVE, NOT_RUN, PASS, ClaimResult
from fwbench.cli import main
from fwbench.report.render import verdict_summary
from fwbench.run.store import ResultsStore


def claim(verdict: str, leaning: str = "") -> ClaimResult:
    return ClaimResult("C0", "a claim", "paper", "measured", verdict, leaning=leaning)


def test_the_summary_counts_each_verdict_and_the_leanings_of_the_indicative_ones():
    claims = [claim(PASS, PASS), claim(FAIL, FAIL), claim(FAIL, FAIL), claim(INDICATIVE, PASS), claim(INDICATIVE, PASS),
              claim(INDICATIVE, FAIL), claim(INDICATIVE), claim(NOT_RUN)]
    assert verdict_summary(claims) == (
        "8 claims: 1 PASS, 2 FAIL, 4 INDICATIVE (2 leaning PASS, 1 leaning FAIL, 1 undecided), 1 NOT RUN")
    assert verdict_summary([claim(PASS, PASS)]) == "1 claims: 1 PASS, 0 FAIL, 0 INDICATIVE, 0 NOT RUN"


def test_fwbench_report_prints_the_counts_of_the_tables_verdict_column(tmp_path, capsys):
    store = ResultsStore(tmp_path / "results")
    for variant in ("linear", "linear-delta"):
        store.append(overflowed_lm_record(variant))
    store.close()
    assert main(["report", "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if " claims: " in line)
    table = (tmp_path / "out" / "REPORT.md").read_text().split("## Claims")[1].split("\n## ")[0]
    verdicts = re.findall(r"\| \*\*(PASS|FAIL|INDICATIVE|NOT RUN)\*\*", table)
    assert line.startswith(f"{len(verdicts)} claims: {verdicts.count(PASS)} PASS, {verdicts.count(FAIL)} FAIL, "
                           f"{verdicts.count(INDICATIVE)} INDICATIVE")
    assert line.endswith(f"{verdicts.count(NOT_RUN)} NOT RUN") and verdicts.count(NOT_RUN) > 0
