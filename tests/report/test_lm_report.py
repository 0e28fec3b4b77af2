"""The LM section names every run of a learning-rate sweep by its lr: table rows, figure legends and
sample headings (issue 13: "linear (seed 1)" twice, once per lr, told a reader nothing)."""

from __future__ import annotations

import numpy as np
import pandas as pd

import fwbench.report.lm_figures as lm_figures
from fwbench.report.lm_section import long_context_table, section_shakespeare, variant_table

LONG_CONTEXT = {"tokens": 256, "buckets": [[0, 64], [64, 256]], "reset_ppl": [9.0, 9.0], "carried_ppl": [9.0, 9.9],
                "reset_ppl_all": 9.0, "carried_ppl_all": 9.5}


def lm_run(variant: str, lr: float, seed: int) -> dict:
    return {"task": "shakespeare", "variant": variant, "lr": lr, "seed": seed, "status": "max_steps",
            "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "context": 16, "batch_size": 4,
            "max_steps": 1000, "positional": "learned", "schedule": "noam", "dropout": 0.0, "tied_output": True,
            "train_segments": 1, "truncated_bptt": False, "val_ppl": 8.0 + seed, "val_bpc": 3.0, "unigram_bpc": 4.8,
            "parameters": 1000, "steps": 1000, "wall_s": 60.0, "tokens_per_s": 1e4,
            "curve": [{"step": 500, "eval_bpc": 3.5}, {"step": 1000, "eval_bpc": 3.0}],
            "final_evaluation": {"long_context": LONG_CONTEXT,
                                 "sample": {"text": "It is so", "prompt": "It is", "temperature": 0.8, "seed": seed}}}


def sweep(rates=(6e-3, 1.2e-2)) -> pd.DataFrame:
    return pd.DataFrame([lm_run(v, lr, seed) for v in ("linear", "linear-delta") for lr in rates for seed in (1, 2)])


def legend_texts(monkeypatch, draw, rows: pd.DataFrame) -> list[str]:
    """The legend entries of the figure ``draw`` makes from ``rows`` (caught before it is saved)."""
    caught = []
    monkeypatch.setattr(lm_figures, "save", lambda fig, path: caught.append(fig) or path)
    draw(rows, "unused.png", "title")
    return [t.get_text() for t in caught[0].axes[0].get_legend().get_texts()]


def test_with_an_lr_sweep_every_legend_entry_and_row_names_its_lr(monkeypatch, tmp_path):
    rows = sweep()
    for draw in (lm_figures.learning_curves_figure, lm_figures.long_context_figure):
        labels = [t for t in legend_texts(monkeypatch, draw, rows) if t != "unigram baseline"]
        assert labels[:4] == ["linear (lr 0.006, seed 1)", "linear (lr 0.006, seed 2)",
                              "linear (lr 0.012, seed 1)", "linear (lr 0.012, seed 2)"]
        assert len(set(labels)) == len(labels) == len(rows)
    for table in (variant_table(rows), long_context_table(rows)):
        assert list(zip(table["variant"], table["lr"], table["seed"]))[:2] == [("linear", "0.006", 1),
                                                                               ("linear", "0.006", 2)]
        assert not table.duplicated(["variant", "lr", "seed"]).any()
    text = section_shakespeare(rows, tmp_path)
    assert "**linear-delta** (lr 0.012, seed 2, prompt" in text
    assert ("Best lr per variant among measured runs: linear 0.006 (edge of the sweep), "
            "linear-delta 0.006 (edge of the sweep).") in text


def test_one_learning_rate_keeps_the_labels_short(monkeypatch):
    labels = legend_texts(monkeypatch, lm_figures.learning_curves_figure, sweep(rates=(6e-3,)))
    assert labels[0] == "linear (seed 1)" and not any("lr" in t for t in labels)


def test_runs_without_a_finite_evaluation_are_named_in_the_learning_curves_legend(monkeypatch):
    """New-user run: the quick profile's six diverged linear-delta-unnorm runs were left out of the learning
    curves without a word. They are counted per variant in the legend; the drawn runs keep their entries."""
    rows = sweep(rates=(6e-3,))
    diverged = [{**lm_run("linear-delta-unnorm", 6e-3, seed), "status": "diverged",
                 "curve": [{"step": 500, "eval_bpc": float("nan")}]} for seed in (1, 2)]
    failed = {**lm_run("favor", 6e-3, 1), "status": "failed", "curve": float("nan")}
    odd = [{**lm_run("dpfp", 6e-3, 1), "curve": [{"step": 1, "eval_bpc": True}, {"step": 2, "eval_bpc": 10**400}]}]
    labels = legend_texts(monkeypatch, lm_figures.learning_curves_figure,
                          pd.concat([rows, pd.DataFrame([*diverged, failed, *odd])], ignore_index=True))
    assert max(map(len, labels[-1].splitlines())) <= 32  # no wider than a run's entry
    assert labels[-1].replace("\n", " ") == ("not drawn, no point with a finite step and bpc: dpfp (1 run), favor (1 run), "
                          "linear-delta-unnorm (2 runs)")
    assert labels[:len(rows)] == [f"{v} (seed {s})" for v in ("linear", "linear-delta") for s in (1, 2)]
    numpy_rows = sweep(rates=(6e-3,))
    numpy_rows["curve"] = [[{"step": np.int64(500), "eval_bpc": np.float32(3.5)}]] * len(numpy_rows)
    assert "not drawn" not in legend_texts(monkeypatch, lm_figures.learning_curves_figure, numpy_rows)[-1]


def test_the_report_of_a_language_model_grid_with_a_failed_run(tmp_path):
    """A run of the LM grid that raised is stored by ``failed_record`` (metrics {}: no parameter count);
    the per-run table read ``int(row['parameters'])``: ``fwbench report`` raised KeyError: 'parameters'
    where every LM run failed and ValueError: cannot convert float NaN to integer beside a finished one
    (0a3aabb's kind, a store whose runs failed, in the LM section). Now the failed run's row reads
    '—' for its parameters, as for its perplexities, and the finished run's count is as before."""
    import json

    from fwbench.cli import main
    from fwbench.run.grid import expand, load_grid
    from fwbench.run.launchers import failed_record

    failing, finished = expand(load_grid("shakespeare"), "smoke")[:2]
    record = failed_record(failing, "RuntimeError: boom")
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    (results / "runs.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    table = (out / "REPORT.md").read_text().split("| variant | rule |")[1].split("\n\n")[0]
    assert f"| {failing.variant} |" in table and "| — | 0 | failed |" in table
    row = {**lm_run(finished.variant, 6e-3, 1), "parameters": 11650}
    frame = pd.concat([pd.DataFrame([row]), pd.DataFrame([{**lm_run(failing.variant, 6e-3, 1), "status": "failed",
                                                            "parameters": float("nan"), "steps": 0}])])
    table = variant_table(frame)  # rows by variant: linear, then softmax
    assert (table["variant"].tolist(), table["parameters"].tolist()) == (["linear", "softmax"], ["11,650", "—"])


def test_the_report_of_a_store_holding_retrieval_and_language_model_runs(tmp_path):
    """``nox -s reproduce`` stores retrieval and LM runs in one runs.jsonl. Beside retrieval records
    (no ``d_model``) pandas holds ``d_model`` and ``n_heads`` as floats, so the LM table asked
    ``d_dot_of(spec, 16.0)``, which 741b6ed made refuse a float size: ``fwbench report`` (and the main
    job, after training every run) stopped with 'd_key: got 16.0; expected a positive integer (>= 1)'
    and wrote no REPORT.md. Now the table's d_dot is the LM's (d_model / n_heads = d_key for linear)."""
    import json

    from fwbench.cli import main
    from fwbench.run.grid import expand, load_grid
    from fwbench.run.launchers import failed_record

    lm = next(c for c in expand(load_grid("shakespeare"), "smoke") if c.variant == "linear")
    retrieval = expand(load_grid("capacity"), "quick")[0]
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    records = [failed_record(retrieval, "RuntimeError: boom"), failed_record(lm, "RuntimeError: boom")]
    (results / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    table = (out / "REPORT.md").read_text().split("| variant | rule |")[1].split("\n\n")[0]
    d_key = lm.config["d_model"] // lm.config["n_heads"]
    assert f"| linear | sum | {d_key} |" in table
    floats = pd.DataFrame([{**lm_run("linear", 6e-3, 1), "d_model": 16.0, "n_heads": 2.0}])
    assert variant_table(floats)["d_dot"].tolist() == [8]


def test_a_variant_error_that_is_not_an_unknown_variant_gets_no_variant_module_advice(tmp_path, monkeypatch, capsys):
    """`fwbench report` added to every VariantError from rendering 'a record … names a variant this
    process does not know: … pass --variant-module', also to the d_key refusal above, where no
    module could help. The advice is now kept for errors about a variant spec."""
    import json

    import fwbench.cli as cli
    import fwbench.report.render as render
    from fwbench.run.grid import expand, load_grid
    from fwbench.run.launchers import failed_record
    from fwbench.variants import VariantError

    results = tmp_path / "results"
    results.mkdir()
    record = failed_record(expand(load_grid("shakespeare"), "smoke")[0], "RuntimeError: boom")
    (results / "runs.jsonl").write_text(json.dumps(record) + "\n")

    def raising(message):
        def render(*_, **__):
            raise VariantError(message)
        return render

    def refusal(message):
        monkeypatch.setattr(render, "render_report", raising(message))
        assert cli.main(["report", "--results-dir", str(results), "--out", str(tmp_path / "out")]) == 2
        return capsys.readouterr().err

    size = refusal("d_key: got 16.0; expected a positive integer (>= 1)")
    assert "--variant-module" not in size and "cannot render the report of" in size and "d_key: got 16.0" in size
    assert "pass --variant-module" in refusal("variant: got 'mine'; expected one of softmax, linear")
    parameter = refusal("variant dpfp: unknown parameter 'mu'; allowed parameters: nu")  # a built-in's: no module helps
    assert "--variant-module" not in parameter and "cannot render the report of" in parameter


def test_the_lm_table_of_a_store_that_also_holds_retrieval_runs():
    """A retrieval record has no d_model or n_heads, so beside one pandas reads those columns of the LM rows
    as floats (16 → 16.0); d_dot_of refuses a float d_key, and ``fwbench report`` of such a store raised
    'VariantError: d_key: got 8.0; expected a positive integer (>= 1)' from the LM table. The table reads
    the sizes as the integers they are."""
    from fwbench.analysis.records import records_frame

    def record(task, variant, config, metrics):
        return {"run_id": f"{task}-{variant}", "task": task, "variant": {"spec": variant}, "seed": 1,
                "status": "max_steps", "steps": 10, "wall_s": 1.0, "config": config, "metrics": metrics}

    lm = lm_run("dpfp:nu=2", 6e-3, 1)
    lm_config = {key: lm[key] for key in ("d_model", "n_heads", "n_layers", "d_ff", "context", "batch_size",
                                          "max_steps")}
    frame = records_frame([record("shakespeare", "dpfp:nu=2", lm_config, {"val_ppl": 8.0, "val_bpc": 3.0}),
                           record("retrieval", "linear", {"d_key": 8}, {"best_eval_loss": 0.1})])
    assert frame["d_model"].dtype == float  # what made the fault: 16.0, not 16
    table = variant_table(frame[frame["task"] == "shakespeare"])
    assert list(table["d_dot"]) == [2 * 2 * (16 // 2)]  # DPFP ν = 2 at d_key 8: 2ν·d_key
