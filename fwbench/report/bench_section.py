"""The report's benchmark section: time-vs-T and memory-vs-T figures, the table, the ratios.

It reads ``bench.jsonl`` from the results directory of the report (``frame.attrs["results_dir"]``)
and shows the latest ``fwbench bench`` session of each device.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fwbench.bench.suite import BENCH_RECORDS, FORWARD, FORWARD_BACKWARD, MODES  # noqa: E402
from fwbench.bench.summary import (  # noqa: E402
    SUMMARY_KIND,
    bench_frame,
    finished_instant,
    main_rows,
    readable_bench_records,
    time_table,
)
from fwbench.errors import one_line  # noqa: E402
from fwbench.report.figure_style import save  # noqa: E402
from fwbench.report.markdown import markdown_table  # noqa: E402
from fwbench.run.store import ResultsStore  # noqa: E402

_LINESTYLES = {"chunk": "-", "parallel": "--", "recurrent": ":", "anchor": "-."}


def _guides(ax, lengths: list[int], y0: float) -> None:
    """Dotted O(T) and O(T²) lines through the first point, for reading slopes off a log-log plot."""
    t0 = min(lengths)
    xs = [t0, max(lengths)]
    ax.plot(xs, [y0, y0 * xs[1] / t0], color="dimgrey", lw=1.6, ls=(0, (1, 2)), label="O(T)")
    ax.plot(xs, [y0, y0 * (xs[1] / t0) ** 2], color="black", lw=1.6, ls=(0, (1, 2)), label="O(T²)")


def bench_figure(rows: pd.DataFrame, path: Path, title: str) -> Path:
    """2×2 log-log panels: median time and peak memory against T, forward and forward+backward."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharex=True)
    variants = sorted(rows["variant"].unique())
    # one colour per variant, never recycled (the default cycle has 10; the anchors make it 11 or more)
    palette = plt.get_cmap("tab10" if len(variants) <= 10 else "tab20")
    colour_of = {v: palette(i % palette.N) for i, v in enumerate(variants)}
    for column, mode in enumerate(MODES):
        for row, (field, scale, label) in enumerate((("median_s", 1e3, "median time (ms)"),
                                                     ("peak_mem_bytes", 2**-20, "peak memory (MiB)"))):
            ax = axes[row][column]
            data = rows[(rows["mode"] == mode) & rows[field].notna()]
            for (variant, form), group in data.groupby(["variant", "form"]):
                group = group.sort_values("T")
                ax.plot(group["T"], group[field] * scale, marker="o", ms=3, color=colour_of[variant],
                        ls=_LINESTYLES.get(form, "-"), label=f"{variant} {form}")
            if not data.empty:
                first = data[data["T"] == data["T"].min()][field].median() * scale
                _guides(ax, sorted(data["T"].unique()), first)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{label}, {mode}")
            ax.set_xlabel("sequence length T")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
    legend = {}
    for ax in axes.flat:  # the anchors that only run forward appear in the left panels only
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="center right", fontsize=7)
    fig.suptitle(title)
    return save(fig, path, rect=(0, 0, 0.8, 0.96))


#: The most characters of a device a figure's name keeps (a file name has at most 255 bytes on most file systems);
#: a longer device is cut and told apart by its hash.
_DEVICE_NAME_MAX = 100


def _figure_name(device: object, taken: set[str]) -> str:
    """The file name of ``device``'s figure, ``bench_cuda_0.png``; ``taken`` holds the names given so far, case-folded,
    and gets this one. Every character but a letter, digit, '.', '_' or '-' is written '_' (a device "cuda/0" from a
    hand-edited record wrote bench_cuda/0.png and linked "0.png", a broken link; "NVIDIA H100" a link with spaces,
    which Markdown does not show), and 8 hex digits of a hash of the device are added where a character other than
    ':' was replaced, the device is longer than :data:`_DEVICE_NAME_MAX` (a 300-character device raised OSError 'File
    name too long', a traceback), or the name is taken, compared without case ("cuda:0" and "cuda_0": one figure
    lost; "CPU" and "cpu" are one file on a case-insensitive file system, macOS's or Windows'); a counter follows
    where the hashed name is taken too (two devices that differ only where the hash's input is equal never occur,
    but a device may spell out another's hashed name)."""
    text = str(device)
    name = "bench_" + re.sub(r"[^A-Za-z0-9._-]", "_", text[:_DEVICE_NAME_MAX])
    hashed = f"{name}-{hashlib.sha1(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    # a name as before for a device of those characters and ':' (cuda:0); any other, so that "cuda/0" never takes
    # cuda:0's name whichever comes first
    plain = not re.search(r"[^A-Za-z0-9._:-]", text) and len(text) <= _DEVICE_NAME_MAX
    candidates = ([f"{name}.png"] if plain else []) + [f"{hashed}.png"]
    counter = 2
    while all(candidate.casefold() in taken for candidate in candidates):
        candidates.append(f"{hashed}-{counter}.png")
        counter += 1
    chosen = next(candidate for candidate in candidates if candidate.casefold() not in taken)
    taken.add(chosen.casefold())
    return chosen


def _measured_none(measured: pd.DataFrame, session: str, alone: bool) -> str:
    """The sentence saying that ``session``, a device's latest, measured no case of the section's tables (each
    status counted, status ok being the chunk-size sweep's), and that no earlier session did either (``alone``)
    or that the latest one that did is drawn."""
    rows = measured[measured["session"] == session]
    counts = rows["status"].value_counts(sort=False)
    said = ", ".join(f"{count} {'ok in the chunk-size sweep only' if status == 'ok' else status}"
                     for status, count in counts.items())
    first = rows.iloc[0]
    return (f"The latest session, {one_line(session)} ({one_line(first['finished_at'][:10])}), measured no case "
            f"({said}); " + ("no session of this device measured one." if alone else
                             "the latest session that measured one is drawn."))


def section_bench(frame: pd.DataFrame, out_dir: Path) -> str:
    """Speed and memory: the latest ``fwbench bench`` session per device (figures, table, ratios)."""
    results_dir = frame.attrs.get("results_dir")
    records, problems = [], []
    if results_dir:
        store = ResultsStore(results_dir, records_file=BENCH_RECORDS)
        loaded = store.load()
        records, skipped = readable_bench_records(loaded.records, store.path)
        problems = loaded.problems + skipped
    # a line or record the section cannot read is named, as the report names those of runs.jsonl
    skipped_lines = ["Benchmark records skipped:", "", *[f"- {p}" for p in problems], ""] if problems else []
    measured = bench_frame(records)
    if measured.empty:
        return "\n".join(["## Speed and memory", "",
                          "No benchmark records yet: `fwbench bench` (a few minutes on a CPU) or `fwbench bench "
                          "--profile full` (about an hour on a 2-core CPU) measures speed and memory.",
                          "", *skipped_lines])
    summaries = {r["session"]: r for r in records if r.get("kind") == SUMMARY_KIND}
    lines = ["## Speed and memory", "", *skipped_lines]
    taken: set[str] = set()
    # by the instant, not the text: "…T23:00:00-05:00" is later than "…T01:00:00+00:00" of the next day's date
    measured["finished_s"] = measured["finished_at"].map(finished_instant)
    ordered = measured.sort_values("finished_s", kind="stable")
    latest = ordered.groupby("device")["session"].last()
    # the latest session that measured a case is drawn: a later one of none (every case out of memory) was drawn as
    # an empty figure with no table and no word, and hid the device's measured session before it
    # (by its last record of any kind, as ``latest``: by its last measured case, a session that measured some, then
    # ran on past another's into cases out of memory, was called the latest that "measured no case")
    main = main_rows(ordered)
    measuring = set(zip(main["device"], main["session"]))
    drawn = ordered[[pair in measuring for pair in zip(ordered["device"], ordered["session"])]] \
        .groupby("device")["session"].last()
    for device, latest_session in latest.items():
        session = drawn.get(device)
        unmeasured = [] if session == latest_session else [_measured_none(measured, latest_session, session is None)]
        if session is None:
            lines += [f"### {one_line(device)}", "", *unmeasured, ""]
            continue
        # the figure is named after the device as recorded: named after its one-line form, two devices written
        # alike ("a\\nb" and one holding a newline) wrote one file
        name = _figure_name(device, taken)
        # a heading and a sentence of one line each: a device (or session) holding a newline from a hand-edited
        # record ended the heading there, the rest read as text
        device, session_shown = one_line(device), one_line(session)
        rows = main_rows(measured[measured["session"] == session])
        first = rows.iloc[0]
        where = (f"{device}, B={first['B']}, H={first['H']}, d_head={first['d_head']}, fp32, "
                 f"session {session_shown} ({one_line(first['finished_at'][:10])})")
        figure = bench_figure(rows, out_dir / name, f"fwbench bench: {where}")
        lines += [f"### {device}", "", *([unmeasured[0], ""] if unmeasured else []),
                  f"Median wall time and peak memory against T ({where}). Solid: chunk form; "
                  "dashed: parallel; dotted: recurrent; dash-dot: anchors (torch SDPA, fla-core).", "",
                  f"![benchmark {device}]({figure.name})", ""]
        for mode in (FORWARD, FORWARD_BACKWARD):
            table = time_table(rows, mode)
            if not table.empty:
                lines += [f"{mode}: median ms [peak MiB]", "", markdown_table(table), ""]
        summary = summaries.get(session)
        if summary:
            ratio_table = pd.DataFrame([{
                "figure": r["name"], "measured": "n/a" if r["value"] is None else f"{r['value']:.3g}",
                "target": r["target"], "verdict": f"**{r['verdict']}**", "detail": r["detail"],
            } for r in summary["ratios"]])
            lines += ["Acceptance ratios, measured in this session:", "", markdown_table(ratio_table), ""]
    return "\n".join(lines)
