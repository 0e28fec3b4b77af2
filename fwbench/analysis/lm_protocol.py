"""How the LM claims read a Tiny Shakespeare setup: each variant at its best learning rate, and the
carried-length ratio of C10. (Whether two perplexities differ beyond seed noise is decided by the
claims engine's log-space intervals, :func:`fwbench.analysis.evidence.certainly_lower`.)

Record fields this reads (one record per run; see :class:`fwbench.tasks.shakespeare.ShakespeareConfig`
and ``ShakespeareTask.final_evaluation``):

- config: ``lr`` (the learning-rate sweep: several values per variant, the same budget for all),
  ``seed``, ``train_segments`` and ``truncated_bptt`` (carried-state training), ``context``;
- metrics: ``val_loss`` / ``val_ppl`` (independent segments, the whole validation split),
  ``sliding_ppl`` (sliding-window evaluation, when ``sliding_stride`` > 0), and
  ``carried_ppl_1x`` / ``carried_ppl_4x`` / ``carried_ppl_16x`` (state carried over 1×, 4× and 16× the
  length carried in training, the same characters at every length);
- ``status``: a diverged run has no measured perplexity and counts as infinitely bad when a learning
  rate is chosen (a rate that diverges on any seed is never the best).
"""

from __future__ import annotations

import math

import pandas as pd


def _loss(rows: pd.DataFrame, metric: str) -> pd.Series:
    """ln(perplexity) per run (nats per character), +inf for a diverged or unmeasured run."""
    values = rows[metric] if metric in rows else pd.Series(math.nan, index=rows.index)
    loss = values.astype(float).map(lambda p: math.log(p) if p > 0 else math.nan)
    return loss.where((rows["status"] != "diverged") & loss.notna(), math.inf)


def best_learning_rates(rows: pd.DataFrame, metric: str = "val_ppl") -> dict[str, float]:
    """Per variant, the learning rate with the lowest seed-mean ln(``metric``) (diverged = +inf)."""
    lr = rows["lr"] if "lr" in rows else pd.Series(math.nan, index=rows.index)
    table = pd.DataFrame({"variant": rows["variant"], "lr": lr.astype(float), "loss": _loss(rows, metric)})
    means = table.groupby(["variant", "lr"], dropna=False)["loss"].mean().reset_index()
    best = means.loc[means.groupby("variant")["loss"].idxmin()]
    return dict(zip(best["variant"], best["lr"], strict=True))


def at_best_learning_rate(rows: pd.DataFrame, metric: str = "val_ppl") -> pd.DataFrame:
    """The rows of each variant's best learning rate (:func:`best_learning_rates`)."""
    chosen = best_learning_rates(rows, metric)
    lr = rows["lr"].astype(float) if "lr" in rows else pd.Series(math.nan, index=rows.index)
    keep = [r == chosen[v] or (math.isnan(r) and math.isnan(chosen[v])) for v, r in zip(rows["variant"], lr, strict=True)]
    return rows[keep]


def carried_ratio(rows: pd.DataFrame, multiple: int = 16) -> pd.Series:
    """Per variant, the seed mean of carried ppl at ``multiple``× ÷ at 1× the training length (C10);
    runs without the carried-length evaluation are left out."""
    column = f"carried_ppl_{multiple}x"
    if column not in rows or "carried_ppl_1x" not in rows:
        return pd.Series(dtype=float)
    measured = rows[rows[column].notna() & rows["carried_ppl_1x"].notna() & (rows["status"] != "diverged")]
    return (measured[column] / measured["carried_ppl_1x"]).groupby(measured["variant"]).mean()
