"""A run record whose fields below the top level are missing or of another type than fwbench writes
(a hand-edited runs.jsonl, another tool's JSON) is skipped and named by ``fwbench report``, as a record
missing a top-level field is (82ebd65); the report read them unchecked and raised a traceback.

Found by a break-it of 82ebd65 / 02f852d: 59 hand-made lines appended to a store of 27 real runs
(retrieval, MQAR, LM), ``fwbench report`` on each: 21 tracebacks, e.g. ``config.S = "3"`` (TypeError:
'<' not supported between instances of 'str' and 'int'), ``environment: null`` (AttributeError:
'NoneType' object has no attribute 'get'), ``wall_s`` written as 400 digits (OverflowError),
``final_evaluation.long_context`` of 3 buckets and 2 perplexities (ValueError: zip() argument 2 is
shorter than argument 1), an MQAR record without ``config.d_model`` (IntCastingNaNError)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from fwbench.analysis.records import readable_run_records, records_frame
from fwbench.cli import main
from fwbench.tasks import MQARConfig, RetrievalConfig, ShakespeareConfig

ROOT = Path(__file__).resolve().parents[2]

ENVIRONMENT = {"device": "cpu", "torch": "2.13.0+cpu", "threads": 1, "device_name": "CPU", "python": "3.11.7",
               "git_commit": "0000000"}


def run_record(task: str, run_id: str = "r1") -> dict:
    """A record as ``build_record`` writes it (every config field; the metrics the report reads)."""
    config = {"retrieval": RetrievalConfig(S=3, d_key=4), "mqar": MQARConfig(d_model=8),
              "shakespeare": ShakespeareConfig()}[task]
    metrics = {"best_eval_loss": 0.5, "final_eval_loss": 0.6, "best_step": 5, "parameters": 96}
    record = {"run_id": run_id, "grid": "g", "task": task, "seed": 1, "status": "max_steps", "steps": 10,
              "wall_s": 1.5, "steps_per_s": 6.7, "tokens_per_s": 160.0, "started_at": "2026-12-06T06:59:16+00:00",
              "ended_at": "2026-12-06T06:59:18+00:00", "diverged_at": None, "diverged_reason": None,
              "variant": {"spec": "linear", "d_dot": 4}, "config": asdict(config), "metrics": metrics,
              "environment": dict(ENVIRONMENT),
              "curve": [{"step": 5, "train_loss": 0.4, "eval_loss": 0.5}], "final_evaluation": None}
    if task != "shakespeare":
        metrics.update(best_eval_accuracy=0.5, final_eval_accuracy=0.25)
    else:
        metrics.update(best_eval_bpc=4.8, best_eval_ppl=28.0, val_loss=3.3, val_bpc=4.8, val_ppl=28.0)
        record["final_evaluation"] = {
            "long_context": {"buckets": [[0, 64], [64, 128]], "tokens": 128, "carried_ppl": [20.0, 19.0],
                             "reset_ppl": [21.0, 20.0], "carried_ppl_all": 19.5, "reset_ppl_all": 20.5},
            "carried_lengths": {"lengths": [64, 256], "ppl": [20.0, 21.0], "ppl_ratio": [1.0, 1.05], "tokens": 64},
            "sample": {"text": "It is", "prompt": "It", "temperature": 1.0, "seed": 1, "tokens": 3}}
    return record


def changed(task: str, path: str, value=None, *, drop: bool = False) -> dict:
    """``run_record(task)`` with the field at the dotted ``path`` set to ``value`` (or removed)."""
    record = copy.deepcopy(run_record(task, run_id=f"{task}:{path}"))
    *parents, last = path.split(".")
    container = record
    for part in parents:
        container = container[int(part)] if isinstance(container, list) else container[part]
    if drop:
        del container[last]
    else:
        container[last] = value
    return record


#: (task, field, value): each made ``fwbench report`` raise; the field each is named by
MISTYPED = [
    ("retrieval", "config.S", "3"),                              # TypeError: '<' between str and int
    ("retrieval", "config.S", None),                             # ValueError: cannot convert float NaN to integer
    ("retrieval", "config.status", 5),                           # overwrote the run's status: TypeError
    ("shakespeare", "config.lr", "fast"),                        # ValueError: could not convert string to float
    ("retrieval", "metrics.best_eval_loss", [0.5]),              # ValueError: setting an array element ...
    ("mqar", "metrics.best_eval_accuracy", "x"),                 # ValueError: could not convert string to float
    ("retrieval", "metrics.best_eval_loss", 10**400),            # OverflowError: int too large to convert
    ("retrieval", "wall_s", 10**400),                            # OverflowError
    ("retrieval", "variant.d_dot", "eight"),                     # TypeError: float / str
    ("retrieval", "environment", [1]),                           # AttributeError: 'list' ... 'get'
    ("retrieval", "started_at", 5),                              # TypeError: agg function failed
    ("shakespeare", "tokens_per_s", "x"),                        # ValueError: Unknown format code 'f'
    ("shakespeare", "curve", [1, 2]),                            # TypeError: argument of type 'int' ...
    ("shakespeare", "final_evaluation.long_context", {}),        # KeyError: 'buckets'
    ("shakespeare", "final_evaluation.long_context", None),      # TypeError: 'NoneType' not subscriptable
    ("shakespeare", "final_evaluation.long_context.carried_ppl", [20.0]),  # zip() argument 2 is shorter
    ("shakespeare", "final_evaluation.carried_lengths.ppl_ratio", []),     # IndexError
    ("shakespeare", "final_evaluation.sample.text", 5),          # TypeError: 'int' not subscriptable
]


@pytest.mark.parametrize(("task", "path", "value"), MISTYPED, ids=[f"{t}-{p}-{v!r}"[:60] for t, p, v in MISTYPED])
def test_a_record_mistyped_below_the_top_level_is_skipped_naming_the_field(task, path, value):
    named = path if path.startswith("config.") else ".".join(path.split(".")[:2])
    _, problems = readable_run_records([changed(task, path, value)], "runs.jsonl")
    assert problems == [f"runs.jsonl: record '{task}:{path}' skipped: no run record (missing or mistyped: {named})"]


def test_a_diverged_record_without_its_step_is_skipped():
    """A diverged Setting 2 run whose record has no ``diverged_at`` (null): the report lists every
    divergence with its step, and raised TypeError: int() argument must be ... not 'NoneType'."""
    record = {**changed("retrieval", "config.setting", 2), "status": "diverged", "diverged_at": None}
    _, problems = readable_run_records([record], "runs.jsonl")
    assert problems == ["runs.jsonl: record 'retrieval:config.setting' skipped: no run record "
                        "(missing or mistyped: diverged_at)"]
    assert readable_run_records([{**record, "diverged_at": 3}], "runs.jsonl")[1] == []


@pytest.mark.parametrize("task", ["retrieval", "mqar", "shakespeare"])
def test_records_as_fwbench_writes_them_are_read(task):
    """No false alarm: the record of each task, also with its optional fields null or absent (a run that
    failed has no curve; an environment written as null is no environment) and a NaN metric written as
    null and listed in ``non_finite``."""
    records = [run_record(task), changed(task, "environment", None), changed(task, "curve", drop=True),
               {**changed(task, "metrics.best_eval_loss", None), "non_finite": {"metrics.best_eval_loss": "nan"}}]
    readable, problems = readable_run_records(records, "runs.jsonl")
    assert problems == [] and len(readable) == 4
    frame = records_frame(readable)
    assert frame["device"].isna().tolist() == [False, True, False, False]  # null environment: no device (was a traceback)


def test_every_committed_paper_record_is_read():
    """The published stores (results/paper*: 150 records of retrieval and LM runs) pass the check whole."""
    from pathlib import Path

    for store in sorted(Path(__file__).parents[2].glob("results/paper*/runs.jsonl")):
        records = [json.loads(line) for line in store.read_text().splitlines() if line.strip()]
        readable, problems = readable_run_records(records, store)
        assert problems == [] and len(readable) == len(records), store


def test_the_report_is_written_beside_mistyped_records_and_names_each(tmp_path):
    """One store: a readable retrieval run and every record of :data:`MISTYPED`; ``fwbench report`` raised on
    the first it met (here config.S = "3": TypeError); now it is written, each record under Store problems."""
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    lines = [run_record("retrieval"), *(changed(*case) for case in MISTYPED)]
    (results / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    for task, path, _ in MISTYPED:
        assert f"record '{task}:{path}' skipped: no run record" in text, path


def test_a_config_field_the_record_lacks_is_read_as_its_default(tmp_path):
    """An MQAR record without ``config.d_model`` (a store older than a field, a hand-made record): the run's
    own config is ``MQARConfig(**config)``, so d_model is the default, 64; the report raised
    IntCastingNaNError (the d_model column NaN, cast to int by the MQAR table)."""
    record = changed("mqar", "config.d_model", drop=True)
    readable, problems = readable_run_records([record], "runs.jsonl")
    assert problems == [] and records_frame(readable)["d_model"].tolist() == [MQARConfig().d_model] == [64]
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    (results / "runs.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    mqar = (out / "REPORT.md").read_text().split("## Multi-query associative recall")[1].split("\n## ")[0]
    assert "| 64 | 0.500 |" in mqar


def test_a_config_field_of_a_type_the_check_does_not_know_is_read_whatever_it_holds(monkeypatch):
    """A task whose config has a field typed ``tuple[int, ...]`` (written as a JSON list): the check knows
    only int, float, str and bool, and must not skip that task's every record."""
    from dataclasses import asdict, dataclass, field

    from fwbench.analysis import records
    from fwbench.tasks import TASKS, RetrievalConfig

    @dataclass(frozen=True)
    class WithLengths(RetrievalConfig):
        lengths: tuple[int, ...] = field(default=(1, 2))

    monkeypatch.setattr(TASKS["retrieval"], "config_class", WithLengths)
    records._config_field_types.cache_clear()
    records._config_defaults.cache_clear()
    try:
        config = {**asdict(WithLengths()), "lengths": [4, 8, 16]}
        record = {"run_id": "x", "task": "retrieval", "variant": {"spec": "linear"}, "seed": 1,
                  "status": "max_steps", "steps": 10, "wall_s": 1.0, "config": config,
                  "metrics": {"best_eval_loss": 0.5}}
        assert records._mistyped_fields(record) == []
        assert records._mistyped_fields({**record, "config": {**config, "S": "3"}}) == ["config.S"]
    finally:
        records._config_field_types.cache_clear()
        records._config_defaults.cache_clear()


def test_a_store_of_mistyped_records_only_is_refused_naming_the_first_and_its_field(tmp_path, capsys):
    """A runs.jsonl whose every record is skipped (here ``environment.threads`` written as "4", then a line
    that is no JSON): the refusal called the records corrupt or truncated lines and named only the file,
    ``2 corrupt or truncated line(s) skipped, the first …/runs.jsonl``, though the report names each record
    and its field beside readable ones. Now corrupt lines and records that are no run record are counted
    apart, and the first record is named with its fields."""
    results = tmp_path / "results"
    results.mkdir()
    store = results / "runs.jsonl"
    store.write_text(json.dumps(changed("retrieval", "environment.threads", "4")) + "\nnot json\n")
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert (f"(no record in runs.jsonl or bench.jsonl; 1 corrupt or truncated line(s) skipped, the first {store}:2; "
            f"1 record(s) skipped as no run record, the first {store}: record 'retrieval:environment.threads' "
            "(missing or mistyped: environment.threads)); expected") in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("directory", ["results: old", "results skipped: no run record"])
def test_a_store_refused_names_its_path_and_run_id_exactly_whatever_they_hold(tmp_path, capsys, directory):
    """The refusal read its places back out of the problems' text: a --results-dir holding ': ' was cut there
    ('the first …/results'), and the first " skipped: no run record" was taken out wherever it stood, in a
    directory's name or a run id ('record 'x'' for 'x skipped: no run record', the marker left after it). Now
    each place is built from its parts: the path, the line number, the run id and its fields."""
    results = tmp_path / directory
    results.mkdir()
    store = results / "runs.jsonl"
    store.write_text("not json\n" + json.dumps({"run_id": "x skipped: no run record: corrupt or truncated record "
                                                           "skipped"}) + "\n")
    (results / "bench.jsonl").write_text("[1]\n")
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: {str(results)!r} holds no run records (no record in runs.jsonl or "
        f"bench.jsonl; 2 corrupt or truncated line(s) skipped, the first {store}:1; 1 record(s) skipped as no run "
        f"record, the first {store}: record 'x skipped: no run record: corrupt or truncated record skipped' (missing "
        "or mistyped: task, variant, seed, status, steps, wall_s, config, metrics)); expected the directory that "
        f"fwbench run, reproduce or bench wrote to; nothing was written to {str(tmp_path / 'out')!r}\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("records_file", ["runs.jsonl", "bench.jsonl"])
def test_a_records_file_that_is_a_directory_is_refused_in_one_line(tmp_path, capsys, records_file):
    """Break-it finding (h-breakA): R/runs.jsonl (or R/bench.jsonl) a directory (``mkdir -p R/runs.jsonl``) made
    ``fwbench report`` a traceback, IsADirectoryError, from its check of an empty store; it is refused in one line
    naming the file, before --out is made."""
    results = tmp_path / "results"
    (results / records_file).mkdir(parents=True)
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: cannot read {str(results / records_file)!r}: Is a directory; expected a file "
        "of records, one JSON line each (move the directory or file away)\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("records_file", ["runs.jsonl", "bench.jsonl"])
def test_a_records_file_that_is_a_link_looping_back_is_refused_in_one_line(tmp_path, capsys, records_file):
    """Break-it finding (h-breakC): R/runs.jsonl a link that loops (``ln -s runs.jsonl R/runs.jsonl``) was read as no
    file (Path.exists says False for it): ``fwbench report`` called the store empty ("holds no run records"), and a
    bench.jsonl so made, beside a readable runs.jsonl, was drawn as "No benchmark records yet", without a word. Each
    is named in one line, as C204 names a directory, before --out is made."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "runs.jsonl").write_text(json.dumps(run_record("retrieval")) + "\n")
    (results / records_file).unlink(missing_ok=True)
    (results / records_file).symlink_to(records_file)
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: cannot read {str(results / records_file)!r}: Too many levels of symbolic "
        "links; expected a file of records, one JSON line each (remove the link or point it at the records file)\n")
    assert not (tmp_path / "out").exists()


#: A grid of one retrieval run of two steps, for the refusals of ``fwbench run``'s store.
TINY_GRID = ('name = "one"\ntask = "retrieval"\n[defaults]\neval_every = 2\nmax_steps = 2\n[profiles.quick]\n'
             'variant = "linear"\nS = 3\nseed = 1\n')


def test_a_records_file_linked_into_a_missing_directory_names_the_link(tmp_path, capsys):
    """Break-it finding (h-breakE): R/runs.jsonl a link to ../nodir/x.jsonl (a link to nothing, which a run writes
    through, its target's directory missing): ``fwbench run`` said "cannot write 'R/runs.jsonl': No such file or
    directory", R being there, and no remedy. The link and its target's directory are named; the advice followed,
    the run writes its record through the link."""
    results = tmp_path / "R"
    results.mkdir()
    (results / "runs.jsonl").symlink_to("../nodir/x.jsonl")
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = ["run", str(grid), "--results-dir", str(results), "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: cannot write {str(results / 'runs.jsonl')!r}, a link to '../nodir/x.jsonl': "
        "No such file or directory; expected a records file or a link to one that can be made (create "
        f"{str(tmp_path / 'nodir')!r} or point the link elsewhere)\n")
    (tmp_path / "nodir").mkdir()  # the advice followed
    assert main(argv) == 0
    assert len((tmp_path / "nodir" / "x.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_results_directory_that_is_a_link_to_nothing_is_told_so(tmp_path, capsys, command, under):
    """Break-it finding (h-breakE): --results-dir R a link to nothing (``ln -s gone R``; or R/x under it): ``fwbench
    run`` and ``fwbench bench`` said "cannot create 'R': File exists" (mkdir meets the link). The link is named with
    the directory to create; the advice followed, the run stores its record."""
    link = tmp_path / "R"
    link.symlink_to("gone")
    results = link / "x" if under else link
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = {"run": ["run", str(grid), "--results-dir", str(results), "--quiet"],
            "bench": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                      "--results-dir", str(results), "--quiet"]}[command]
    assert main(argv) == 2
    under_text = f" under {str(link)!r}," if under else ""
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: got {str(results)!r},{under_text} a link to 'gone', which does not exist; "
        f"expected a directory (or a new path) (create {str(tmp_path / 'gone')!r} or remove the link)\n")
    if command == "run":
        (tmp_path / "gone").mkdir()  # the advice followed
        assert main(argv) == 0 and (results / "runs.jsonl").is_file()


@pytest.mark.parametrize("lock", ["runs.lock", "bench.lock"])
def test_a_lock_file_linked_into_a_missing_directory_names_the_link(tmp_path, capsys, lock):
    """Break-it finding (h-breakF), the kind of 66ffca6 for the lock file: R/runs.lock a link into a directory that
    does not exist (``ln -s ../nodir/l R/runs.lock``) said "cannot open 'R/runs.lock': No such file or directory", R
    being there, and no remedy. The link and the directory to create are named; the advice followed, the run stores
    its record."""
    results = tmp_path / "R"
    results.mkdir()
    (results / lock).symlink_to("../nodir/l")
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = {"runs.lock": ["run", str(grid), "--results-dir", str(results), "--quiet"],
            "bench.lock": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                           "--results-dir", str(results), "--quiet"]}[lock]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: cannot open {str(results / lock)!r}, a link to '../nodir/l': No such file "
        f"or directory; expected a lock file or a link to one that can be made (create {str(tmp_path / 'nodir')!r} "
        "or point the link elsewhere)\n")
    assert not (tmp_path / "nodir").exists()
    if lock == "runs.lock":
        (tmp_path / "nodir").mkdir()  # the advice followed
        assert main(argv) == 0 and (results / "runs.jsonl").is_file()


@pytest.mark.parametrize("kind", ["a link into a missing directory", "a directory", "a loop"])
def test_a_claims_file_that_cannot_be_opened_is_refused_in_one_line_before_training(tmp_path, capsys, kind):
    """Break-it finding (h-breakH): R/claims.lock (the file whose byte-range locks claim runs) a link into a directory
    that does not exist, a directory, or a link looping back to itself: ``fwbench run`` ended in a traceback
    (``FileNotFoundError``, ``IsADirectoryError``, ``OSError: [Errno 40]`` from os.open at the first claim). It is
    refused in one line by check_writable, before any training, naming the file, what it must be and the mend; the
    advice followed, the run stores its record."""
    results = tmp_path / "R"
    results.mkdir()
    claims = results / "claims.lock"
    if kind == "a directory":
        claims.mkdir()
        why, mend = "Is a directory; expected a claims file (move the directory away)", lambda: claims.rmdir()
    elif kind == "a loop":
        claims.symlink_to("claims.lock")
        why = "Too many levels of symbolic links; expected a claims file (remove the link or point it at a file)"
        mend = claims.unlink
    else:
        claims.symlink_to("../nodir/c")
        why = (f"No such file or directory; expected a claims file or a link to one that can be made (create "
               f"{str(tmp_path / 'nodir')!r} or point the link elsewhere)")
        mend = (tmp_path / "nodir").mkdir
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = ["run", str(grid), "--results-dir", str(results), "--quiet"]
    assert main(argv) == 2
    named = f"{str(claims)!r}, a link to '../nodir/c'" if kind == "a link into a missing directory" else repr(str(claims))
    assert capsys.readouterr().err == f"fwbench: error: --results-dir: cannot open {named}: {why}\n"
    assert (results / "runs.jsonl").read_text() == ""  # refused before any training
    mend()  # the advice followed
    assert main(argv) == 0
    assert len((results / "runs.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("kind", ["a link into a missing directory", "a directory", "a loop"])
def test_a_torn_lines_file_that_cannot_be_opened_is_named_before_training(tmp_path, capsys, kind):
    """Break-it finding (h-breakH): R/runs.jsonl ending in a torn line (a writer killed mid-write) and
    R/runs.jsonl.torn, where the next append moves that line, a directory, a link looping back to itself, or a link
    into a directory that does not exist: ``fwbench run`` trained the run, then said "cannot write 'R/runs.jsonl': Is
    a directory" (…), the records file, which was fine, and lost the run. The torn-lines file is named, with what it
    must be and the mend, before any training; the advice followed, the line is set aside and the run stored."""
    results = tmp_path / "R"
    results.mkdir()
    kept = '{"run_id": "a", "status": "failed"}\n'
    (results / "runs.jsonl").write_text(kept + '{"run_id": "b", "me')
    torn = results / "runs.jsonl.torn"
    named = repr(str(torn))
    if kind == "a directory":
        torn.mkdir()
        why, mend = "Is a directory; expected a file for torn lines (move the directory away)", torn.rmdir
    elif kind == "a loop":
        torn.symlink_to("runs.jsonl.torn")
        why = "Too many levels of symbolic links; expected a file for torn lines (remove the link or point it at a file)"
        mend = torn.unlink
    else:
        torn.symlink_to("../nodir/t")
        named = f"{named}, a link to '../nodir/t'"
        why = (f"No such file or directory; expected a file for torn lines or a link to one that can be made (create "
               f"{str(tmp_path / 'nodir')!r} or point the link elsewhere)")
        mend = (tmp_path / "nodir").mkdir
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = ["run", str(grid), "--results-dir", str(results), "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"fwbench: error: --results-dir: cannot open {named}: {why}"
    assert (results / "runs.jsonl").read_text() == kept + '{"run_id": "b", "me'  # nothing written, nothing trained
    mend()  # the advice followed
    assert main(argv) == 0
    assert torn.read_text() == '{"run_id": "b", "me\n'
    assert len((results / "runs.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("kind", ["a directory", "a loop", "a link under a file"])
def test_a_lock_file_that_cannot_be_opened_says_what_it_must_be(tmp_path, capsys, kind):
    """Break-it finding (h-breakH): R/runs.lock a directory, a link looping back to itself, or a link to a path under
    a file: ``fwbench run`` said only "cannot open 'R/runs.lock': Is a directory" ("Too many levels of symbolic
    links", "Not a directory"), with neither what it must be nor a remedy. Both are said (and the file that blocks
    the link's target); the advice followed, the run stores its record."""
    results = tmp_path / "R"
    results.mkdir()
    lock = results / "runs.lock"
    named = repr(str(lock))
    if kind == "a directory":
        lock.mkdir()
        why, mend = "Is a directory; expected a lock file (move the directory away)", lock.rmdir
    elif kind == "a loop":
        lock.symlink_to("runs.lock")
        why, mend = ("Too many levels of symbolic links; expected a lock file (remove the link or point it at a "
                     "file)"), lock.unlink
    else:
        (tmp_path / "notes.txt").write_text("notes\n")
        lock.symlink_to("../notes.txt/l")
        named = f"{named}, a link to '../notes.txt/l'"
        why = (f"Not a directory ({str(tmp_path / 'notes.txt')!r} is a file); expected a lock file (remove the link "
               "or point it elsewhere)")
        mend = lock.unlink
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = ["run", str(grid), "--results-dir", str(results), "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"fwbench: error: --results-dir: cannot open {named}: {why}\n"
    mend()  # the advice followed
    assert main(argv) == 0
    assert len((results / "runs.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_results_directory_that_is_a_chain_of_links_to_nothing_names_each_link(tmp_path, capsys, under):
    """Break-it finding (h-breakF): --results-dir R, a link to a link to nothing (``ln -s mid R; ln -s gone mid``):
    the refusal said "a link to 'mid', which does not exist", and mid is there (a link). Each link is named to the
    missing end; the advice followed, the run stores its record."""
    link = tmp_path / "R"
    link.symlink_to("mid")
    (tmp_path / "mid").symlink_to("gone")
    results = link / "x" if under else link
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = ["run", str(grid), "--results-dir", str(results), "--quiet"]
    assert main(argv) == 2
    under_text = f" under {str(link)!r}," if under else ""
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: got {str(results)!r},{under_text} a link to 'mid', a link to 'gone', which "
        f"does not exist; expected a directory (or a new path) (create {str(tmp_path / 'gone')!r} or remove the "
        "links)\n")
    (tmp_path / "gone").mkdir()  # the advice followed
    assert main(argv) == 0 and (results / "runs.jsonl").is_file()


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_results_directory_linked_under_a_file_is_not_advised_to_be_created(tmp_path, capsys, command, under):
    """Break-it finding (h-breakF): --results-dir R, a link to a path under a file (``ln -s notes.txt/sub R``):
    the advice was "create '…/notes.txt/sub'", which no one can (notes.txt is a file). The file is named, and the
    advice is to remove or repoint the link; followed, the run stores its record."""
    (tmp_path / "notes.txt").write_text("notes\n")
    link = tmp_path / "R"
    link.symlink_to("notes.txt/sub")
    results = link / "x" if under else link
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = {"run": ["run", str(grid), "--results-dir", str(results), "--quiet"],
            "bench": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                      "--results-dir", str(results), "--quiet"]}[command]
    assert main(argv) == 2
    under_text = f" under {str(link)!r}," if under else ""
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: got {str(results)!r},{under_text} a link to 'notes.txt/sub', which does not "
        f"exist and cannot be made ({str(tmp_path / 'notes.txt')!r} is a file); expected a directory (or a new path) "
        "(remove the link or point it at a directory)\n")
    assert (tmp_path / "notes.txt").read_text() == "notes\n"
    if command == "run":
        link.unlink()  # the advice followed: the link pointed at a directory
        (tmp_path / "d").mkdir()
        link.symlink_to("d")
        assert main(argv) == 0 and (results / "runs.jsonl").is_file()


# estimate --against on a loop is told by ResultsStore.load (62ae02a, test_a_results_directory_that_is_a_looping_link…)
@pytest.mark.parametrize("command, kind", [("report", "to nothing"), ("report", "a chain to nothing"),
                                           ("report", "a loop"), ("estimate", "to nothing"),
                                           ("estimate", "a chain to nothing")])
@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_results_directory_to_read_that_is_a_broken_link_names_the_link(tmp_path, capsys, command, kind, under):
    """Break-it finding (h-breakF): a results directory to read that is (or lies under) a link to nothing or a
    link looping back to itself: ``fwbench report --results-dir R`` said "got 'R', which is not a directory" and
    ``fwbench estimate --against R`` "no records file 'R/runs.jsonl'", the link unnamed, where run and bench name it
    (C222, C225). The link is named; the advice followed (the link pointed at the directory a run wrote), both read
    its record."""
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    stored = tmp_path / "stored"
    assert main(["run", str(grid), "--results-dir", str(stored), "--quiet"]) == 0
    capsys.readouterr()
    link = tmp_path / "R"
    if kind == "a loop":
        link.symlink_to("R")
        why = "a link that leads back to itself (a loop)"
    elif kind == "a chain to nothing":
        link.symlink_to("mid")
        (tmp_path / "mid").symlink_to("gone")
        why = "a link to 'mid', a link to 'gone', which does not exist"
    else:
        link.symlink_to("gone")
        why = "a link to 'gone', which does not exist"
    results = link / "x" if under else link
    out = tmp_path / "out"
    argv = {"report": ["report", "--results-dir", str(results), "--out", str(out)],
            "estimate": ["estimate", str(grid), "--against", str(results)]}[command]
    option, expected = {"report": ("--results-dir", "the directory that fwbench run wrote to"),
                        "estimate": ("--against", "a results directory that fwbench run wrote")}[command]
    assert main(argv) == 2
    under_text = f" under {str(link)!r}," if under else ""
    assert capsys.readouterr().err == (
        f"fwbench: error: {option}: got {str(results)!r},{under_text} {why}; expected {expected} (point the link at "
        "it)\n")
    assert not out.exists()
    link.unlink()  # the advice followed
    link.symlink_to(stored / "x" if under else stored)
    if under:
        (stored / "x").symlink_to(stored)
    assert main(argv) == 0


@pytest.mark.parametrize("command", ["run", "estimate", "bench"])
@pytest.mark.parametrize("under", [False, True], ids=["the directory", "a directory above"])
def test_a_results_directory_that_is_a_looping_link_is_told_so(tmp_path, capsys, command, under):
    """Break-it finding (h-breakE): --results-dir R a link that loops (``ln -s R R``; or R/x/y under such a link):
    ``fwbench run`` and ``estimate --against`` said "cannot read 'R/runs.jsonl': Too many levels of symbolic links; ...
    (move the directory or file away)", R/runs.jsonl being neither, and ``fwbench bench`` "cannot create 'R': File
    exists"; each now names the looping link and how to mend it, before anything is written."""
    loop = tmp_path / "R"
    loop.symlink_to("R")
    results = loop / "x" / "y" if under else loop
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    argv = {"run": ["run", str(grid), "--results-dir", str(results), "--quiet"],
            "estimate": ["estimate", str(grid), "--against", str(results)],
            "bench": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                      "--results-dir", str(results), "--quiet"]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "move the directory or file away" not in err and "File exists" not in err, err
    assert f"{str(loop)!r}" in err and "leads back to itself (a loop)" in err and "point it at a directory" in err, err


@pytest.mark.parametrize("command", ["run", "report", "estimate", "bench"])
@pytest.mark.parametrize("kind", ["a link", "a chain of links", "a link into itself", "itself through a linked directory",
                                  "itself by '..'"])
def test_a_results_directory_that_leads_into_another_links_loop_names_that_link(tmp_path, capsys, command, kind):
    """Break-it finding (h-breakH): --results-dir R, a link into the loop of another link (``ln -s loop/sub R;
    ln -s loop loop``, or a chain, ``ln -s mid R; ln -s loop/sub mid``): run, report, estimate and bench called R
    "a link that leads back to itself (a loop)", which it is not, and left 'loop', the link that loops, unnamed.
    Each link of R is named, to the one that loops; the advice followed (R pointed at the directory a run wrote),
    each goes on. Break-it finding (h-breakJ): R a link to itself spelled another way, by an absolute path through a
    linked directory (``ln -s /via/R R``, /via a link to R's directory) or with '..' (``ln -s ../d/R R``), was "a link
    to '/via/R', which leads into '/via/R', a link that leads back to itself", R said to lead into another link: it
    is R's own loop, as ``ln -s R R`` is."""
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    stored = tmp_path / "stored"
    assert main(["run", str(grid), "--results-dir", str(stored), "--quiet"]) == 0
    capsys.readouterr()
    (tmp_path / "loop").symlink_to("loop")
    results = tmp_path / "R"
    if kind == "a chain of links":
        results.symlink_to("mid")
        (tmp_path / "mid").symlink_to("loop/sub")
        named = "a link to 'mid', a link to 'loop/sub'"
    elif kind == "itself through a linked directory":
        (tmp_path / "via").symlink_to(tmp_path)
        results.symlink_to(tmp_path / "via" / "R")
    elif kind == "itself by '..'":
        results.symlink_to(f"../{tmp_path.name}/R")
    else:
        results.symlink_to("R/x" if kind == "a link into itself" else "loop/sub")
        named = "a link to 'loop/sub'"
    if kind in ("a link", "a chain of links"):
        why = f"{named}, which leads into {str(tmp_path / 'loop')!r}, a link that leads back to itself (a loop)"
    else:  # ln -s R/x R: R's loop is its own (the walk to the loop's link recursed forever)
        why = "a link that leads back to itself (a loop)"
    out = tmp_path / "out"
    argv = {"run": ["run", str(grid), "--results-dir", str(results), "--quiet"],
            "report": ["report", "--results-dir", str(results), "--out", str(out)],
            "estimate": ["estimate", str(grid), "--against", str(results)],
            "bench": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                      "--results-dir", str(results), "--quiet"]}[command]
    expected = {
        "run": f"--results-dir: cannot read {str(results / 'runs.jsonl')!r}: Too many levels of symbolic links; "
               f"expected a file of records, one JSON line each ({str(results)!r} is {why}: remove it or point it at "
               "a directory)",
        "report": f"--results-dir: got {str(results)!r}, {why}; expected the directory that fwbench run wrote to "
                  "(point the link at it)",
        "estimate": f"--against: cannot read {str(results / 'runs.jsonl')!r}: Too many levels of symbolic links; "
                    f"expected a file of records, one JSON line each ({str(results)!r} is {why}: remove it or point "
                    "it at a directory)",
        "bench": f"--results-dir: got {str(results)!r}, {why}; expected a directory (or a new path) (remove the link "
                 "or point it at a directory)"}[command]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"fwbench: error: {expected}\n"
    assert not out.exists()
    if command != "bench":  # (bench measures for minutes once it goes on)
        results.unlink()  # the advice followed
        results.symlink_to(stored)
        assert main(argv) == 0


@pytest.mark.parametrize("command", ["report", "estimate"])
@pytest.mark.parametrize("kind", ["a link", "a chain of links"])
def test_a_records_file_to_read_that_is_a_link_to_nothing_names_the_link(tmp_path, capsys, command, kind):
    """Break-it finding (h-breakH): R/runs.jsonl a link to nothing (``ln -s gone.jsonl R/runs.jsonl``, a moved or
    unmounted store; or a chain, ``ln -s mid R/runs.jsonl; ln -s ../nodir/x R/mid``): ``fwbench report`` said
    "'R' holds no run records (no record in runs.jsonl or bench.jsonl)" and ``estimate --against R`` "no records file
    'R/runs.jsonl'", the link there and unnamed. Each link is named; the advice followed (the link pointed at the
    records a run wrote), both read them."""
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    stored = tmp_path / "stored"
    assert main(["run", str(grid), "--results-dir", str(stored), "--quiet"]) == 0
    capsys.readouterr()
    results = tmp_path / "R"
    results.mkdir()
    link = results / "runs.jsonl"
    if kind == "a chain of links":
        link.symlink_to("mid")
        (results / "mid").symlink_to("../nodir/x")
        named = "a link to 'mid', a link to '../nodir/x'"
    else:
        link.symlink_to("gone.jsonl")
        named = "a link to 'gone.jsonl'"
    out = tmp_path / "out"
    argv = {"report": ["report", "--results-dir", str(results), "--out", str(out)],
            "estimate": ["estimate", str(grid), "--against", str(results)]}[command]
    option = {"report": "--results-dir", "estimate": "--against"}[command]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: {option}: cannot read {str(link)!r}, {named}, which does not exist; expected a file of "
        "records, one JSON line each (point the link at the records file or remove it)\n")
    assert not out.exists() and not (tmp_path / "nodir").exists()
    link.unlink()  # the advice followed
    link.symlink_to(stored / "runs.jsonl")
    assert main(argv) == 0


@pytest.mark.parametrize("command, file", [("run", "runs.jsonl"), ("run", "/dev/null"), ("run", "runs.lock"),
                                           ("run", "claims.lock"), ("report", "runs.jsonl"), ("estimate", "runs.jsonl"),
                                           ("bench", "bench.jsonl")])
def test_a_store_file_that_is_a_pipe_or_a_device_is_refused_not_opened(tmp_path, command, file):
    """Break-it finding (h-breakH): R/runs.jsonl a named pipe (``mkfifo R/runs.jsonl``; also runs.lock, claims.lock,
    bench.jsonl): ``fwbench run``, ``report``, ``estimate --against`` and ``bench`` hung for ever opening it, with no
    word; R/runs.jsonl a link to /dev/null: ``fwbench run`` said "1 trained now" and its record was gone (the next
    run trained it again). Each is refused in one line naming the file and what it is; the advice followed, the run
    stores its record. (Subprocesses with a timeout: the old code blocks in open.)"""
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    results = tmp_path / "R"
    results.mkdir()
    if file == "/dev/null":
        path = results / "runs.jsonl"
        path.symlink_to("/dev/null")
        got = f"{str(path)!r}, a link to '/dev/null', a character device"
        remedy = "remove the link or point it at a regular file"
    else:
        path = results / file
        os.mkfifo(path)
        got, remedy = f"{str(path)!r}, a named pipe (FIFO)", "move it away"
    what = {"runs.lock": "a lock file", "claims.lock": "a claims file"}.get(file, "a file of records, one JSON line each")
    argv = {"run": ["run", str(grid), "--results-dir", str(results), "--quiet"],
            "report": ["report", "--results-dir", str(results), "--out", str(tmp_path / "out")],
            "estimate": ["estimate", str(grid), "--against", str(results)],
            "bench": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                      "--results-dir", str(results), "--quiet"]}[command]
    option = "--against" if command == "estimate" else "--results-dir"

    def fwbench() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fwbench", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)

    done = fwbench()
    assert (done.returncode, done.stderr) == (
        2, f"fwbench: error: {option}: got {got}; expected {what} ({remedy})\n"), done.stdout + done.stderr
    if command == "run":
        path.unlink()  # the advice followed
        assert fwbench().returncode == 0
        assert len((results / "runs.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("command, target", [("run", "a directory"), ("report", "a directory"),
                                             ("estimate", "a directory"), ("bench", "a directory"),
                                             ("bench", "a named pipe")])
def test_a_records_file_linked_to_no_file_makes_no_lock_beside_its_target(tmp_path, command, target):
    """Break-it finding (h-breakJ): R/runs.jsonl (bench.jsonl) a link to a directory or a named pipe in another
    directory (``ln -s ../P/sub R/runs.jsonl``; ``ln -s ../P/fifo R/bench.jsonl``; ``ln -s /dev/null …`` made
    /dev/runs.lock): the lock file moved beside the link's target as if it were a records file, so ``fwbench run``,
    ``report``, ``estimate --against`` and ``bench`` made P/runs.lock (P/bench.lock), in a directory never named,
    before refusing the records file. They are refused as before, and P is left as it was."""
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    results, elsewhere = tmp_path / "R", tmp_path / "P"
    results.mkdir()
    elsewhere.mkdir()
    records = "bench.jsonl" if command == "bench" else "runs.jsonl"
    if target == "a directory":
        (elsewhere / "sub").mkdir()
        (results / records).symlink_to("../P/sub")
        expected = (f"cannot read {str(results / records)!r}: Is a directory; expected a file of records, one JSON "
                    "line each (remove the link or point it at the records file)")
    else:
        os.mkfifo(elsewhere / "fifo")
        (results / records).symlink_to("../P/fifo")
        expected = (f"got {str(results / records)!r}, a link to '../P/fifo', a named pipe (FIFO); expected a file of "
                    "records, one JSON line each (remove the link or point it at a regular file)")
    argv = {"run": ["run", str(grid), "--results-dir", str(results), "--quiet"],
            "report": ["report", "--results-dir", str(results), "--out", str(tmp_path / "out")],
            "estimate": ["estimate", str(grid), "--against", str(results)],
            "bench": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                      "--results-dir", str(results), "--quiet"]}[command]
    option = "--against" if command == "estimate" else "--results-dir"
    done = subprocess.run([sys.executable, "-m", "fwbench", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    if command == "bench" and target == "a directory":  # refused where bench.jsonl is opened to append
        expected = (f"cannot write {str(results / records)!r}, a link to '../P/sub': Is a directory; expected a "
                    "records file (remove the link or point it at a file)")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"fwbench: error: {option}: {expected}"), done.stderr
    assert sorted(path.name for path in elsewhere.iterdir()) == ["fifo" if target == "a named pipe" else "sub"]


@pytest.mark.parametrize("file", ["claims.lock", "runs.lock", "runs.jsonl.torn", "bench.jsonl"])
def test_a_store_file_that_is_a_link_to_a_directory_is_named_as_a_link(tmp_path, capsys, file):
    """Break-it finding (h-breakJ): R/claims.lock a link to a directory (``ln -s ../P/sub R/claims.lock``; also
    runs.lock, runs.jsonl.torn where runs.jsonl ends in a torn line, and bench.jsonl for ``fwbench bench``) was
    refused as if it were the directory, "cannot open 'R/claims.lock': Is a directory; … (move the directory away)":
    the advice named the link's target, a directory of the user's own, as the thing to move. The link is named, and
    the remedy is the link's; the advice followed, the command goes on."""
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    results = tmp_path / "R"
    results.mkdir()
    (tmp_path / "P" / "sub").mkdir(parents=True)
    (tmp_path / "P" / "sub" / "mine.txt").write_text("notes\n")
    link = results / file
    link.symlink_to("../P/sub")
    if file == "runs.jsonl.torn":
        (results / "runs.jsonl").write_text('{"run_id": "x", "sta')
    argv = (["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras", "--results-dir",
             str(results), "--quiet"] if file == "bench.jsonl"
            else ["run", str(grid), "--results-dir", str(results), "--quiet"])
    what = {"claims.lock": "a claims file", "runs.lock": "a lock file", "runs.jsonl.torn": "a file for torn lines",
            "bench.jsonl": "a records file"}[file]
    verb = "write" if file == "bench.jsonl" else "open"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"fwbench: error: --results-dir: cannot {verb} {str(link)!r}, a link to '../P/sub': Is a "
                        f"directory; expected {what} (remove the link or point it at a file)\n"), err
    link.unlink()  # the advice followed
    assert main(argv) == 0
    assert (tmp_path / "P" / "sub" / "mine.txt").read_text() == "notes\n"


@pytest.mark.parametrize("command", ["run", "report", "estimate", "bench"])
@pytest.mark.parametrize("kind", ["a name too long", "a path too long"])
def test_a_results_directory_whose_path_is_too_long_is_refused_in_one_line(tmp_path, capsys, monkeypatch, command,
                                                                           kind):
    """Break-it finding (h-breakJ): --results-dir holding a name longer than the file system allows (300 bytes; most
    allow 255), or a path longer than the system's limit: run, report, estimate --against and bench ended in a
    traceback, "OSError: [Errno 36] File name too long" (ResultsStore's first look at the records file). Each is
    refused in one line naming the name too long, or the path's length, and the limit; nothing is created."""
    monkeypatch.chdir(tmp_path)
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    name = "a" * 300
    results = name if kind == "a name too long" else "/".join(["b" * 200] * 25)
    option = "--against" if command == "estimate" else "--results-dir"
    argv = {"run": ["run", str(grid), "--results-dir", results, "--quiet"],
            "report": ["report", "--results-dir", results, "--out", str(tmp_path / "out")],
            "estimate": ["estimate", str(grid), "--against", results],
            "bench": ["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras",
                      "--results-dir", results, "--quiet"]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    if kind == "a name too long":
        why = (f"got a directory path holding the name '{'a' * 20}…{'a' * 10}', of 300 bytes: File name too long; "
               f"expected names of at most {os.pathconf('/', 'PC_NAME_MAX')} bytes (shorten it)")
    else:
        why = (f"got a directory path of {len(results)} bytes: File name too long; expected at most "
               f"{os.pathconf('/', 'PC_PATH_MAX') - len('runs.jsonl') - 2 - (command == 'bench')} bytes (shorten it)")
    assert err == f"fwbench: error: {option}: {why}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["grid.toml"]


@pytest.mark.parametrize("kind", ["a loop", "a link into a loop"])
def test_a_checkpoints_entry_that_loops_does_not_stop_a_grid_that_keeps_no_checkpoint(tmp_path, kind):
    """Break-it finding (h-breakH): R/checkpoints a link that loops (``ln -s checkpoints R/checkpoints``, or a link into
    another's loop): ``fwbench run`` of any grid ended in a traceback, "RuntimeError: Symlink loop from …" (Path.resolve
    of the checkpoint directory, computed for every grid). A retrieval grid, which keeps no checkpoint, stores its
    record."""
    results = tmp_path / "R"
    results.mkdir()
    if kind == "a loop":
        (results / "checkpoints").symlink_to("checkpoints")
    else:
        (tmp_path / "loop").symlink_to("loop")
        (results / "checkpoints").symlink_to("../loop/c")
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    assert main(["run", str(grid), "--results-dir", str(results), "--quiet"]) == 0
    assert len((results / "runs.jsonl").read_text().splitlines()) == 1


LM_CHECKPOINT_GRID = ('name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "linear"\nseed = 1\nd_model = 16\n'
                      'n_heads = 2\nn_layers = 1\nd_ff = 32\ncontext = 16\nbatch_size = 4\nmax_steps = 4\neval_every = 2\n'
                      'eval_segments = 2\nstream_eval = false\nsample_tokens = 5\ncheckpoint_every = 2\n')


@pytest.mark.skipif(not os.environ.get("FWBENCH_DATA_DIR"), reason="needs Tiny Shakespeare ($FWBENCH_DATA_DIR)")
@pytest.mark.parametrize("kind", ["a file", "a loop", "a named pipe", "a link to a file", "a link to a device"])
def test_a_checkpoints_entry_that_cannot_be_a_directory_is_refused_before_training(tmp_path, capsys, kind):
    """Break-it finding (h-breakH): R/checkpoints a file, or a link that loops, with a grid that keeps checkpoints
    (``checkpoint_every`` > 0, the language model's default): every run trained to its first checkpoint and failed
    there, "run … failed: FileExistsError: [Errno 17] File exists: '…/R/checkpoints'" (exit 0, '1 failed'). It is
    refused in one line before any training; the advice followed, the run stores its record. Break-it finding
    (h-breakJ): a named pipe there, or a link to a file or a device, was told by mkdir's errno alone, "got
    'R/checkpoints', File exists", "a link to 'notes.txt': File exists": each is now said to be what it is."""
    results = tmp_path / "R"
    results.mkdir()
    entry = results / "checkpoints"
    if kind == "a file":
        entry.write_text("notes\n")
        why, remedy = "a file", "move it away"
    elif kind == "a loop":
        entry.symlink_to("checkpoints")
        why, remedy = "a link that leads back to itself (a loop)", "remove the link or point it at a directory"
    elif kind == "a named pipe":
        os.mkfifo(entry)
        why, remedy = "a named pipe (FIFO)", "move it away"
    else:
        target = "../notes.txt" if kind == "a link to a file" else "/dev/null"
        (tmp_path / "notes.txt").write_text("notes\n")
        entry.symlink_to(target)
        why = f"a link to {target!r}, " + ("a file" if kind == "a link to a file" else "a character device")
        remedy = "remove the link or point it at a directory"
    grid = tmp_path / "grid.toml"
    grid.write_text(LM_CHECKPOINT_GRID)
    argv = ["run", str(grid), "--results-dir", str(results), "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: got {str(entry)!r}, {why}; expected a directory for the runs' checkpoints, "
        f"or no such path ({remedy})\n")
    assert (results / "runs.jsonl").read_text() == ""  # nothing trained
    entry.unlink()  # the advice followed
    assert main(argv) == 0
    assert [json.loads(line)["status"] for line in (results / "runs.jsonl").read_text().splitlines()] != ["failed"]


@pytest.mark.parametrize("name", ["R\nnew", "R\tx", "R-\udcff"], ids=["newline", "tab", "not UTF-8"])
def test_a_store_refused_is_named_on_one_line_whatever_its_path_holds(tmp_path, capsys, name):
    """Break-it finding (h-breakA): the refusal's places were the paths as they are, so a --results-dir holding a
    newline split the one-line error in two ('the first R' / 'new/runs.jsonl:1'). Each character that is not
    printable is written as repr writes it, as the quoted --results-dir at the start of the message is."""
    results = tmp_path / name
    results.mkdir()
    (results / "runs.jsonl").write_text('not json\n{"run_id": "x"}\n')
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    shown = f"{tmp_path}/{repr(name)[1:-1]}/runs.jsonl"
    assert err.count("\n") == 1 and err.startswith(f"fwbench: error: --results-dir: {str(results)!r} holds no run ")
    assert f"the first {shown}:1; 1 record(s) skipped as no run record, the first {shown}: record 'x' (" in err


def test_every_line_naming_a_path_that_holds_a_newline_stays_one_line(tmp_path, capsys):
    """Break-it finding (h-breakC), the kind of C205 beyond the empty store: a --results-dir (or grid file) whose name
    holds a newline split other one-line messages in two, 'a record in R' / 'new names a variant ...' (the refusal
    of a variant this process does not know), 'grid g' / 'rid.toml: malformed TOML', and the store's skipped lines
    and records, in warnings and in REPORT.md's lists. Each path is written escaped, 'R\\nnew'."""
    from fwbench.bench.suite import BENCH_RECORDS

    results = tmp_path / "R\nnew"
    results.mkdir()
    unknown = run_record("retrieval", run_id="u")
    unknown["variant"]["spec"] = "nosuch"
    (results / "runs.jsonl").write_text(json.dumps(unknown) + "\n")
    capsys.readouterr()
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"(a record in {tmp_path}/R\\nnew names a variant" in err
    grid = tmp_path / "g\nrid.toml"
    grid.write_text("name = [")
    assert main(["run", str(grid), "--results-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (f"fwbench: error: grid {tmp_path}/g\\nrid.toml: malformed TOML: Invalid value "
                                       "(at end of document)\n")
    (results / "runs.jsonl").write_text(json.dumps(run_record("retrieval")) + "\nnot json\n"
                                        + json.dumps(changed("retrieval", "seed", "1")) + "\n")
    (results / BENCH_RECORDS).write_text('{"run_id": "b"}\n')
    assert main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "REPORT.md").read_text()
    for line in (f"{tmp_path}/R\\nnew/runs.jsonl:2: corrupt or truncated record skipped",
                 f"{tmp_path}/R\\nnew/runs.jsonl: record 'retrieval:seed' skipped: no run record",
                 f"{tmp_path}/R\\nnew/bench.jsonl: record 'b' skipped: no benchmark record (missing or mistyped: kind)"):
        assert line in report, line
    assert not [line for line in report.splitlines() if line.startswith(("new/runs.jsonl", "new/bench.jsonl"))]


@pytest.mark.parametrize("entry", ["R", "R, a link to a link", "a directory under R", "runs.jsonl", "claims.lock",
                                   "runs.lock", "checkpoints", "bench.jsonl"])
def test_a_link_to_a_name_too_long_is_named_in_one_line(tmp_path, capsys, monkeypatch, entry):
    """Break-it finding (h-breakL): a link on a store's way whose target holds a name longer than the file system
    allows (``ln -s ééé…é R``, 130 characters, 260 bytes in UTF-8): the results directory, or one above it, was said
    to be a path too long, "got a directory path of 1 bytes: File name too long; expected at most 4084 bytes
    (shorten it)", R being one byte; a records file, lock, claims file or checkpoints entry so linked ended every
    command in a traceback, "OSError: [Errno 36] File name too long". The link and the name are named, in bytes."""
    monkeypatch.chdir(tmp_path)
    long = "é" * 130
    shown = f"{'é' * 20}…{'é' * 10}"
    grid = tmp_path / "grid.toml"
    grid.write_text(LM_CHECKPOINT_GRID if entry == "checkpoints" else TINY_GRID)
    results, subject, hops, verb = "R", "R", [shown], "got"
    if entry == "R":
        os.symlink(long, "R")
    elif entry == "R, a link to a link":
        os.symlink("mid", "R")
        os.symlink(long, "mid")
        hops = ["mid", shown]
    elif entry == "a directory under R":
        os.symlink(long, "R")
        results = subject = "R/sub"
    else:
        os.mkdir("R")
        os.symlink(long, f"R/{entry}")
        subject = f"R/{entry}"
    named = ", a link to ".join(repr(hop) for hop in hops)
    where = " under 'R'," if entry == "a directory under R" else ""
    expected = "names"
    if entry in ("claims.lock", "runs.lock"):
        verb, expected = "cannot open", f"a {'claims' if entry == 'claims.lock' else 'lock'} file, with names"
    elif entry == "checkpoints":
        expected = "a directory for the runs' checkpoints, with names"
    argv = (["bench", "--profile", "quick", "--lengths", "32", "--variants", "linear", "--no-extras", "--results-dir",
             results, "--quiet"] if entry == "bench.jsonl" else ["run", str(grid), "--results-dir", results, "--quiet"])
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: {verb} {subject!r},{where} a link to {named}, holding the name {shown!r}, of "
        f"260 bytes: File name too long; expected {expected} of at most {os.pathconf('/', 'PC_NAME_MAX')} bytes "
        "(point the link at a shorter path)\n")
    if entry in ("R", "runs.jsonl"):  # the readers too
        assert main(["report", "--results-dir", results, "--out", "out"]) == 2
        assert f"got {subject!r}, a link to {named}, holding the name" in capsys.readouterr().err
        assert main(["estimate", str(grid), "--against", results]) == 2
        assert capsys.readouterr().err.startswith(f"fwbench: error: --against: got {subject!r}, a link to {named}")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("store", ["a records file linked beside", "a grid that keeps checkpoints"])
def test_a_relative_results_directory_under_a_deep_working_directory(tmp_path, capsys, monkeypatch, store):
    """Break-it finding (h-breakL): a relative --results-dir under a working directory deeper than the system's path
    limit (25 names of 200 bytes): R2/runs.jsonl a link to ../R1/runs.jsonl ended ``fwbench run`` in a traceback,
    "OSError: [Errno 36] File name too long" (the lock's home, R1, looked up by its full path); a grid that keeps
    checkpoints trained its run and failed it at its first checkpoint, named by its full path. The link is written
    through, its lock beside R1's file; the checkpoints are refused in one line before any training."""
    grid = tmp_path / "grid.toml"
    grid.write_text(LM_CHECKPOINT_GRID if store == "a grid that keeps checkpoints" else TINY_GRID)
    monkeypatch.chdir(tmp_path)
    for _ in range(25):
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
    argv = ["run", str(grid), "--results-dir", "R2", "--quiet"]
    if store == "a records file linked beside":
        os.mkdir("R1")
        os.mkdir("R2")
        os.symlink("../R1/runs.jsonl", "R2/runs.jsonl")
        assert main(argv) == 0
        assert len(Path("R1/runs.jsonl").read_text().splitlines()) == 1
        assert sorted(os.listdir("R1")) == ["claims.lock", "runs.jsonl", "runs.lock"]
        assert os.listdir("R2") == ["runs.jsonl"]
        return
    full = os.path.join(os.getcwd(), "R2", "checkpoints")
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"fwbench: error: --results-dir: got 'R2/checkpoints', whose full path, '{full[:20]}…{full[-10:]}', is of "
        f"{len(full)} bytes; expected at most {os.pathconf('/', 'PC_PATH_MAX') - 21} bytes where runs keep "
        "checkpoints, named by their full path (choose a results directory nearer the root)\n")
    assert Path("R2/runs.jsonl").read_text() == ""  # nothing trained


def test_a_records_file_linked_beside_it_in_a_directory_reached_by_links_past_the_path_limit(tmp_path, monkeypatch):
    """Break-it finding (h-breakL): R a link into a directory whose full path is past the system's limit (R → 12
    names of 200 bytes, a link there → 13 more), its X2/runs.jsonl a link to ../X1/runs.jsonl: ``fwbench run
    GRID --results-dir R/rest/X2`` ended in a traceback, "OSError: [Errno 36] File name too long" (the lock's home
    looked up by its resolved path, past the limit from the working directory as well). The links, as spelled, lead
    there: the run writes through the link and locks beside X1's file."""
    grid = tmp_path / "grid.toml"
    grid.write_text(TINY_GRID)
    monkeypatch.chdir(tmp_path)
    name = "d" * 200
    os.symlink("/".join(["deep"] + [name] * 12), "R")
    os.mkdir("deep")
    os.chdir("deep")
    for level in range(25):
        if level == 12:
            os.symlink("/".join([name] * 13), "rest")
        os.mkdir(name)
        os.chdir(name)
    os.mkdir("X1")
    os.mkdir("X2")
    os.symlink("../X1/runs.jsonl", "X2/runs.jsonl")
    os.chdir(tmp_path)
    assert main(["run", str(grid), "--results-dir", "R/rest/X2", "--quiet"]) == 0
    assert len(Path("R/rest/X1/runs.jsonl").read_text().splitlines()) == 1
    assert sorted(os.listdir("R/rest/X1")) == ["claims.lock", "runs.jsonl", "runs.lock"]
    assert os.listdir("R/rest/X2") == ["runs.jsonl"]
