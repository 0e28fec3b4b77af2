"""Softmax with a window that no attention call of a run reaches computes what softmax computes, so
both name one run (issue 14 kind 12); a window that some call does reach is a run of its own."""

from __future__ import annotations

import pytest
import torch

from fwbench.run.grid import RunSpec
from fwbench.tasks import MQARConfig
from fwbench.tasks.mqar import MQARTask

MQAR = {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2, "d_model": 16, "batch_size": 4}
LM = {"d_model": 8, "n_heads": 2, "context": 16}
RETRIEVAL = {"setting": 2, "S": 10, "d_key": 8, "batch_size": 4}


def run_id(task: str, variant: str, config: dict) -> str:
    return RunSpec("g", task, variant, 1, config).run_id


def test_windows_no_call_reaches_hash_as_softmax():
    # MQAR: the last scored query sits at seq_len − 2 and attends to seq_len − 1 keys
    longest = MQAR["seq_len"] - 1
    assert run_id("mqar", f"softmax:window={longest}", MQAR) == run_id("mqar", "softmax", MQAR)
    assert run_id("mqar", f"softmax:window={10 * longest}", MQAR) == run_id("mqar", "softmax", MQAR)
    assert run_id("mqar", f"softmax:window={longest - 1}", MQAR) != run_id("mqar", "softmax", MQAR)
    # the LM: softmax's cache starts empty at every segment of context tokens
    assert run_id("shakespeare", f"softmax:window={LM['context']}", LM) == run_id("shakespeare", "softmax", LM)
    assert run_id("shakespeare", f"softmax:window={LM['context'] - 1}", LM) != run_id("shakespeare", "softmax", LM)
    # retrieval: any window leaves the code-free one-hot read, a computation of its own
    assert run_id("retrieval", "softmax:window=1000", RETRIEVAL) != run_id("retrieval", "softmax", RETRIEVAL)


def trained_weights(variant: str, steps: int = 3) -> torch.Tensor:
    task, config = MQARTask(), MQARConfig(**MQAR)
    torch.manual_seed(0)
    model = task.build_model(config, variant)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        optimizer.zero_grad()
        task.loss(model, task.train_batch(config, generator), config).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_a_window_of_the_whole_scored_sequence_trains_the_weights_of_softmax():
    plain = trained_weights("softmax")
    assert torch.equal(trained_weights(f"softmax:window={MQAR['seq_len'] - 1}"), plain)
    assert not torch.equal(trained_weights("softmax:window=3"), plain)


def test_the_lm_reads_alike_with_a_window_of_its_context_also_across_segments():
    """The LM empties softmax's cache at every segment of ``context`` tokens, in a carried stream too."""
    from fwbench.tasks.lm_model import DecoderConfig, DecoderLM

    config = DecoderConfig(vocab_size=20, d_model=8, n_heads=2, n_layers=2, context=LM["context"])
    tokens = torch.randint(0, 20, (2, 70), generator=torch.Generator().manual_seed(1))

    def carried_logits(variant: str) -> torch.Tensor:
        torch.manual_seed(0)
        model = DecoderLM(variant, config).eval()
        with torch.no_grad():
            first, states = model(tokens[:, :23])
            second, _ = model(tokens[:, 23:], states)
        return torch.cat([first, second], dim=1)

    plain = carried_logits("softmax")
    assert torch.equal(carried_logits(f"softmax:window={LM['context']}"), plain)
    assert not torch.equal(carried_logits(f"softmax:window={LM['context'] - 1}"), plain)


def test_retrieval_windows_over_the_whole_sequence_hash_as_softmax_outside_the_one_hot_path():
    """Every query reads the sequence's T keys (T = 2S in Setting 2): a window of at least T, in any
    form, is softmax's ``chunk`` form; ``auto`` without a window (the one-hot path) stays apart."""
    T = 2 * RETRIEVAL["S"]
    plain = run_id("retrieval", "softmax", {**RETRIEVAL, "form": "chunk"})
    for form in ("auto", "parallel", "chunk", "recurrent"):
        assert run_id("retrieval", f"softmax:window={T}", {**RETRIEVAL, "form": form}) == plain
        assert run_id("retrieval", f"softmax:window={10 * T}", {**RETRIEVAL, "form": form}) == plain
        assert run_id("retrieval", f"softmax:window={T - 1}", {**RETRIEVAL, "form": form}) != plain
    assert run_id("retrieval", "softmax", RETRIEVAL) != plain


def test_retrieval_window_of_the_whole_sequence_trains_the_curve_of_softmax():
    from dataclasses import replace

    from fwbench.run.training import fit
    from fwbench.tasks import RetrievalConfig

    torch.set_num_threads(1)
    config = RetrievalConfig(**RETRIEVAL, eval_sequences=4, eval_every=2, max_steps=3)
    T = config.sequence_length

    def curve(variant: str, form: str) -> list:
        return fit("retrieval", variant, replace(config, form=form), 1, torch.device("cpu")).curve

    plain = curve("softmax", "chunk")
    assert curve(f"softmax:window={T}", "auto") == plain
    assert curve(f"softmax:window={T - 1}", "chunk") != plain


def test_a_grid_refuses_equal_values_beside_a_window_no_call_reaches(tmp_path):
    """The grid's refusals compare runs by the variant as it computes: softmax beside
    softmax:window=context, in two blocks with checkpoint_every 2 and 4, trained one computation
    under two run ids (checkpoint_every is hashed)."""
    from fwbench.errors import FwbenchError
    from fwbench.run.grid import expand, load_grid

    path = tmp_path / "lm.toml"
    blocks = "".join(f'[[profiles.quick]]\nvariant = "{variant}"\ncheckpoint_every = {every}\nseed = 1\n'
                     for variant, every in (("softmax", 2), ("softmax:window=16", 4)))
    path.write_text(f'name = "lm"\ntask = "shakespeare"\n[defaults]\ncontext = 16\n{blocks}')
    with pytest.raises(FwbenchError, match=r"appears twice: checkpoint_every 2 and 4 act alike"):
        load_grid(path)
    path.write_text(path.read_text().replace("window=16", "window=15"))
    assert len(expand(load_grid(path), "quick")) == 2
