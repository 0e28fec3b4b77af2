"""The vocabulary of the claims table: a verdict and one row (:class:`ClaimResult`).

Shared by the synthetic claims (:mod:`fwbench.analysis.claims`) and the language-model claims
(:mod:`fwbench.analysis.claims_lm`), so neither imports the other's module for it.
"""

from __future__ import annotations

from dataclasses import dataclass

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "NOT RUN"


@dataclass(frozen=True)
class ClaimResult:
    """One row of the claims table."""

    id: str
    claim: str
    paper: str
    measured: str
    verdict: str
