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
- ``status``: a diverged run has no measured perplexity; when a learning rate is chosen, a rate whose
  runs failed (diverged or unmeasured) on more of its seeds loses to one with fewer, and a rate none of
  whose runs was measured is never named best.
"""

from __future__ import annotations

import math

import pandas as pd


def _loss(rows: pd.DataFrame, metric: str) -> pd.Series:
    """ln(perplexity) per run (nats per character), NaN for a diverged or unmeasured run."""
    values = rows[metric] if metric in rows else pd.Series(math.nan, index=rows.index)
    loss = values.astype(float).map(lambda p: math.log(p) if p > 0 else math.nan)
    return loss.where(rows["status"] != "diverged", math.nan)


def _learning_rates(rows: pd.DataFrame) -> pd.Series:
    return rows["lr"].astype(float) if "lr" in rows else pd.Series(math.nan, index=rows.index)


def rate_table(rows: pd.DataFrame, metric: str = "val_ppl") -> pd.DataFrame:
    """Per (variant, lr): ``runs``, ``failed`` (diverged or without ``metric``), ``failed_share`` and
    ``mean_loss`` (seed-mean ln(``metric``) over the measured runs; NaN when none was measured)."""
    loss = _loss(rows, metric)
    table = pd.DataFrame({"variant": rows["variant"], "lr": _learning_rates(rows), "loss": loss,
                          "failed": loss.isna()})
    grouped = table.groupby(["variant", "lr"], dropna=False)
    out = pd.DataFrame({"runs": grouped.size(), "failed": grouped["failed"].sum().astype(int),
                        "mean_loss": grouped["loss"].mean()}).reset_index()
    out["failed_share"] = out["failed"] / out["runs"]
    return out


def best_learning_rates(rows: pd.DataFrame, metric: str = "val_ppl") -> dict[str, float]:
    """Per variant, its best learning rate among the rates with a measured run: the fewest failed runs
    (diverged or unmeasured; share of the rate's seeds), then the lowest seed-mean ln(``metric``) of
    the measured ones. A rate that failed on any seed thus loses to one that failed on none, and a
    variant none of whose runs was measured has no best rate (it is absent)."""
    table = rate_table(rows, metric)
    measured = table[table["mean_loss"].notna()].sort_values(["failed_share", "mean_loss"], kind="stable")
    best = measured.groupby("variant", sort=False).head(1)
    return dict(zip(best["variant"], best["lr"], strict=True))


def at_best_learning_rate(rows: pd.DataFrame, metric: str = "val_ppl") -> pd.DataFrame:
    """The rows of each variant's best learning rate (:func:`best_learning_rates`); for a variant whose
    every run failed (no best rate), all its rows, so that every one of its failures is counted."""
    chosen = best_learning_rates(rows, metric)
    keep = [v not in chosen or r == chosen[v] or (math.isnan(r) and math.isnan(chosen[v]))
            for v, r in zip(rows["variant"], _learning_rates(rows), strict=True)]
    return rows[keep]


def _rate_choices(rows: pd.DataFrame, metric: str) -> dict[str, tuple[float | None, str]]:
    """Per variant: (the rate it is read at, or None when none has a measured run; a note: "edge of the
    sweep" when it is the smallest or largest rate the variant tried, "the only lr run", or "")."""
    table = rate_table(rows, metric)
    best = best_learning_rates(rows, metric)
    choices = {}
    for variant, tried in table.groupby("variant")["lr"]:
        if variant not in best:
            choices[variant] = (None, "")
        elif tried.nunique() == 1:
            choices[variant] = (best[variant], "the only lr run")
        else:
            choices[variant] = (best[variant], "edge of the sweep" if best[variant] in (tried.min(), tried.max())
                                else "")
    return choices


def _one_rate(rows: pd.DataFrame) -> float | None:
    """The single learning rate every run used, None when the runs swept several; NaN without lr."""
    rates = _learning_rates(rows)
    if rates.isna().all():
        return math.nan
    return float(rates.dropna().iloc[0]) if rates.nunique() == 1 else None


def rate_labels(rows: pd.DataFrame, metric: str = "val_ppl") -> dict[str, str]:
    """Per variant, the learning rate it is read at, as a label to print beside its perplexity:
    "lr 0.012", "lr 0.012, edge of the sweep" (the sweep does not bracket the optimum), "lr 0.006, the
    only lr run", or "no lr with a measured run" (every run diverged or unmeasured). Empty when the
    records carry no learning rate or every run used one and the same rate (nothing was chosen)."""
    if _one_rate(rows) is not None:
        return {}
    return {variant: "no lr with a measured run" if rate is None else f"lr {rate:g}" + (f", {note}" if note else "")
            for variant, (rate, note) in _rate_choices(rows, metric).items()}


def describe_learning_rates(rows: pd.DataFrame, metric: str = "val_ppl") -> str:
    """Which learning rate each variant is read at, in words.

    "lr 0.006 for every variant (one rate, no sweep)" when all ran the same single rate; otherwise
    "best lr per variant among measured runs: linear 0.012 (edge of the sweep), softmax 0.006 (the only
    lr run), linear-delta-unnorm none (every run diverged or unmeasured)". "" when the records carry no
    learning rate.
    """
    one = _one_rate(rows)
    if one is not None:
        return "" if math.isnan(one) else f"lr {one:g} for every variant (one rate, no sweep)"
    parts = [f"{variant} none (every run diverged or unmeasured)" if rate is None
             else f"{variant} {rate:g}" + (f" ({note})" if note else "")
             for variant, (rate, note) in _rate_choices(rows, metric).items()]
    return "best lr per variant among measured runs: " + ", ".join(parts)


def carried_ratio(rows: pd.DataFrame, multiple: int = 16) -> pd.Series:
    """Per variant, the seed mean of carried ppl at ``multiple``× ÷ at 1× the training length (C10);
    runs without the carried-length evaluation are left out."""
    column = f"carried_ppl_{multiple}x"
    if column not in rows or "carried_ppl_1x" not in rows:
        return pd.Series(dtype=float)
    measured = rows[rows[column].notna() & rows["carried_ppl_1x"].notna() & (rows["status"] != "diverged")]
    return (measured[column] / measured["carried_ppl_1x"]).groupby(measured["variant"]).mean()
