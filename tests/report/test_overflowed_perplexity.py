"""A language model whose loss passed 700 nats (lr 100, no clipping: a finite loss of 2e5 nats) has
perplexities that overflow to inf. The strict record writes them as null and lists them in
``non_finite`` (issue 14 item 5); ``fwbench report`` then stopped with a TypeError traceback (null ÷ null
in the C10 ratios), and once the values were read back as inf, with a ValueError from the long-context
figure's log axes (inf ÷ inf is NaN everywhere). The reader restores the listed values and the report
renders (break-it pass of issue 14, kind 5)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest

from fwbench.analysis.records import records_frame
from fwbench.report.render import render_report
from fwbench.run.store import ResultsStore
from fwbench.run.strict_json import restore_non_finite, sanitize_record
from fwbench.tasks.shakespeare import ShakespeareConfig

INF, LOSS = math.inf, 2.1e5


def overflowed_lm_record(variant: str) -> dict:
    config = asdict(ShakespeareConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, context=16, batch_size=4,
                                      max_steps=4, eval_every=2, eval_segments=4, stream_characters=1025,
                                      sliding_stride=8, sample_tokens=5))
    bpc = LOSS / math.log(2)
    buckets = [[0, 16], [16, 32], [32, 64], [64, 128], [128, 256], [256, 512], [512, 1024]]
    return {
        "run_id": f"overflow-{variant}", "grid": "lm", "task": "shakespeare",
        "variant": {"spec": variant, "name": variant, "params": {}, "d_dot": 8}, "seed": 1, "config": config,
        "status": "max_steps", "diverged_at": None, "diverged_reason": None, "steps": 4, "wall_s": 1.0,
        "metrics": {"best_eval_loss": LOSS, "best_eval_ppl": INF, "best_eval_bpc": bpc, "best_step": 2,
                    "final_eval_loss": LOSS, "final_eval_ppl": INF, "final_eval_bpc": bpc, "parameters": 1000,
                    "val_loss": LOSS, "val_ppl": INF, "val_bpc": bpc, "unigram_bpc": 4.8, "stream_ppl": INF,
                    "stream_bpc": bpc, "stream_reset_ppl": INF, "carried_ppl_1x": INF, "carried_ppl_4x": INF,
                    "carried_ppl_16x": INF, "sliding_ppl": INF, "sliding_bpc": bpc, "segments_ppl": INF},
        "curve": [{"step": 2, "train_loss": LOSS, "eval_loss": LOSS, "eval_ppl": INF, "eval_bpc": bpc},
                  {"step": 4, "train_loss": LOSS, "eval_loss": LOSS, "eval_ppl": INF, "eval_bpc": bpc}],
        "final_evaluation": {
            "long_context": {"context": 16, "tokens": 1024, "buckets": buckets, "carried_ppl": [INF] * 7,
                             "reset_ppl": [INF] * 7, "carried_loss": LOSS, "carried_ppl_all": INF,
                             "reset_loss": LOSS, "reset_ppl_all": INF},
            "carried_lengths": {"train_length": 16, "lengths": [16, 64, 256], "tokens": 1024, "loss": [LOSS] * 3,
                                "ppl": [INF] * 3, "ppl_ratio": [math.nan] * 3},
            "sliding_window": {"stride": 8, "characters": 1025, "ppl": INF, "segments_ppl": INF},
            "sample": {"prompt": "It is", "temperature": 0.8, "seed": 1, "tokens": 5, "text": "It is abcde"}},
    }


def test_values_written_as_null_are_read_back_as_the_floats_they_were():
    record = overflowed_lm_record("linear")
    written = json.loads(json.dumps(sanitize_record(record), allow_nan=False))
    assert written["metrics"]["val_ppl"] is None and written["non_finite"]["metrics.val_ppl"] == "inf"
    restored = restore_non_finite(written)
    assert restored["metrics"]["val_ppl"] == INF
    assert restored["final_evaluation"]["long_context"]["carried_ppl"] == [INF] * 7
    assert all(math.isnan(x) for x in restored["final_evaluation"]["carried_lengths"]["ppl_ratio"])
    assert restored["curve"][1]["eval_ppl"] == INF and restored["metrics"]["val_loss"] == LOSS
    assert written["metrics"]["val_ppl"] is None  # the record read is left as it was
    negative = restore_non_finite({"x": [1.0, None], "non_finite": {"x.1": "-inf", "gone.0": "nan"}})
    assert negative["x"] == [1.0, -INF]  # a path that leads nowhere is skipped
    # a listed path whose value is no longer null (a measured number) keeps that number: only nulls are restored
    # (nothing checked this: restoring every listed path went through the whole suite, h-break14l)
    stale = restore_non_finite({"metrics": {"val_ppl": 3.5}, "non_finite": {"metrics.val_ppl": "inf"}})
    assert stale["metrics"]["val_ppl"] == 3.5


def test_the_report_renders_a_store_whose_perplexities_overflowed(tmp_path):
    store = ResultsStore(tmp_path / "results")
    for variant in ("linear", "linear-delta"):
        store.append(overflowed_lm_record(variant))
    store.close()
    for line in (tmp_path / "results" / "runs.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
    report = render_report(tmp_path / "results", tmp_path / "out")
    assert report.is_file() and "## " in report.read_text()
    frame = records_frame(ResultsStore(tmp_path / "results").records())
    assert list(frame["val_ppl"]) == [INF, INF]


@pytest.mark.parametrize("listed", [10**400, "0.5", True, [1], None, "NaN "], ids=["400 digits", "0.5", "true", "list",
                                                                             "null", "padded"])
def test_a_non_finite_entry_that_is_no_value_fwbench_writes_leaves_the_null(listed):
    """Break-it finding (h-breakC): ``non_finite`` lists "nan", "inf" or "-inf" (``repr`` of the float); a hand-edited
    10**400 there raised OverflowError (a traceback in ``fwbench report``, runs.jsonl and bench.jsonl alike), and
    "0.5" or true made the null a measured 0.5 or 1.0. Only the three values are restored; the rest stays null."""
    record = {"run_id": "r", "metrics": {"val_ppl": None}, "non_finite": {"metrics.val_ppl": listed}}
    assert restore_non_finite(record)["metrics"]["val_ppl"] is None


def test_a_store_whose_non_finite_lists_a_400_digit_int_is_reported(tmp_path):
    """The same record in runs.jsonl: ``fwbench report`` raised OverflowError; now the report is written."""
    results = tmp_path / "results"
    results.mkdir()
    record = sanitize_record(overflowed_lm_record("linear"))
    record["non_finite"]["metrics.val_ppl"] = 10**400
    (results / "runs.jsonl").write_text(json.dumps(record) + "\n")
    assert render_report(results, tmp_path / "out").is_file()
