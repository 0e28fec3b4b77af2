"""Report section for the Tiny Shakespeare language model runs.

Per setup (model size and budget): the per-variant table (validation perplexity and bits per
character at the training context, tokens/s, parameters), learning curves, the long-context
evaluation (figure and table), the paper's WikiText-103 numbers as a labelled reference, and a
generated sample per variant.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pandas as pd

from fwbench.analysis.claims_lm import SETUP_FIELDS, carried_segments, describe_setup, setups, stream_ratios
from fwbench.analysis.lm_protocol import describe_learning_rates
from fwbench.analysis.reference import paper_lm_tables
from fwbench.report.lm_figures import learning_curves_figure, long_context_figure, run_detail, swept
from fwbench.report.markdown import markdown_table
from fwbench.variants import d_dot_of, parse_spec

#: Characters of each generated sample shown in the report.
SAMPLE_CHARS = 500


def _number(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:,.{digits}f}"


def _slug(key: tuple) -> str:
    """Short file-name stem of a setup: its main sizes plus a hash of the whole key."""
    values = dict(zip(SETUP_FIELDS, key, strict=True))
    digest = hashlib.sha1(repr(key).encode()).hexdigest()[:6]
    return f"d{values['d_model']}-l{values['n_layers']}-c{values['context']}-s{values['max_steps']}-{digest}"


def variant_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per run: rule, d_dot, val ppl / bpc (whole validation split), distance to the
    unigram baseline, carried-state ÷ per-segment ppl over the evaluation stream, tokens/s,
    parameters, steps, status, wall time."""
    table = []
    for _, row in rows.sort_values(["variant", "lr", "seed"]).iterrows():
        spec = parse_spec(row["variant"])
        # int(): beside a retrieval run (no d_model) pandas reads the column as floats, 64 → 64.0, which
        # d_dot_of refuses as it refuses any float d_key ('d_key: got 16.0; expected a positive integer')
        d_key = int(row["d_model"]) // int(row["n_heads"])
        d_dot = d_dot_of(spec, d_key)
        table.append({
            "variant": row["variant"], "rule": spec.info.rule, "d_dot": int(d_dot) if d_dot else "—",
            "seed": int(row["seed"]), "lr": f"{row['lr']:g}",
            "val ppl": _number(row.get("val_ppl")), "val bpc": _number(row.get("val_bpc"), 3),
            "sliding-window ppl": _number(row.get("sliding_ppl")),
            "bits below unigram": _number(row.get("unigram_bpc", math.nan) - row.get("val_bpc", math.nan), 2),
            "carried ÷ per-segment ppl": _number(
                row.get("stream_ppl", math.nan) / row.get("stream_reset_ppl", math.nan), 3),
            # a failed run (failed_record: metrics {}) counted no parameters: '—', as its other numbers
            "tokens/s": _number(row.get("tokens_per_s"), 0), "parameters": _number(row.get("parameters"), 0),
            "steps": int(row["steps"]), "status": row["status"], "wall (s)": _number(row["wall_s"], 0),
        })
    return pd.DataFrame(table)


def long_context_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run: per-segment and carried-state ppl over the whole stream and in its last bucket."""
    table = []
    for _, row in rows.sort_values(["variant", "lr", "seed"]).iterrows():
        evaluation = row.get("final_evaluation")
        if not isinstance(evaluation, dict) or "long_context" not in evaluation:
            continue
        lc = evaluation["long_context"]
        lo, hi = lc["buckets"][-1]
        table.append({
            "variant": row["variant"], "seed": int(row["seed"]), "lr": f"{row['lr']:g}",
            "characters": f"{int(lc['tokens']):,}",
            "per-segment ppl": _number(lc["reset_ppl_all"]), "carried ppl": _number(lc["carried_ppl_all"]),
            "carried ÷ per-segment": _number(lc["carried_ppl_all"] / lc["reset_ppl_all"], 3),
            "last bucket": f"[{lo:,}, {hi:,})",
            "last bucket: per-segment ppl": _number(lc["reset_ppl"][-1]),
            "last bucket: carried ppl": _number(lc["carried_ppl"][-1]),
            "last bucket: carried ÷ per-segment": _number(lc["carried_ppl"][-1] / lc["reset_ppl"][-1], 3),
        })
    return pd.DataFrame(table)


def carried_length_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run: ppl with the state carried over 1×, 4×, 16× the carried training length, and 16× ÷ 1×."""
    table = []
    for _, row in rows.sort_values(["variant", "lr", "seed"]).iterrows():
        evaluation = row.get("final_evaluation")
        carried = evaluation.get("carried_lengths") if isinstance(evaluation, dict) else None
        if not carried:
            continue
        entry = {"variant": row["variant"], "seed": row["seed"], "lr": f"{row['lr']:g}",
                 "characters scored": f"{carried['tokens']:,}"}
        for length, ppl in zip(carried["lengths"], carried["ppl"], strict=True):
            entry[f"ppl carried over {length:,}"] = _number(ppl)
        entry["longest ÷ shortest"] = _number(carried["ppl_ratio"][-1], 3)
        table.append(entry)
    return pd.DataFrame(table)


def paper_reference_table() -> pd.DataFrame:
    """The paper's WikiText-103 validation perplexities (Tables 2, 4, 5) with our variant names."""
    ref = paper_lm_tables().copy()
    names = {"transformer": "softmax", "linear": "linear", "performer": "favor", "dpfp": "dpfp"}
    ref["fwbench variant"] = [
        names.get(m, m) + ("-delta" if r == "delta" else "")
        for m, r in zip(ref["model"], ref["update_rule"], strict=True)
    ]
    ref = ref.fillna("")
    return ref[["table", "config", "fwbench variant", "d_dot_note", "valid_ppl", "test_ppl", "note"]]


def section_shakespeare(frame: pd.DataFrame, out_dir: Path) -> str:
    """Tiny Shakespeare: tables, learning curves, long-context figure, paper reference, samples."""
    groups = setups(frame)
    if not groups:
        return ("## Tiny Shakespeare: character-level language model\n\nNo Tiny Shakespeare runs in the store yet "
                "(`fwbench run shakespeare --profile quick --data-dir DIR`).\n")
    lines = [
        "## Tiny Shakespeare: character-level language model",
        "",
        "A decoder-only Transformer (pre-norm blocks of attention + FFN) trained on the first 90 % of Tiny "
        "Shakespeare (1,115,394 characters, 65 symbols) with each attention variant; validation on the last 10 %. "
        "*Val ppl / bpc*: perplexity and bits per character over the whole validation split cut into segments of "
        "the training context, each read from an empty memory. *Carried ÷ per-segment ppl*: the validation text "
        "(or its first `stream_characters`) read as one stream, every layer's state carried from segment to "
        "segment and never reset (fast weights carry W; softmax's KV cache covers only its own segment, its "
        "training window), relative to reading the same characters segment by segment. tokens/s: training "
        "throughput on the recorded device. The learning curves' bpc is measured during training on the "
        "evaluation subset (`eval_segments` segments); the table's val bpc after training on the whole "
        "validation split, so the two differ by the subset's sampling.",
        "",
        "**Protocol.** C8/C9 (limited context, as the paper's Table 2): every variant trains with the same budget "
        "at each learning rate of a small sweep and at several seeds; a variant is read at its best learning rate "
        "(lowest seed-mean validation perplexity, its seeds only), and an ordering counts only when the 95 % "
        "log-space intervals of the two variants' perplexities over seeds are apart. Besides the independent "
        "segments, the paper's "
        "*sliding-window* evaluation scores each character with (almost) a full window of context before it "
        "(window = the training context, moved by `sliding_stride`). C10 (carried state, as the paper's Table 4): "
        "models trained on sequences of `train_segments` consecutive segments with every layer's state carried "
        "between them and gradients cut at each boundary (truncated BPTT), without positional encoding, are "
        "evaluated with the state carried over 1×, 4× and 16× that training length on the same characters.",
        "",
        "**Scale.** The quick profile trains 2-layer models with d_model 64 (4 heads, d_key 16) for 250 steps "
        "(256,000 characters seen for C8/C9, 512,000 for C10), a few CPU-minutes in all; the `standard`, `carry` and "
        "`paper` profiles go further. WikiText-103 differs in kind and size: word-level tokens (a 268k-word "
        "vocabulary against 65 characters), about 103 M training tokens (Tiny Shakespeare has 1 M characters), "
        "16-layer models trained on GPUs, contexts of 256–384 words (a few hundred characters here), "
        "and Table 4's state carried over the whole training stream (a fixed number of segments here). Only the "
        "orderings can carry over, never the perplexities, and at the quick scale even the orderings are "
        "indicative.",
        "",
    ]
    for key, rows in groups:
        slug = _slug(key)
        unigram = rows["unigram_bpc"].dropna()
        lines += [f"### Setup: {describe_setup(key)}", ""]
        if not unigram.empty:
            lines += [f"Unigram baseline (training-split character frequencies, on the validation split): "
                      f"{unigram.iloc[0]:.3f} bits per character.", ""]
        lines += [markdown_table(variant_table(rows)), ""]
        if rows["lr"].nunique() > 1:
            rates = describe_learning_rates(rows)
            lines += [f"Learning rates swept: {', '.join(f'{lr:g}' for lr in sorted(rows['lr'].unique()))} (each "
                      f"variant is read at the one with the lowest seed-mean validation perplexity). "
                      f"{rates[0].upper()}{rates[1:]}.", ""]
        carried_table = carried_length_table(rows)
        if not carried_table.empty:
            lines += ["#### Carried length: the state carried over 1×, 4× and 16× the length carried in training", "",
                      "The same validation characters, cut into windows of each length, each read from an empty "
                      "memory with every layer's state carried across the segments inside it (C10).", "",
                      markdown_table(carried_table), ""]
        statuses = rows["status"].value_counts().to_dict()
        lines += [f"Runs: {len(rows)} ({', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))}); "
                  f"training time {rows['wall_s'].sum() / 60:.1f} min in all.", ""]
        curves = learning_curves_figure(rows, out_dir / f"lm_curves_{slug}.png", "Validation bpc during training")
        lines += [f"![learning curves]({curves.name})", ""]
        if not stream_ratios(rows).empty:
            figure = long_context_figure(rows, out_dir / f"lm_long_context_{slug}.png",
                                         "Carried state over the validation stream")
            segments = carried_segments(key)
            training = (f"These models were trained that way too, on sequences of {segments} segments with the "
                        f"state carried between them (the paper's Table 4 trains on the unbounded stream)."
                        if segments > 1 else
                        "These models were trained on independent segments: only the evaluation carries the state "
                        "(the paper's Table 4 carries it in training too; see a setup with `train_segments` > 1).")
            lines += [
                "#### Long context: the state carried across the whole validation stream",
                "",
                "Perplexity with the state carried, divided by the per-segment perplexity on the same characters, "
                "per position bucket (first segment, then doubling spans). Above 1, what the memory kept from "
                "earlier segments hurts; below 1, it helps. " + training,
                "",
                f"![long context]({figure.name})",
                "",
                markdown_table(long_context_table(rows)),
                "",
            ]
        samples = [(row, row["final_evaluation"].get("sample"))
                   for _, row in rows.sort_values(["variant", "lr", "seed"]).iterrows()
                   if isinstance(row.get("final_evaluation"), dict) and row["final_evaluation"].get("sample")]
        if samples:
            lines += ["#### Generated samples", ""]
            for row, sample in samples:
                text = sample["text"][:SAMPLE_CHARS].replace("```", "'''")
                lines += [f"**{row['variant']}** ({run_detail(row, swept(rows))}, prompt {sample['prompt']!r}, temperature "
                          f"{sample['temperature']}, sampling seed {sample['seed']}):", "", "```text", text, "```", ""]
    lines += [
        "### Reference: the paper's WikiText-103 results (a different dataset and scale)",
        "",
        "Word-level WikiText-103 with 16-layer models (small: D = 128, context 256; medium: D = 256, context 384), "
        "as transcribed from the paper; `?` marks inferred entries. These are *not* comparable to the Tiny "
        "Shakespeare perplexities above (characters, not words; a far smaller model and budget): they are the "
        "orderings that claims C8–C10 check.",
        "",
        markdown_table(paper_reference_table()),
        "",
    ]
    return "\n".join(lines)
