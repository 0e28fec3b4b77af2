"""From benchmark records to tables and to the acceptance ratios (printed and put in the report).

Every ratio compares figures from one ``fwbench bench`` session (one process), so a shared or
throttled machine slows both sides alike. Where a profile did not measure the T a ratio names,
the largest measured T below it is used and the ratio says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from fwbench.analysis.records import NUMBER, is_of_kind, split_readable
from fwbench.bench.suite import FORWARD, FORWARD_BACKWARD, LOW_PRECISION_TOLERANCE, MODES, OFFICIAL_SETTING2_STEPS_PER_S
from fwbench.run.strict_json import restore_non_finite

#: Records of this kind hold one session's side measurements and ratios.
SUMMARY_KIND = "bench-summary"


@dataclass(frozen=True)
class Ratio:
    """One acceptance figure: what was compared, the value, the target, and whether it holds."""

    name: str
    value: float
    target: str
    passed: bool | None  # None: not measured in this run
    detail: str = ""

    @property
    def verdict(self) -> str:
        return "NOT RUN" if self.passed is None else ("PASS" if self.passed else "FAIL")


#: The fields of a ``bench`` record (``suite._record``) the report reads, with their types.
BENCH_RECORD_FIELDS = {"session": str, "finished_at": str, "device": str, "status": str, "variant": str,
                       "form": str, "mode": str, "T": int, "B": int, "H": int, "d_head": int}

#: The fields of a ``bench`` record the report reads where they are present: each absent, null or of its type.
OPTIONAL_BENCH_FIELDS = {"sweep": str, "median_s": NUMBER, "peak_mem_bytes": NUMBER, "gflops_per_s": NUMBER,
                         "chunk_size": int, "fraction_of_peak": NUMBER}

#: The statuses ``fwbench bench`` gives a case (``suite._Runner``): measured, out of memory, not run.
BENCH_STATUSES = ("ok", "oom", "skipped")

#: The values a ``bench`` record's field may hold where the report draws only some (any other, "OK" or "Forward",
#: was drawn in no table or figure, and named nowhere); ``sweep`` may also be absent or null (the main cases).
BENCH_FIELD_VALUES = {"status": BENCH_STATUSES, "mode": MODES, "sweep": ("chunk_size",)}

#: The sizes of a ``bench`` record, each a positive int64 as the report computes with it: a T of 2**1023 (json reads
#: any number of digits) made the figure's O(T²) guide raise OverflowError, a traceback; 0 or -5 was drawn on a log axis.
BENCH_SIZES = ("T", "B", "H", "d_head")

#: The fields of each entry of a summary record's ``ratios`` (:func:`summary_record`); ``value`` may be null.
RATIO_FIELDS = {"name": str, "value": NUMBER, "target": str, "verdict": str, "detail": str}


def finished_instant(text: str) -> float | None:
    """Seconds since the epoch of a record's ``finished_at`` (ISO 8601, as ``fwbench bench`` writes it, in UTC; one
    without a zone is read as UTC); None where it is none."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    try:
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    except (OverflowError, ValueError):
        return None


def bench_record_faults(record: dict) -> list[str]:
    """The fields of a record (a parsed line of bench.jsonl) that make it no benchmark record the report can
    read, missing or mistyped ("kind" for a record of another kind, "finished_at", "ratios"; "status", "mode",
    "sweep" for a value not in :data:`BENCH_FIELD_VALUES`; a size of :data:`BENCH_SIZES` below 1 or
    beyond an int64; a ``finished_at`` that is no ISO 8601 time; "median_s" for a measured case, status "ok", without
    one); empty for one."""
    record = restore_non_finite(record)
    if record.get("kind") == SUMMARY_KIND:
        ratios = record.get("ratios")
        wrong = [] if is_of_kind(record.get("session"), str) else ["session"]
        if not isinstance(ratios, list) or not all(
                isinstance(r, dict) and all(name in r and (is_of_kind(r[name], kind) or (name == "value" and r[name] is None))
                                            for name, kind in RATIO_FIELDS.items()) for r in ratios):
            wrong.append("ratios")
        return wrong
    if record.get("kind") != "bench":
        return ["kind"]
    wrong = [name for name, kind in BENCH_RECORD_FIELDS.items() if not is_of_kind(record.get(name), kind)
             # a status or mode of no case's ("OK", "Forward") was drawn nowhere, without a word
             or record[name] not in BENCH_FIELD_VALUES.get(name, (record[name],))
             or (name in BENCH_SIZES and not 1 <= record[name] < 2**63)
             # the latest session is found by it: "yesterday" sorted after every date and hid the real latest one
             or (name == "finished_at" and finished_instant(record[name]) is None)]
    wrong += [name for name, kind in OPTIONAL_BENCH_FIELDS.items()
              if record.get(name) is not None and (not is_of_kind(record[name], kind)
                                                   or record[name] not in BENCH_FIELD_VALUES.get(name, (record[name],)))]
    if record.get("status") == "ok" and "median_s" not in wrong and not is_of_kind(record.get("median_s"), NUMBER):
        # a measured case is its median (the suite writes one with every "ok"): without it, the time table
        # multiplied None (TypeError traceback), or, beside a measured T, wrote its cell "nan"
        wrong.append("median_s")
    return wrong


def readable_bench_records(records: list[dict], source: str | Path) -> tuple[list[dict], list[str]]:
    """(the ``bench`` and summary records of ``source`` (bench.jsonl) the report can read, non-finite values
    restored; a ``SOURCE: record 'ID' skipped: ...`` problem for each other one). A record missing a field
    the report reads or holding it as another type (a hand-edited line, another tool's JSON), made
    ``fwbench report`` a traceback (KeyError: 'finished_at'), and one of no known ``kind`` was dropped without
    a word; each is skipped and named, as :func:`~fwbench.analysis.records.readable_run_records` does for
    runs.jsonl. Checked (:func:`bench_record_faults`): ``kind``, :data:`BENCH_RECORD_FIELDS`,
    :data:`OPTIONAL_BENCH_FIELDS`, and a summary's ``session`` and :data:`RATIO_FIELDS`."""
    readable, problems = split_readable(records, source, bench_record_faults, "benchmark record")
    return [restore_non_finite(record) for record in readable], problems


def bench_frame(records: list[dict]) -> pd.DataFrame:
    """One row per measured case (status ok or not); summary records are left out. ``records`` are
    those :func:`readable_bench_records` keeps: another record may lack a column the report reads."""
    rows = [{k: v for k, v in r.items() if k != "environment"} for r in records if r.get("kind") == "bench"]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    for column in OPTIONAL_BENCH_FIELDS:
        if column not in frame:
            frame[column] = None
    return frame


def main_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured cases at the default chunk size (not the chunk-size sweep)."""
    if frame.empty:
        return frame
    return frame[(frame["status"] == "ok") & frame["sweep"].isna()]


def _lookup(frame: pd.DataFrame, variant: str, form: str, mode: str, T: int, column: str = "median_s"):
    rows = frame[(frame["variant"] == variant) & (frame["form"] == form) & (frame["mode"] == mode) & (frame["T"] == T)]
    if rows.empty or pd.isna(rows.iloc[-1][column]):
        return None
    return float(rows.iloc[-1][column])


def _length_at_most(frame: pd.DataFrame, target: int, *cases: tuple[str, str, str], column: str = "median_s"):
    """Largest T ≤ target at which every (variant, form, mode) case has ``column`` measured."""
    for T in sorted(set(frame["T"]) if not frame.empty else [], reverse=True):
        if T <= target and all(_lookup(frame, *case, T, column) is not None for case in cases):
            return int(T)
    return None


def _at(T: int | None, target: int) -> str:
    return f"T={T}" if T == target else f"T={T} (the profile's longest; the target is stated at T={target})"


def markdown_cell(value: object) -> str:
    """``value`` as one cell of a GitHub-flavoured Markdown table row: ``\\`` and ``|`` escaped, line
    breaks written ``<br>``. A ``|`` left as it was (a registered variant named ``my|map``, a grid named
    ``a|b``) split the cell in two and shifted every cell after it; a line break ended the row. Here, not
    in :mod:`fwbench.report.markdown`, because the estimate's tables (this room) need it too."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def time_table(frame: pd.DataFrame, mode: str, lengths: list[int] | None = None) -> pd.DataFrame:
    """Rows (variant, form), columns T: "median ms [peak MiB]" for one mode."""
    rows = main_rows(frame)
    rows = rows[rows["mode"] == mode]
    if rows.empty:
        return pd.DataFrame()
    lengths = lengths or sorted(rows["T"].unique())
    table = []
    for (variant, form), group in rows.groupby(["variant", "form"], sort=False):
        line = {"variant": variant, "form": form}
        for T in lengths:
            hit = group[group["T"] == T]
            if hit.empty:
                line[f"T={T}"] = "—"
                continue
            r = hit.iloc[-1]
            memory = "" if pd.isna(r["peak_mem_bytes"]) else f" [{r['peak_mem_bytes'] / 2**20:.0f}]"
            line[f"T={T}"] = f"{r['median_s'] * 1e3:.1f}{memory}"
        table.append(line)
    return pd.DataFrame(table)


def throughput_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Chunk forms (and counted anchors): tokens/s and achieved GFLOP/s at each T, forward."""
    rows = main_rows(frame)
    rows = rows[(rows["mode"] == FORWARD) & rows["gflops_per_s"].notna() & (rows["form"] != "parallel")]
    table = []
    for (variant, form), group in rows.groupby(["variant", "form"], sort=False):
        line = {"variant": variant, "form": form}
        for _, r in group.sort_values("T").iterrows():
            gflops = f", {r['gflops_per_s']:.1f} GF/s" if r["gflops_per_s"] > 0 else ""  # SDPA on CPU: not counted
            line[f"T={r['T']}"] = f"{r['tokens_per_s'] / 1e3:.0f}k tok/s{gflops}"
        table.append(line)
    return pd.DataFrame(table)


def sweep_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Chunk-size sweep: median ms per chunk size, per variant and mode."""
    if frame.empty:
        return pd.DataFrame()
    rows = frame[(frame["status"] == "ok") & (frame["sweep"] == "chunk_size")]
    if rows.empty:
        return pd.DataFrame()
    table = rows.pivot_table(index=["variant", "mode", "T"], columns="chunk_size", values="median_s", aggfunc="last")
    table = (table * 1e3).round(1)
    table.columns = [f"C={int(c)} (ms)" for c in table.columns]
    return table.reset_index()


#: What a paired timing record holds (``fwbench.bench.suite._paired_ratios``); one lacking any is ignored.
PAIRED_KEYS = frozenset({"T", "rounds", "first", "second", "first_s", "second_s", "ratio"})


def acceptance_ratios(frame: pd.DataFrame, extras: dict) -> list[Ratio]:
    """The issue's acceptance figures from one session's records and side measurements."""
    rows = main_rows(frame)
    ratios = []
    delta, dpfp, linear = "dpfp-delta:nu=1", "dpfp:nu=1", "linear"

    paired = extras.get("paired") or {}

    def ratio_of(name: str, label: str, target: str, holds, slower: tuple, faster: tuple) -> Ratio:
        """``slower`` / ``faster`` time (each (variant, form) fwd+bwd): from the pair timed in turns
        when the run has it, else from the grid at the longest T ≤ 4096 that both have."""
        pair = paired.get(name) or {}
        value = pair.get("ratio")
        if isinstance(value, (int, float)) and math.isfinite(value) and PAIRED_KEYS <= set(pair):
            return Ratio(f"{label}, fwd+bwd, {_at(pair['T'], 4096)}", value, target, holds(value),
                         f"timed in turns ({pair['rounds']} rounds): {pair['first']} {pair['first_s'] * 1e3:.1f} ms, "
                         f"{pair['second']} {pair['second_s'] * 1e3:.1f} ms")
        T = _length_at_most(rows, 4096, (*slower, FORWARD_BACKWARD), (*faster, FORWARD_BACKWARD))
        if T is None:
            return Ratio(f"{label}, fwd+bwd", math.nan, target, None)
        value = _lookup(rows, *slower, FORWARD_BACKWARD, T) / _lookup(rows, *faster, FORWARD_BACKWARD, T)
        return Ratio(f"{label}, fwd+bwd, {_at(T, 4096)}", value, target, holds(value), "from the grid")

    ratios.append(ratio_of("chunk_vs_recurrent", "dpfp-delta chunk speed-up over recurrent", "≥ 10×",
                           lambda x: x >= 10, (delta, "recurrent"), (delta, "chunk")))
    ratios.append(ratio_of("delta_vs_sum", "dpfp-delta chunk time / dpfp chunk time", "≤ 2.5×",
                           lambda x: x <= 2.5, (delta, "chunk"), (dpfp, "chunk")))

    comparison = extras.get("fla_comparison", {})
    if "speedup" in comparison:
        c = comparison
        passed = c["speedup"] >= 1.5 and c["rel_rmse"] <= 1e-5
        ratios.append(Ratio(
            f"fla delta_rule_chunkwise time / ours (delta_rule_chunk), fwd, same inputs B=1 H=8 d_k=128 d_v=64, "
            f"{_at(c['T'], 2048)}", c["speedup"], "≥ 1.5× and rel RMSE ≤ 1e-5", passed,
            f"ours {c['ours_s'] * 1e3:.1f} ms, fla {c['fla_s'] * 1e3:.1f} ms (its best chunk size, "
            f"{c['fla_chunk_size']}); rel RMSE {c['rel_rmse']:.1e}"))
    else:
        ratios.append(Ratio("fla comparison", math.nan, "≥ 1.5×", None, comparison.get("skipped", "not run")))

    T = _length_at_most(rows, 4096, (delta, "chunk", FORWARD), column="fraction_of_peak")
    if T is None:
        ratios.append(Ratio("dpfp-delta chunk fwd GFLOP/s / matmul peak", math.nan, "≥ 25 %", None))
    else:
        value = _lookup(rows, delta, "chunk", FORWARD, T, "fraction_of_peak")
        gflops = _lookup(rows, delta, "chunk", FORWARD, T, "gflops_per_s")
        peak = gflops / value if value else math.nan  # the fp32 matmul peak timed right before the case
        ratios.append(Ratio(f"dpfp-delta chunk fwd achieved GFLOP/s / fp32 matmul peak timed beside it, {_at(T, 4096)}",
                            value, "≥ 25 %", value >= 0.25, f"{gflops:.1f} of {peak:.1f} GFLOP/s"))

    ratios.append(ratio_of("sdpa_vs_linear", "SDPA softmax time / linear chunk time", "> 1×",
                           lambda x: x > 1, ("sdpa (torch)", "anchor"), (linear, "chunk")))

    ratios.append(_memory_growth(rows))

    training = extras.get("setting2_training")
    if training:
        value = training["steps_per_s"]
        ratios.append(Ratio(
            "Setting 2 training steps/s (dpfp-delta ν=1, S=60, length 120, batch 32)", value,
            f"≥ {10 * OFFICIAL_SETTING2_STEPS_PER_S:.0f} (10× official {OFFICIAL_SETTING2_STEPS_PER_S:.0f})",
            value >= 10 * OFFICIAL_SETTING2_STEPS_PER_S,
            f"median step after warm-up, {training['steps']} steps (mean "
            f"{training.get('mean_steps_per_s', value):.0f} steps/s), form {training['form']}, "
            f"{training['threads']} CPU thread(s)"))

    precision = extras.get("precision")
    if precision:
        worst = max(precision["rows"], key=lambda r: r["rel_rmse"] / r["tolerance"])
        passed = all(r["finite"] and r["rel_rmse"] <= r["tolerance"] for r in precision["rows"])
        tolerance = ", ".join(f"{k} {v:.0e}" for k, v in LOW_PRECISION_TOLERANCE.items())
        ratios.append(Ratio(
            f"fp16/bf16 forward vs fp32, every variant, {_at(precision['T'], 8192)}: worst rel RMSE",
            worst["rel_rmse"], f"finite, ≤ {tolerance}", passed, f"worst: {worst['variant']} {worst['dtype']}"))
    return ratios


def _memory_growth(rows: pd.DataFrame) -> Ratio:
    """Peak memory of the fast-weight chunk forms at the longest T over T = 2048 (worst case)."""
    chunk = rows[(rows["form"] == "chunk") & rows["peak_mem_bytes"].notna()] if not rows.empty else rows
    if chunk.empty:
        return Ratio("chunk peak memory growth", math.nan, "≤ 10×", None)
    long_T = int(chunk["T"].max())
    short_T = 2048 if 2048 in set(chunk["T"]) and long_T > 2048 else int(chunk["T"].min())
    if long_T == short_T:
        return Ratio("chunk peak memory growth", math.nan, "≤ 10×", None, "one length only")
    worst, value = "", 0.0
    for (variant, mode), group in chunk.groupby(["variant", "mode"]):
        by_T = group.set_index("T")["peak_mem_bytes"]
        if long_T in by_T and short_T in by_T and by_T[short_T] > 0:
            ratio = float(by_T[long_T] / by_T[short_T])
            if ratio > value:
                worst, value = f"{variant} {mode}", ratio
    bound = 10 * long_T / 16384 * 2048 / short_T  # the 10× for 8× the tokens, scaled to these lengths
    return Ratio(f"chunk forms' peak memory T={long_T} / T={short_T} (worst variant and mode)", value,
                 f"≤ {bound:.1f}×", value <= bound, f"worst: {worst}; T grows {long_T / short_T:.0f}×")


def format_ratios(ratios: list[Ratio]) -> str:
    """One line per ratio: verdict, value, target, what."""
    lines = []
    for r in ratios:
        value = "n/a" if math.isnan(r.value) else (f"{r.value:.1%}" if "%" in r.target else f"{r.value:.3g}")
        detail = f" — {r.detail}" if r.detail else ""
        lines.append(f"  [{r.verdict:>7}] {value:>9}  (target {r.target})  {r.name}{detail}")
    return "\n".join(lines)


def summary_record(session: str, extras: dict, ratios: list[Ratio], environment: dict) -> dict:
    """The record that keeps one session's side measurements and ratios in the store."""
    return {
        "run_id": f"summary-{session}", "kind": SUMMARY_KIND, "session": session, "extras": extras,
        "ratios": [{"name": r.name, "value": None if math.isnan(r.value) else r.value, "target": r.target,
                    "verdict": r.verdict, "detail": r.detail} for r in ratios],
        "environment": environment,
    }
