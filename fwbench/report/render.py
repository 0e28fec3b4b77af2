"""Render ``reports/REPORT.md`` (Markdown + PNG figures) from the records in a results store.

The report opens with the claims table, then one section per experiment. A section is a function
``(frame, out_dir) -> markdown``; add one by listing it in ``SECTIONS``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from fwbench.analysis.capacity import (
    DIVERGENCE_POLICY,
    capacity_intervals,
    describe,
    measured_loss,
    retrieval_rows,
    write_capacity_csv,
)
from fwbench.analysis.claims import evaluate_claims, main_d_key
from fwbench.analysis.records import CAPACITY_THRESHOLD, ENVIRONMENT_COLUMNS, load_run_records, records_frame
from fwbench.analysis.reference import official_synthetic
from fwbench.analysis.statistics import CONFIDENCE, log_interval, t_interval
from fwbench.analysis.verdicts import FAIL, INDICATIVE, NOT_RUN, PASS, ClaimResult, leaning_note
from fwbench.errors import FwbenchError
from fwbench.report.bench_section import section_bench
from fwbench.report.figures import capacity_figure
from fwbench.report.interval_figures import capacity_vs_d_dot_figure, loss_vs_S_figure, mqar_figure, official_capacities
from fwbench.report.lm_section import section_shakespeare
from fwbench.report.markdown import markdown_table
from fwbench.report.setup_section import section_setup


def _loss(value: float) -> str:
    """Three significant digits: 2.8e-06 stays visible where a fixed 4 decimals would print 0.0000."""
    return f"{value:.3g}" if value >= 1e-3 else f"{value:.2e}"


def _loss_cell(ours: float | None, official: float | None) -> str:
    text = "—" if ours is None or pd.isna(ours) else _loss(ours)
    if official is not None and not pd.isna(official):
        text += f" ({_loss(official)})"
    return text


def section_capacity(frame: pd.DataFrame, out_dir: Path) -> str:
    """Setting 1: capacity figure and the best-eval-loss table, official seed-1 values beside ours."""
    rows = frame[(frame["task"] == "retrieval") & (frame.get("setting") == 1)] if not frame.empty else frame
    if rows.empty:
        return "## Setting 1: capacity\n\nNo Setting 1 runs in the store yet (`fwbench run capacity`).\n"
    rows = main_d_key(rows)  # other key sizes (the ν sweep) are in "Capacity vs d_dot"
    figure = capacity_figure(rows, 1, out_dir / "capacity.png", "Setting 1: capacity (d_key = 64)")
    official = official_synthetic()
    official = official[official["setting"] == 1].set_index(["variant", "S"])["min_eval_loss"]
    measured = rows.assign(best_eval_loss=measured_loss(rows))  # diverged runs are not measured losses
    means = measured.groupby(["S", "variant"])["best_eval_loss"].agg(lambda x: log_interval(list(x)).mean)
    means = means.unstack("variant").sort_index()
    table = pd.DataFrame({"S": means.index})
    for variant in means.columns:
        table[variant] = [_loss_cell(means.loc[s, variant], official.get((variant, s))) for s in means.index]
    table["S"] = table["S"].astype(int)  # float when the store also holds runs without an S (MQAR)
    seeds = rows.groupby("variant")["seed"].nunique().max()
    statuses = rows["status"].value_counts().to_dict()
    return "\n".join([
        "## Setting 1: capacity",
        "",
        f"Best evaluation loss ½‖v − v̂‖² against the number of unique keys S (one write per key, one "
        f"query), geometric mean over {seeds} seed(s); official seed-1 result in parentheses. A loss of 0.5 means "
        f"the memory returns nothing (v̂ = 0, v one-hot); above 0.5 it returns something farther from v than nothing, "
        f"weighted toward other keys' values (1.0 for one wrong value read whole); ≤ {CAPACITY_THRESHOLD} counts as retrieving.",
        "",
        f"![capacity]({figure.name})",
        "",
        markdown_table(table),
        "",
        f"Runs: {len(rows)} ({', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))}); "
        f"training time {rows['wall_s'].sum() / 60:.1f} min in all. {DIVERGENCE_POLICY}",
        "",
    ])


def _loss_interval_cell(rows: pd.DataFrame, official: float | None = None) -> str:
    """'0.0012 [0.0008, 0.0016]' (geometric mean and log-space interval over the measured seeds),
    'diverged @ 340' for diverged runs (not measured losses), '—' where no run measured a loss (failed
    runs), official in ()."""
    diverged = rows[rows["status"] == "diverged"]
    finite = rows[rows["status"] != "diverged"]
    parts = []
    interval = log_interval(list(finite["best_eval_loss"].astype(float)))
    # n == 0: every run of the cell failed (failed_record: no best_eval_loss), which printed 'nan [nan, nan]'
    if interval.n:
        parts.append(_loss(interval.mean) if interval.n == 1 else
                     f"{_loss(interval.mean)} [{_loss(interval.low)}, {_loss(interval.high)}]")
    if not diverged.empty:
        steps = ", ".join(str(int(s)) for s in sorted(diverged["diverged_at"].dropna()))
        parts.append(f"diverged @ {steps}")
    text = "; ".join(parts) or "—"
    if official is not None and not pd.isna(official):
        text += f" ({_loss(official)})"
    return text


def section_setting2(frame: pd.DataFrame, out_dir: Path) -> str:
    """Setting 2 (overwriting): loss vs S for the sum, delta and FWM rules with 95 % intervals."""
    rows = main_d_key(retrieval_rows(frame, 2))
    title = "## Setting 2: overwriting keys (sum vs delta vs FWM)"
    if rows.empty:
        return f"{title}\n\nNo Setting 2 runs in the store yet (`fwbench run setting2`).\n"
    figure = loss_vs_S_figure(rows, 2, out_dir / "setting2.png", "Setting 2: overwriting (train and eval on 2S)")
    official = official_synthetic()
    official = official[official["setting"] == 2].set_index(["variant", "S"])["min_eval_loss"]
    table = pd.DataFrame({"S": sorted(rows["S"].unique())})
    for variant in sorted(rows["variant"].unique()):
        table[variant] = [_loss_interval_cell(rows[(rows["variant"] == variant) & (rows["S"] == S)],
                                              official.get((variant, S))) for S in table["S"]]
    table["S"] = table["S"].astype(int)
    seeds = rows.groupby(["variant", "S"])["seed"].nunique()
    seed_text = str(seeds.min()) if seeds.min() == seeds.max() else f"{seeds.min()}–{seeds.max()}"
    diverged = rows[rows["status"] == "diverged"]
    lines = [
        title, "",
        "Keys and values drawn with replacement, sequence length 2S; the target is the value at the queried "
        "key's last occurrence. Best evaluation loss ½‖v − v̂‖², geometric mean over seeds with its 95 % "
        f"interval taken in log space when there are ≥ 2 seeds ({seed_text} seed(s) per cell here); official "
        "seed-1 result in parentheses.", "",
        "**Evaluation length differs from the official code.** We evaluate on sequences of length 2S, like "
        "training, with every key that occurs queried at its last occurrence. The official code evaluated "
        "Setting 2 on sequences of length S (fewer overwrites, an easier task), so its numbers are optimistic "
        "next to ours. Rules: `MAP` sum, `MAP-delta` delta (sum-normalised φ), `MAP-fwm` the FWM of Schlag et "
        "al. 2021 (no sum normalisation, W ← W / max(1, ‖W‖_F) after each write, layer-normed read-out, "
        "recurrent kernel only), `MAP-delta-unnorm` the delta rule without sum normalisation (the synthetic "
        "ablation; claim C7 reads language-model training, where the paper made it). "
        "The official tanh-FWM runs used lr 1e-4 and batch 128; here all rules share lr 1e-3 and batch 32, and "
        "the full profile also runs tanh-FWM at the official setup. "
        "The FWM read-out is layer-normed, so its ½‖v − v̂‖² is not bounded by 0.5.", "",
        f"![setting 2]({figure.name})", "",
        markdown_table(table), "",
    ]
    if diverged.empty:
        lines += ["Diverged runs: none.", ""]
    else:
        lines += [f"Diverged runs (non-finite loss; kept in the store and listed here). {DIVERGENCE_POLICY}", ""]
        lines += [f"- {r['variant']} S={int(r['S'])} seed {r['seed']}: diverged at step {int(r['diverged_at'])}"
                  for _, r in diverged.iterrows()]
        lines.append("")
    lines.append(f"Runs: {len(rows)}; training time {rows['wall_s'].sum() / 60:.1f} min in all.\n")
    return "\n".join(lines)


def section_capacity_vs_d_dot(frame: pd.DataFrame, out_dir: Path) -> str:
    """Capacity (with 95 % intervals over per-seed estimates) against d_dot, every Setting 1 run."""
    title = "## Capacity vs d_dot (Setting 1, DPFP ν sweep)"
    rows = retrieval_rows(frame, 1)
    rows = rows[rows["d_dot"].notna()] if not rows.empty else rows
    if rows.empty:
        return f"{title}\n\nNo Setting 1 runs of fast-weight variants yet (`fwbench capacity`).\n"
    table = capacity_intervals(rows)
    table.insert(0, "setting", 1)
    csv = write_capacity_csv(table, out_dir / "capacities.csv")
    figure = capacity_vs_d_dot_figure(table, out_dir / "capacity_vs_d_dot.png", official_capacities())
    shown = pd.DataFrame({
        "variant": table["variant"], "d_key": table["d_key"].astype(int), "d_dot": table["d_dot"].astype(int),
        "capacity (95 % CI)": [describe(r) for _, r in table.iterrows()],
        "capacity / d_dot": [f"{bound} {v:.2f}" if bound else f"{v:.2f}"  # a bound stays a bound
                             for bound, v in zip(table["bound"], table["capacity_over_d_dot"])],
        "per seed": table["per_seed"], "S grid": table["S_grid"],
    })
    return "\n".join([
        title, "",
        f"Capacity = the largest S whose best evaluation loss stays ≤ {CAPACITY_THRESHOLD}, interpolated in "
        "log-loss between grid points. It is estimated on each seed's own curve; the table gives the mean "
        f"over seeds and a {CONFIDENCE:.0%} Student-t interval (needs ≥ 2 seeds). `≥` marks a lower bound "
        "(every S of the grid retrieved), `<` an upper bound (even the smallest S failed); with one seed the "
        "grid bracket (last S that retrieved – first S that failed) is given instead. The dashed line is "
        "capacity = d_dot; hollow grey markers are the official seed-1 runs (d_key 64). "
        f"CSV: `{csv.name}`.", "",
        f"![capacity vs d_dot]({figure.name})", "",
        markdown_table(shown), "",
    ])


def section_mqar(frame: pd.DataFrame, out_dir: Path) -> str:
    """MQAR: accuracy at the query positions vs d_model, every variant, 95 % intervals."""
    title = "## Multi-query associative recall (MQAR)"
    rows = frame[frame["task"] == "mqar"] if not frame.empty else frame
    if rows.empty:
        return f"{title}\n\nNo MQAR runs in the store yet (`fwbench run mqar`).\n"
    figure = mqar_figure(rows, out_dir / "mqar.png")
    table = pd.DataFrame({"d_model": sorted(rows["d_model"].unique())})
    for variant in sorted(rows["variant"].unique()):
        cells = []
        for d_model in table["d_model"]:
            cell = rows[(rows["variant"] == variant) & (rows["d_model"] == d_model)]
            # the divergence policy: a diverged run's accuracy before it diverged is no measurement (it
            # was averaged in, a seed at 0.95 lifting two at 0.2-0.3 to 0.483); left out, counted
            diverged = cell["status"] == "diverged"
            interval = t_interval(list(cell.loc[~diverged, "best_eval_accuracy"].astype(float)))
            text = "—" if interval.n == 0 else f"{interval.mean:.3f}" + (
                f" [{interval.low:.3f}, {interval.high:.3f}]" if interval.n > 1 else "")
            if diverged.any():
                text += f" ({int(diverged.sum())} diverged)"
            cells.append(text)
        table[variant] = cells
    table["d_model"] = table["d_model"].astype(int)
    first = rows.iloc[0]
    return "\n".join([
        title, "",
        f"Zoology's generator: {int(first['num_kv_pairs'])} key-value pairs at the start of each "
        f"{int(first['seq_len'])}-token sequence (keys and values from disjoint halves of a "
        f"{int(first['vocab_size'])}-token vocabulary), each key queried once later at a power-law-distributed "
        f"gap (a = {first['power_a']}); loss and accuracy only at the query positions. Model: embedding, "
        f"{int(first['n_layers'])} block(s) of token shift + attention variant ({int(first['n_heads'])} head(s)), "
        "read-out. Best evaluation accuracy, mean over seeds with a 95 % t-interval when ≥ 2 seeds. "
        f"Training stops after at most {int(rows['max_steps'].max())} steps, so at small budgets a low accuracy "
        "mixes a memory that is too small with one that learns more slowly.", "",
        f"![mqar]({figure.name})", "",
        markdown_table(table), "",
        f"Runs: {len(rows)}; training time {rows['wall_s'].sum() / 60:.1f} min in all.", "",
    ])


def section_probe(frame: pd.DataFrame, out_dir: Path) -> str:
    """The training-free capacity probe, from ``probe.csv`` written by ``fwbench probe``."""
    title = "## Training-free capacity probe"
    csv = out_dir / "probe.csv"
    if not csv.exists():
        return f"{title}\n\nNot run (`fwbench probe --out {out_dir}`).\n"
    probe = pd.read_csv(csv)
    table = probe.pivot_table(index="variant", columns="S_over_d_dot", values="error").round(2).reset_index()
    table.columns = ["variant", *[f"S = {c:g}·d_dot" for c in table.columns[1:]]]
    return "\n".join([
        title, "",
        f"S random keys (N(0, I), d_key {int(probe['d_key'].iloc[0])}) and S random values written into each "
        "variant's memory with its real φ and update rule (β = 1), no training, then every key read back. "
        "Relative retrieval error 1 − cos²(v, v̂) (0 = perfect, ≈ 1 = nothing); dashed: the least-squares "
        "bound 1 − d_dot/S that no d_dot-column memory can beat. Untrained random keys interfere long before "
        "S = d_dot: training has to learn keys whose features are nearly orthogonal. With β = 1 the rules "
        "that do not sum-normalise φ (FWM) overshoot every write (β‖φ(k)‖² ≫ 2), so they retrieve almost "
        "nothing here; trained models learn a smaller β and key scale.", "",
        "![probe](probe.png)", "",
        markdown_table(table), "",
    ])


def section_statistics(frame: pd.DataFrame, out_dir: Path) -> str:
    """How the intervals are computed, and the seeds behind each grid."""
    lines = [
        "## Statistics", "",
        f"Every interval is a two-sided {CONFIDENCE:.0%} Student-t interval over seeds "
        "(x̄ ± t_{0.975, n−1} · s/√n, `scipy.stats.t`), aggregated with pandas; with one seed only the value "
        "is shown. Losses and perplexities are positive and spread over decades, so their intervals are "
        "taken in log space (geometric mean, exp of the interval of the logs): they never go below zero. "
        "Capacities are estimated on each seed's own curve (one isolated failing S between retrieving ones "
        "is skipped as a bad point) and then summarised; two capacities differ only when their intervals "
        "are apart and a grid point separates them. Diverged runs are never hidden: they appear in the "
        "retrieval tables as 'diverged @ step' and in the language-model tables with status diverged and "
        f"their steps. {DIVERGENCE_POLICY}", "",
    ]
    if not frame.empty and "grid" in frame:
        seeds = frame.groupby("grid")["seed"].agg(lambda s: " ".join(str(x) for x in sorted(set(s)))).reset_index()
        seeds.columns = ["grid", "seeds"]
        lines += [markdown_table(seeds), ""]
    return "\n".join(lines)


SECTIONS: list[Callable[[pd.DataFrame, Path], str]] = [
    section_setup,
    section_capacity,
    section_setting2,
    section_capacity_vs_d_dot,
    section_mqar,
    section_shakespeare,
    section_probe,
    section_statistics,
    section_bench,
]


def _environment_lines(frame: pd.DataFrame) -> list[str]:
    """The records grouped by environment: runs, first start and last end (UTC), and their summed wall
    hours (one core per run), so that a published report says on what, with what and when it ran."""
    if frame.empty:
        return []
    # what labels a run's environment: where, with what, from which commit (every column the frame reads)
    columns = [c for c in ENVIRONMENT_COLUMNS if c in frame]
    combos = frame.groupby(columns, dropna=False).agg(
        runs=("run_id", "size"), first_start=("started_at", "min"), last_end=("ended_at", "max"),
        run_hours=("wall_s", lambda s: round(float(s.sum()) / 3600, 2)),
    ).reset_index() if {"started_at", "ended_at"} <= set(frame) else \
        frame.groupby(columns, dropna=False).size().reset_index(name="runs")
    # runs without an environment (failed_record's) made these columns' NaN, and threads a float beside
    # them: a row of 'nan' and '1.0' CPU threads
    for column in [*columns, "first_start", "last_end"]:
        if column in combos:
            combos[column] = [("—" if pd.isna(value) else str(int(value)) if column == "threads" else value)
                              for value in combos[column]]
    return ["Runs by environment (device, machine, torch and Python versions, CPU threads, git commit; "
            "run hours = the runs' wall seconds summed):", "", markdown_table(combos), ""]


def verdict_summary(claims: list[ClaimResult]) -> str:
    """One line counting the claims table's verdicts, for the console after a run: "14 claims: 2 PASS,
    0 FAIL, 12 INDICATIVE (7 leaning PASS, 1 leaning FAIL, 4 undecided), 0 NOT RUN". A user who only reads the console
    learns whether anything was decided without opening the report."""
    counts = {v: sum(c.verdict == v for c in claims) for v in (PASS, FAIL, INDICATIVE, NOT_RUN)}
    leanings = [c.leaning for c in claims if c.verdict == INDICATIVE]
    undecided = len(leanings) - leanings.count(PASS) - leanings.count(FAIL)
    leaning = (f" ({leanings.count(PASS)} leaning PASS, {leanings.count(FAIL)} leaning FAIL, {undecided} undecided)"
               if counts[INDICATIVE] else "")
    return (f"{len(claims)} claims: {counts[PASS]} {PASS}, {counts[FAIL]} {FAIL}, {counts[INDICATIVE]} {INDICATIVE}"
            f"{leaning}, {counts[NOT_RUN]} {NOT_RUN}")


def render_report(results_dir: str | Path, out_dir: str | Path,
                  echo: Callable[[str], object] | None = None) -> Path:
    """Write ``out_dir/REPORT.md`` and its figures from the store in ``results_dir``; when ``echo`` is
    given (``print``), pass it the :func:`verdict_summary` line of the claims table.

    Raises:
        FwbenchError: ``out_dir`` cannot be created.
    """
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FwbenchError(f"--out: cannot create {str(out_dir)!r}: {exc.strerror}") from None
    records, problems = load_run_records(results_dir)
    frame = records_frame(records)
    frame.attrs["results_dir"] = str(results_dir)  # sections with their own records file (bench.jsonl) read it
    claims = evaluate_claims(frame)
    claims_table = pd.DataFrame([
        {"claim": c.claim, "reference": c.reference, "paper": c.paper, "this run": c.measured,
         "evidence": c.evidence, "verdict": f"**{c.verdict}**{leaning_note(c)}"} for c in claims
    ])
    lines = [
        "# fwbench report: Linear Transformers Are Secretly Fast Weight Programmers",
        "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} from {len(frame)} run record(s) in "
        f"`{Path(results_dir).name}/`. Paper: Schlag, Irie & Schmidhuber, ICML 2021 (arXiv:2102.11174).",
        "",
        "## Claims",
        "",
        "PASS / FAIL only where the evidence meets the minimum the claim states (seeds, S range, finished "
        "runs, LM budget); otherwise INDICATIVE with what is missing, and which way the criterion leans on the "
        "evidence at hand (\"leans PASS\" / \"leans FAIL\"; nothing where the intervals do not separate the cases). "
        "Intervals are 95 %; losses in log space. "
        f"{DIVERGENCE_POLICY} See the setup section for every difference from the official code.",
        "",
        markdown_table(claims_table),
        "",
    ]
    if problems:
        lines += ["Store problems (lines skipped):", "", *[f"- {p}" for p in problems], ""]
    for section in SECTIONS:
        lines.append(section(frame, out_dir))
    lines += _environment_lines(frame)
    path = out_dir / "REPORT.md"
    path.write_text("\n".join(lines))
    if echo is not None:
        echo(verdict_summary(claims))
    return path
