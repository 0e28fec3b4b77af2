"""The training-free probe, the `fwbench capacity` and `fwbench probe` commands, and the report's new
sections (Setting 2, capacity vs d_dot, MQAR, probe, statistics) rendered from tiny real runs."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

from fwbench.cli import main
from fwbench.report.probe import PROBE_D_VALUE, least_squares_bound, probe_variant, run_probe
from fwbench.run.grid import PAPER_GRIDS

TINY_SETTING2 = """
name = "tiny2"
task = "retrieval"
[defaults]
setting = 2
eval_every = 5
eval_sequences = 4
batch_size = 8
max_steps = 10
d_key = 8
[profiles.quick]
variant = ["dpfp:nu=1", "dpfp-delta:nu=1", "dpfp-delta-unnorm:nu=1", "tanh-fwm"]
S = [4]
seed = [1, 2]
"""

TINY_NU = """
name = "tiny_nu"
task = "retrieval"
[defaults]
setting = 1
eval_every = 5
eval_sequences = 4
batch_size = 8
max_steps = 10
d_key = 4
[profiles.quick]
variant = ["dpfp:nu=1", "dpfp:nu=2"]
S = [3, 6]
seed = [1, 2]
"""

TINY_MQAR = """
name = "tiny_mqar"
task = "mqar"
[defaults]
vocab_size = 16
seq_len = 16
num_kv_pairs = 2
n_layers = 1
batch_size = 4
eval_sequences = 8
eval_every = 5
max_steps = 10
[profiles.quick]
variant = ["linear", "dpfp-fwm:nu=1"]
d_model = [4, 8]
seed = [1]
"""


def test_probe_is_perfect_for_orthogonal_one_hot_features_and_degrades_past_d_dot():
    """With the sum rule and few pairs the error is small; it grows with S / d_dot, and past d_dot it
    can never beat the least-squares bound 1 − d_dot/S."""
    rows = pd.DataFrame(probe_variant("dpfp:nu=1", d_key=8, ratios=(0.125, 1.0, 4.0), trials=2))
    assert list(rows["S"]) == [2, 16, 64]
    errors = list(rows["error"])
    assert errors[0] < errors[1] < errors[2] <= 1.0
    assert (rows["error"] >= rows["bound"] - 0.02).all()
    assert least_squares_bound(10, 20) == 0.0 and least_squares_bound(40, 10) == pytest.approx(0.75)


def test_probe_covers_every_rule_and_is_deterministic():
    variants = ["linear", "dpfp-delta:nu=1", "tanh-fwm", "favor:m=4"]
    a = run_probe(variants, d_key=8, ratios=(0.5, 2.0), trials=1, seed=3)
    b = run_probe(variants, d_key=8, ratios=(0.5, 2.0), trials=1, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert set(a["rule"]) == {"sum", "delta", "fwm"} and a["error"].between(0, 1).all()
    with pytest.raises(ValueError, match="softmax"):
        probe_variant("softmax", d_key=8)


@pytest.mark.slow
def test_probe_command_writes_csv_and_figure(tmp_path, capsys):
    torch.set_num_threads(1)
    assert main(["probe", "--out", str(tmp_path), "--d-key", "8", "--trials", "1"]) == 0
    table = pd.read_csv(tmp_path / "probe.csv")
    assert {"variant", "rule", "d_dot", "S", "error", "bound"} <= set(table.columns)
    assert (tmp_path / "probe.png").stat().st_size > 1000
    assert main(["probe", "--trials", "0"]) == 2


@pytest.mark.slow
def test_capacity_command_writes_a_csv_with_intervals_and_a_figure(tmp_path, capsys):
    grid = tmp_path / "tiny_nu.toml"
    grid.write_text(TINY_NU)
    out, results = tmp_path / "reports", tmp_path / "results"
    assert main(["capacity", "--grid", str(grid), "--results-dir", str(results), "--out", str(out), "--quiet"]) == 0
    table = pd.read_csv(out / "tiny_nu.csv")
    assert list(table["variant"]) == ["dpfp:nu=1", "dpfp:nu=2"]
    assert set(table["d_dot"]) == {8, 16} and (table["n_seeds"] == 2).all()
    assert {"capacity_mean", "ci_low", "ci_high", "bound", "per_seed"} <= set(table.columns)
    assert (out / "tiny_nu.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "capacities written to" in printed
    # C2 and C3 with their evidence: two seeds at d_key 4 can only be INDICATIVE
    assert re.search(r"C2 INDICATIVE( \(leans (PASS|FAIL)\))?: capacity ν=1: ", printed), printed
    assert re.search(r"C3 INDICATIVE( \(leans (PASS|FAIL)\))?: ", printed), printed
    assert "missing: 2 seeds" in printed and "d_key 4, not the paper's 64" in printed


def test_reproduce_runs_the_new_grids():
    assert PAPER_GRIDS[0] == "capacity" and {"setting2", "capacity_nu", "mqar", "shakespeare"} <= set(PAPER_GRIDS)


@pytest.mark.slow
def test_report_renders_setting2_mqar_capacity_probe_and_statistics_sections(tmp_path):
    results, out = tmp_path / "results", tmp_path / "reports"
    for name, text in (("tiny2", TINY_SETTING2), ("tiny_nu", TINY_NU), ("tiny_mqar", TINY_MQAR)):
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        assert main(["run", str(path), "--results-dir", str(results), "--quiet"]) == 0
    assert main(["probe", "--out", str(out), "--d-key", "8", "--trials", "1"]) == 0
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    for heading in ("## Setting 2", "## Capacity vs d_dot", "## Multi-query associative recall", "## Training-free",
                    "## Statistics"):
        assert heading in text
    assert "length 2S" in text and "length S" in text, "the evaluation-length difference is documented"
    for figure in ("setting2.png", "capacity_vs_d_dot.png", "mqar.png", "probe.png"):
        assert (out / figure).stat().st_size > 1000 and f"({figure})" in text
    claims = text.split("## Claims")[1].split("##")[0]
    for i in range(1, 15):
        assert f"C{i}:" in claims
    assert "| evidence |" in claims and "| reference |" in claims
    assert "## Setup: differences from the official code" in text and "max(Σφ(x), 1e-30)" in text
    # two seeds per Setting 2 cell: the table shows an interval
    setting2 = text.split("## Setting 2")[1].split("\n## ")[0]
    assert "[" in setting2.split("| S |")[1]
    assert pd.read_csv(out / "capacities.csv")["n_seeds"].max() == 2


def test_report_renders_when_every_mqar_run_diverged(tmp_path, capsys):
    """A store whose MQAR runs all diverged before their first evaluation has no accuracy in any record;
    the report raised KeyError: 'best_eval_accuracy'. It must render the section and name the divergence."""
    results, out = tmp_path / "results", tmp_path / "reports"
    grid = tmp_path / "diverging_mqar.toml"
    grid.write_text(TINY_MQAR.replace('name = "tiny_mqar"', 'name = "diverging_mqar"')
                    .replace('variant = ["linear", "dpfp-fwm:nu=1"]', 'variant = "linear"\nlr = 1e38')
                    .replace("d_model = [4, 8]", "d_model = 4"))
    assert main(["run", str(grid), "--results-dir", str(results), "--quiet"]) == 0
    assert "0 trained now" not in capsys.readouterr().out
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    mqar = (out / "REPORT.md").read_text().split("## Multi-query associative recall")[1].split("\n## ")[0]
    assert "| 4 | — (1 diverged) |" in mqar


def test_mqar_table_leaves_a_diverged_runs_accuracy_out_and_counts_it(tmp_path):
    """The divergence policy (README, Statistics): a diverged run is left out of intervals and counted.
    The MQAR table averaged in the accuracy a run measured before it diverged (seeds 0.2, 0.3 and a
    diverged 0.95 read '0.483 [-0.528, 1.495] (diverged)'), and the figure's mean with it."""
    from fwbench.report.render import section_mqar

    base = {"task": "mqar", "num_kv_pairs": 4, "seq_len": 32, "vocab_size": 64, "power_a": 0.01, "n_layers": 1,
            "n_heads": 1, "max_steps": 600, "wall_s": 1.0, "d_model": 16, "variant": "linear"}
    rows = pd.DataFrame([{**base, "seed": seed, "best_eval_accuracy": accuracy, "status": status}
                         for seed, accuracy, status in ((1, 0.2, "max_steps"), (2, 0.3, "max_steps"),
                                                        (3, 0.95, "diverged"))])
    assert "| 16 | 0.250 [-0.385, 0.885] (1 diverged) |" in section_mqar(rows, tmp_path)


def test_probe_bytes_counts_the_largest_variant_by_hand():
    """DPFP ν=3 is the widest default variant at d_key 64: d_dot = 2·64·3 = 384, S = 4·384 = 1536;
    keys (64) + features (384) + values and read-out (2·64) per pair and trial, plus a 64 × 384 Ω."""
    from fwbench.report.probe import probe_bytes

    assert probe_bytes(64, 4) == 4 * (4 * 1536 * (64 + 384 + 2 * 64) + 64 * 384)
    # FAVOR+ (d_dot 2m = 128, whatever d_key) is the widest at a small d_key: S = 512
    assert probe_bytes(4, 1, variants=["favor:m=64", "linear"]) == 4 * (512 * (4 + 128 + 128) + 4 * 128)


def test_probe_at_the_largest_accepted_seed_reads_its_keys_by_a_naive_sum_rule():
    """``--seed`` accepts [0, 2**31) (it accepted [0, 2**63), where seed · 1_000_003 + S overflowed torch's seed
    range for seeds ≳ 1.8e13: a traceback). The keys of each S are drawn from that value modulo 2**64, and the error
    is 1 − cos² between the values and a naive sum-rule read, Σ_s φ(k_s)·φ(q) v_s / Σ_s φ(k_s)·φ(q)."""
    seed, d_key, trials = 2**31 - 1, 4, 2
    rows = probe_variant("linear", d_key=d_key, ratios=(0.5, 2.0), trials=trials, seed=seed)
    for row in rows:
        S = row["S"]
        generator = torch.Generator().manual_seed((seed * 1_000_003 + S) % 2**64)
        keys = torch.randn(trials, S, d_key, generator=generator).double()
        values = torch.randn(trials, S, PROBE_D_VALUE, generator=generator).double()
        phi = torch.nn.functional.elu(keys) + 1
        errors = []
        for trial in range(trials):
            for query in range(S):
                weights = torch.stack([phi[trial, s] @ phi[trial, query] for s in range(S)])
                read = (weights[:, None] * values[trial]).sum(0) / weights.sum()
                cosine = read @ values[trial, query] / (read.norm() * values[trial, query].norm())
                errors.append(1 - cosine**2)
        assert row["error"] == pytest.approx(torch.stack(errors).mean().item(), abs=1e-5)


def test_a_setting2_cell_whose_runs_all_failed_reads_a_dash_not_nan(tmp_path):
    """A failed run (failed_record: no best_eval_loss) reaches the Setting 2 table as a NaN loss. A cell
    whose every run failed printed 'nan [nan, nan]' (log_interval of no finite value), where the Setting 1
    and MQAR tables print '—'; a cell with a measured seed beside a failed one keeps its loss."""
    import json

    from fwbench.analysis.records import records_frame
    from fwbench.report.render import section_setting2
    from fwbench.run.grid import expand, load_grid
    from fwbench.run.launchers import failed_record

    trained, failing = tmp_path / "trained.toml", tmp_path / "failing.toml"
    trained.write_text(TINY_SETTING2.replace('["dpfp:nu=1", "dpfp-delta:nu=1", "dpfp-delta-unnorm:nu=1", "tanh-fwm"]',
                                             '"dpfp:nu=1"').replace("seed = [1, 2]", "seed = 1"))
    failing.write_text(TINY_SETTING2.replace('"dpfp-delta-unnorm:nu=1", ', ""))
    results = tmp_path / "results"
    assert main(["run", str(trained), "--results-dir", str(results), "--quiet"]) == 0
    [measured] = [json.loads(line) for line in (results / "runs.jsonl").read_text().splitlines()]
    # dpfp:nu=1 seed 2 failed beside the measured seed 1; dpfp-delta and tanh-fwm failed at both seeds
    failed = [failed_record(spec, "RuntimeError: boom") for spec in expand(load_grid(failing), "quick")
              if (spec.variant, spec.seed) != ("dpfp:nu=1", 1)]
    text = section_setting2(records_frame([measured, *failed]), tmp_path)
    assert "nan" not in text
    header, _, row = text.split("| S |")[1].split("\n\n")[0].splitlines()
    assert header == " dpfp-delta:nu=1 | dpfp:nu=1 | tanh-fwm |"
    assert row == f"| 4 | — | {measured['metrics']['best_eval_loss']:.3g} | — |"


def test_the_environment_table_names_runs_without_an_environment_in_one_line_not_nan(tmp_path):
    """A failed run (failed_record) records no environment. Beside it pandas held the environment columns'
    gaps as NaN and ``threads`` as a float: the report's 'Runs by environment' table read '| cpu | … | 1.0 |'
    (1.0 CPU threads) and a row '| nan | nan | … | 14 | nan | nan | 0.0 |'."""
    import json

    from fwbench.run.grid import expand, load_grid
    from fwbench.run.launchers import failed_record

    grid = tmp_path / "tiny2.toml"
    grid.write_text(TINY_SETTING2.replace('["dpfp:nu=1", "dpfp-delta:nu=1", "dpfp-delta-unnorm:nu=1", "tanh-fwm"]',
                                          '"dpfp:nu=1"').replace("seed = [1, 2]", "seed = 1"))
    results, out = tmp_path / "results", tmp_path / "out"
    assert main(["run", str(grid), "--results-dir", str(results), "--quiet"]) == 0
    [measured] = [json.loads(line) for line in (results / "runs.jsonl").read_text().splitlines()]
    failed = failed_record(expand(load_grid("mqar"), "quick")[0], "RuntimeError: boom")
    (results / "runs.jsonl").write_text(json.dumps(measured) + "\n" + json.dumps(failed) + "\n")
    assert main(["report", "--results-dir", str(results), "--out", str(out)]) == 0
    table = (out / "REPORT.md").read_text().split("Runs by environment")[1].split("\n\n")[1]
    _, _, ran, unknown = table.splitlines()
    assert ran.split(" | ")[4] == str(measured["environment"]["threads"])
    assert unknown == "| — | — | — | — | — | — | 1 | — | — | 0.0 |"


def test_ratios_that_round_to_one_s_give_one_row():
    """Break-it pass AQ: `fwbench probe --d-key 2` wrote the row of S = 2 three times (ratios 0.25, 0.5 and 1
    of d_dot 2, clamped to S ≥ 2): duplicate CSV rows measuring one S."""
    rows = probe_variant("linear", d_key=2, ratios=(0.25, 0.5, 1.0, 2.0), trials=1)
    assert [row["S"] for row in rows] == [2, 4]


@pytest.mark.parametrize("seed", [2**32, -5])
def test_probe_variant_refuses_a_seed_the_command_refuses(seed):
    """Break-it pass AR: probe_variant(seed=2**32) returned seed 0's rows bit for bit, and seed=-5 was taken,
    where `fwbench probe --seed` refused both."""
    from fwbench.errors import FwbenchError

    with pytest.raises(FwbenchError, match=r"^seed: got -?\d+; expected a non-negative integer below 2\*\*31"):
        probe_variant("linear", d_key=4, trials=1, seed=seed)
