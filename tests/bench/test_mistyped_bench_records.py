"""A benchmark record (bench.jsonl) missing a field the report reads, or holding it as another type (a
hand-edited line, another tool's JSON), made ``fwbench report`` a traceback (KeyError: 'finished_at',
KeyError: 'variant', TypeError on a median of "fast"); it is skipped and named in the report's speed
section, as a record of runs.jsonl is, and the readable records beside it are still drawn."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fwbench.bench.suite import BENCH_RECORDS, FORWARD, _record
from fwbench.bench.summary import readable_bench_records, summary_record
from fwbench.report.bench_section import section_bench


def _case(T: int) -> dict:
    return {"B": 1, "H": 2, "d_head": 8, "dtype": "float32", "device": "cpu", "matmul_peak_gflops": 10.0,
            "variant": "linear", "rule": "sum", "form": "chunk", "mode": FORWARD, "T": T, "d_dot": 8,
            "status": "ok", "median_s": 0.001 * T / 32, "min_s": 0.001, "repeats": 2, "tokens_per_s": 32000.0,
            "peak_mem_bytes": 2**20 * T / 32}


def _readable() -> list[dict]:
    return [_record("s1", _case(T), {}) for T in (32, 64)]


def _without(record: dict, name: str) -> dict:
    return {k: v for k, v in record.items() if k != name}


#: (a record, the field the report names as missing or mistyped); each made the old section raise
#: (the kind-less one was dropped without a word)
MISTYPED = [
    (lambda r: _without(r, "finished_at"), "finished_at"),
    (lambda r: _without(r, "variant"), "variant"),
    (lambda r: {**r, "T": "64"}, "T"),
    (lambda r: {**r, "median_s": "fast"}, "median_s"),
    (lambda r: {**r, "peak_mem_bytes": [1]}, "peak_mem_bytes"),
    (lambda r: {**r, "device": None}, "device"),
    # a measured case ("ok") without its median: beside a measured T its cell read "nan", alone a TypeError
    (lambda r: {**r, "median_s": None}, "median_s"),
    (lambda r: _without(r, "median_s"), "median_s"),
    # a status no case has (fwbench bench writes ok, oom, skipped): drawn nowhere and named nowhere (h-breakC)
    (lambda r: {**r, "status": "OK"}, "status"),
    (lambda r: {**r, "status": "done"}, "status"),
    # the same kind in the other fields of a set of values: a mode or sweep of none drawn
    (lambda r: {**r, "mode": "Forward"}, "mode"),
    (lambda r: {**r, "sweep": "chunk"}, "sweep"),
    # a size the report cannot draw: T 2**1023 (308 digits) raised OverflowError in the figure's O(T²) guide, a
    # traceback; T 0 was drawn on a log axis (h-breakC)
    (lambda r: {**r, "T": 2**1023}, "T"),
    (lambda r: {**r, "T": 0}, "T"),
    (lambda r: {**r, "B": -1}, "B"),
]


def _section(directory, records: list[dict], out) -> str:
    (directory / BENCH_RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
    frame = pd.DataFrame()
    frame.attrs["results_dir"] = str(directory)
    return section_bench(frame, out)


def test_records_as_fwbench_bench_writes_them_are_read():
    records = _readable()
    records.append(summary_record("s1", {}, [], {}))
    readable, problems = readable_bench_records(records, "bench.jsonl")
    assert problems == [] and readable == records


@pytest.mark.parametrize(("mistype", "field"), MISTYPED, ids=[field for _, field in MISTYPED])
def test_a_mistyped_bench_record_is_skipped_and_named(tmp_path, mistype, field):
    bad = {**mistype(_record("s1", _case(128), {})), "run_id": "bad"}
    markdown = _section(tmp_path, [*_readable(), bad], tmp_path)
    assert (f"- {tmp_path / BENCH_RECORDS}: record 'bad' skipped: no benchmark record "
            f"(missing or mistyped: {field})") in markdown
    # the readable session is still drawn: T=32 and T=64, not the skipped T=128
    assert "T=32" in markdown and "T=64" in markdown and "T=128" not in markdown
    assert (tmp_path / "bench_cpu.png").exists()


def test_a_mistyped_summary_and_a_record_of_no_kind_are_named(tmp_path):
    summary = summary_record("s1", {}, [], {})
    summary["ratios"] = [{"name": "x", "target": "≥ 1", "verdict": "PASS", "detail": ""}]  # no value
    markdown = _section(tmp_path, [*_readable(), {**summary, "run_id": "sum"}, {"run_id": "other"}], tmp_path)
    assert f"{tmp_path / BENCH_RECORDS}: record 'sum' skipped: no benchmark record (missing or mistyped: ratios)" \
        in markdown
    assert f"{tmp_path / BENCH_RECORDS}: record 'other' skipped: no benchmark record (missing or mistyped: kind)" \
        in markdown
    assert "T=64" in markdown and "Acceptance ratios" not in markdown


def test_a_store_of_only_unreadable_bench_records_says_so(tmp_path):
    markdown = _section(tmp_path, [{**_without(_readable()[0], "session"), "run_id": "bad"}], tmp_path)
    assert "No benchmark records yet" in markdown
    assert "record 'bad' skipped: no benchmark record (missing or mistyped: session)" in markdown


def test_a_store_of_no_readable_record_is_refused_naming_the_bench_record(tmp_path, capsys):
    """bench.jsonl = {"run_id": "b"} (no runs.jsonl) passed the empty-store check as a record, and the report
    over --out said "no runs yet" in every section; it is refused like a runs.jsonl of no run record."""
    from fwbench.cli import main

    (tmp_path / BENCH_RECORDS).write_text('{"run_id": "b"}\n' + json.dumps({**_readable()[0], "T": "32"}) + "\n")
    capsys.readouterr()
    assert main(["report", "--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fwbench: error: --results-dir: {str(tmp_path)!r} holds no run records (no record in runs.jsonl or "
        f"bench.jsonl; 2 record(s) skipped as no benchmark record, the first {tmp_path / BENCH_RECORDS}: record 'b' "
        f"(missing or mistyped: kind)); expected the directory that fwbench run, reproduce or bench wrote to; "
        f"nothing was written to {str(tmp_path / 'out')!r}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("median", [None, "absent"])
def test_a_measured_case_without_its_median_alone_is_named_not_a_traceback(tmp_path, median):
    """A session whose only record is "ok" without ``median_s`` (null, or absent) made the time table multiply
    None: ``TypeError: unsupported operand type(s) for *: 'NoneType' and 'float'``. A case not measured
    (status "skipped" or "error") has none, and is still read."""
    record = {**_readable()[0], "run_id": "bad", "median_s": median}
    if median == "absent":
        del record["median_s"]
    markdown = _section(tmp_path, [record], tmp_path)
    assert "record 'bad' skipped: no benchmark record (missing or mistyped: median_s)" in markdown
    assert "No benchmark records yet" in markdown
    skipped = {k: v for k, v in {**_readable()[0], "status": "skipped", "reason": "capped"}.items() if k != "median_s"}
    assert readable_bench_records([skipped], "bench.jsonl") == ([skipped], [])


def test_a_store_of_a_session_summary_alone_is_refused(tmp_path, capsys):
    """bench.jsonl holding only a session's summary (its cases lost, or never written) passed the empty-store
    check, and the report over --out drew no benchmark at all ("No benchmark records yet")."""
    from fwbench.cli import main

    (tmp_path / BENCH_RECORDS).write_text(json.dumps(summary_record("s1", {}, [], {})) + "\n")
    capsys.readouterr()
    assert main(["report", "--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert (f"(no record in runs.jsonl or bench.jsonl; 1 session summary record(s) in {tmp_path / BENCH_RECORDS} "
            "but no measured case)") in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # beside one measured case it is drawn as before
    (tmp_path / BENCH_RECORDS).write_text(json.dumps(summary_record("s1", {}, [], {})) + "\n"
                                          + json.dumps(_readable()[0]) + "\n")
    assert main(["report", "--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("status", ["oom", "skipped"])
def test_a_store_of_cases_none_measured_is_refused(tmp_path, capsys, status):
    """Break-it finding (h-breakC): bench.jsonl whose cases all ran out of memory (or were skipped), no runs.jsonl,
    passed the empty-store check, and the report over --out drew an empty figure and no table: the speed section
    draws measured cases (status ok) only. It is refused as a session's summary alone is."""
    from fwbench.cli import main

    cases = [{k: v for k, v in {**r, "status": status, "reason": "x"}.items() if k != "median_s"} for r in _readable()]
    (tmp_path / BENCH_RECORDS).write_text("".join(json.dumps(r) + "\n" for r in cases))
    capsys.readouterr()
    assert main(["report", "--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert (f"(no record in runs.jsonl or bench.jsonl; 2 benchmark case(s) in {tmp_path / BENCH_RECORDS}, none measured "
            f"(status oom or skipped)); ") in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # beside one measured case it is drawn as before
    (tmp_path / BENCH_RECORDS).write_text("".join(json.dumps(r) + "\n" for r in [*cases, _record("s2", _case(32), {})]))
    assert main(["report", "--results-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 0


def test_each_devices_figure_is_linked_by_a_name_that_is_its_file(tmp_path):
    """Break-it finding (h-breakC): a figure was named after its device with ':' written '_' only: a device "cuda/0"
    (a hand-edited record, another tool's JSON) wrote bench_cuda/0.png and linked "0.png", a broken link; "NVIDIA
    H100" a link with spaces, which Markdown does not show as an image; "cuda:0" and "cuda_0" one file, the first
    figure overwritten. Each link is now a file of its own in --out, with no space."""
    import re

    devices = ["cuda:0", "cuda_0", "cuda/0", "NVIDIA H100"]
    records = [_record(f"s{i}", {**_case(32), "device": device}, {}) for i, device in enumerate(devices)]
    out = tmp_path / "out"
    out.mkdir()
    markdown = _section(tmp_path, records, out)
    links = dict(re.findall(r"!\[benchmark (.+)\]\((.+)\)", markdown))
    assert sorted(links) == sorted(devices)
    assert len(set(links.values())) == len(devices)
    for name in links.values():
        assert " " not in name and "/" not in name and (out / name).is_file(), name
    assert links["cuda:0"] == "bench_cuda_0.png"  # a name as before where it was one


def test_a_device_or_session_holding_a_newline_stays_on_its_line(tmp_path):
    """Break-it finding (h-breakC): a device "cpu\\n## Injected" (or a session holding a newline) ended the section's
    '### device' heading and its sentence there, the rest read as a heading of its own; each is written escaped."""
    records = [_record("s\n1", {**_case(T), "device": "cpu\n## Injected"}, {}) for T in (32, 64)]
    markdown = _section(tmp_path, records, tmp_path)
    assert "### cpu\\n## Injected" in markdown and "session s\\n1 (" in markdown
    assert not [line for line in markdown.splitlines() if line.startswith(("## Injected", "1 ("))]


def test_the_latest_session_is_found_by_its_time_not_its_text(tmp_path):
    """Break-it finding (h-breakC): the latest session of a device was the last by finished_at's text: a hand-edited
    "yesterday" sorted after every date and hid the real latest session (now skipped and named: no time), and a
    time in another zone, "2026-12-06T23:00:00-05:00" (04:00 UTC on the 7th), lost to "2026-12-07T01:00:00+00:00"."""
    early = [{**_record("early", _case(T), {}), "finished_at": "2026-12-07T01:00:00+00:00"} for T in (32, 64)]
    late = [{**_record("late", _case(T), {}), "finished_at": "2026-12-06T23:00:00-05:00"} for T in (32, 64)]
    assert "session late (" in _section(tmp_path, [*late, *early], tmp_path)
    bad = {**_record("bad", _case(128), {}), "run_id": "bad", "finished_at": "yesterday"}
    markdown = _section(tmp_path, [*early, bad], tmp_path)
    assert "session early (" in markdown
    assert "record 'bad' skipped: no benchmark record (missing or mistyped: finished_at)" in markdown


@pytest.mark.parametrize("devices", [["CPU", "cpu"], ["a\nb", "a\\nb"], ["x" * 300], ["cuda_0", "cuda:0", "bench"]],
                         ids=["case only", "written alike", "300 characters", "cuda_0 first"])
def test_each_devices_figure_is_a_file_of_its_own_on_any_file_system(tmp_path, devices):
    """Break-it finding (h-breakE): devices "CPU" and "cpu" were given bench_CPU.png and bench_cpu.png, one file on a
    case-insensitive file system (macOS's, Windows'), the first figure overwritten; "a\\nb" holding a newline and
    "a\\\\nb" were named after their one-line form, alike, and wrote one file; a device of 300 characters raised
    OSError 'File name too long', a traceback. Each figure is now a file of its own, names told apart without case,
    of at most 255 bytes."""
    import re

    records = [_record(f"s{i}", {**_case(32), "device": device}, {}) for i, device in enumerate(devices)]
    out = tmp_path / "out"
    out.mkdir()
    markdown = _section(tmp_path, records, out)
    names = re.findall(r"!\[benchmark .+\]\((.+)\)", markdown)
    assert len(names) == len(devices)
    assert len({name.casefold() for name in names}) == len(devices), names
    for name in names:
        assert len(name.encode()) <= 255 and (out / name).is_file(), name


def _unmeasured(session: str, device: str, finished_at: str) -> dict:
    dropped = ("median_s", "min_s", "repeats", "tokens_per_s", "peak_mem_bytes")
    case = {**{k: v for k, v in _case(32).items() if k not in dropped}, "device": device, "status": "oom",
            "reason": "OutOfMemoryError: CUDA out of memory"}
    return {**_record(session, case, {}), "finished_at": finished_at}


def test_a_later_session_that_measured_nothing_hides_no_measured_session(tmp_path):
    """Break-it finding (h-breakE, the kind of c0b3164 within a store that has measurements): a device's latest
    session whose cases all ran out of memory was drawn as its section, an empty figure with no table and no word,
    and the session before it, measured, was shown nowhere. The latest session that measured a case is drawn, and
    the later one is named with what became of its cases; a device of no measured case gets that sentence alone."""
    import re

    measured = [{**_record("s1", {**_case(T), "device": "cuda:0"}, {}), "finished_at": "2026-12-01T00:00:00+00:00"}
                for T in (32, 64)]
    records = [*measured, _unmeasured("s2", "cuda:0", "2026-12-02T00:00:00+00:00"),
               _unmeasured("s3", "cuda:1", "2026-12-02T00:00:00+00:00")]
    out = tmp_path / "out"
    out.mkdir()
    markdown = _section(tmp_path, records, out)
    cuda0, cuda1 = markdown.split("### cuda:0")[1].split("### cuda:1")
    assert "session s1 (2026-12-01)" in cuda0 and "| linear | chunk | 1.0 [1] | 2.0 [2] |" in cuda0, cuda0
    assert "The latest session, s2 (2026-12-02), measured no case (1 oom); the latest session that measured one" \
        in cuda0, cuda0
    assert "s3 (2026-12-02), measured no case (1 oom); no session of this device measured one." in cuda1, cuda1
    assert re.findall(r"\]\((.+)\)", markdown) == ["bench_cuda_0.png"]
    assert sorted(path.name for path in out.iterdir()) == ["bench_cuda_0.png"]


def test_a_latest_session_that_measured_cases_is_never_said_to_have_measured_none(tmp_path):
    """Break-it finding (h-breakF): two sessions of one device overlapping in time (two ``fwbench bench`` at once
    on one GPU), s2 measuring T=32 and then running out of memory at T=64 after s1's last case: the section said
    "The latest session, s2 (…), measured no case (1 ok in the chunk-size sweep only, 1 oom)" and drew s1, s2 having
    measured a main case. The latest session (by its last record) that measured a case is drawn: s2, with no such
    sentence."""
    def measured(session, T, finished_at):
        return {**_record(session, {**_case(T), "device": "cuda:0"}, {}), "finished_at": finished_at}

    records = [measured("s1", 32, "2026-12-01T01:00:00+00:00"), measured("s2", 32, "2026-12-01T02:00:00+00:00"),
               measured("s1", 64, "2026-12-01T03:00:00+00:00"),
               _unmeasured("s2", "cuda:0", "2026-12-01T04:00:00+00:00")]
    out = tmp_path / "out"
    out.mkdir()
    markdown = _section(tmp_path, records, out)
    assert "measured no case" not in markdown, markdown
    assert "session s2 (2026-12-01)" in markdown and "session s1" not in markdown, markdown
