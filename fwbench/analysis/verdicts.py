"""The vocabulary of the claims table: a verdict, the evidence behind it, and one row (:class:`ClaimResult`).

Shared by the synthetic claims (:mod:`fwbench.analysis.claims`, :mod:`fwbench.analysis.claims_setting2`)
and the language-model claims (:mod:`fwbench.analysis.claims_lm`), so none imports another for it.

Evidence levels: each claim states a minimum of evidence (seeds, the S range or variants it names,
runs that finished, an LM budget beyond smoke). A criterion applied to the records gives a *leaning*
(PASS, FAIL, or none when the intervals do not separate the cases); the verdict is the leaning only
when nothing of the minimum is missing, otherwise **INDICATIVE** with what is missing, or **NOT RUN**
when the records hold none of the cells the claim reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PASS, FAIL, INDICATIVE, NOT_RUN = "PASS", "FAIL", "INDICATIVE", "NOT RUN"
#: Seeds every deciding cell needs before a verdict can be PASS or FAIL.
MIN_SEEDS = 3


@dataclass(frozen=True)
class ClaimResult:
    """One row of the claims table.

    ``leaning`` is what the criterion says on the evidence at hand (PASS, FAIL or "" when undecided),
    ``evidence`` what the verdict rests on or what it lacks ("missing: 1 seed; S ≤ 80 of 200"),
    ``reference`` where the paper makes the claim.
    """

    id: str
    claim: str
    paper: str
    measured: str
    verdict: str
    evidence: str = ""
    reference: str = ""
    leaning: str = ""


def leaning_note(result: ClaimResult) -> str:
    """" (leans PASS)" / " (leans FAIL)" after an INDICATIVE verdict whose criterion leans on the
    evidence at hand, else "": what the report's verdict column and ``fwbench capacity`` print after
    the verdict (a PASS or FAIL verdict is its leaning already)."""
    return f" (leans {result.leaning})" if result.verdict == INDICATIVE and result.leaning else ""


def lean(checks: Sequence[bool | None]) -> str | None:
    """PASS if every check holds, FAIL if any certainly fails, None (undecided) otherwise or when empty."""
    known = [None if c is None else bool(c) for c in checks]  # numpy booleans are not True / False
    if any(c is False for c in known):
        return FAIL
    if known and all(c is True for c in known):
        return PASS
    return None


def judge(id: str, claim: str, paper: str, measured: str, leaning: str | None, missing: Sequence[str],
          minimum: str, reference: str) -> ClaimResult:
    """The row for a claim whose criterion leans ``leaning`` (PASS / FAIL / None) on evidence lacking
    ``missing`` against the stated ``minimum``: the leaning when nothing is missing, else INDICATIVE."""
    gaps = list(dict.fromkeys(m for m in missing if m))
    if leaning not in (PASS, FAIL):
        gaps.append("the intervals do not separate the cases")
    verdict = leaning if not gaps else INDICATIVE
    evidence = f"minimum: {minimum}; " + ("met" if not gaps else "missing: " + "; ".join(gaps))
    return ClaimResult(id, claim, paper, measured, verdict, evidence, reference, leaning or "")


def not_run(id: str, claim: str, paper: str, needs: str, minimum: str, reference: str) -> ClaimResult:
    """The row for a claim none of whose cells are in the records."""
    return ClaimResult(id, claim, paper, needs, NOT_RUN, f"minimum: {minimum}; nothing run", reference)
