"""A form that runs the kernels ``auto`` runs names the run ``auto`` names (MQAR, the language model).

Softmax has one parallel kernel (its chunk form is its parallel form), ``auto`` is the sum and delta
rules' chunk form and the FWM rule's recurrent one: ``form = ["auto", "parallel", "chunk"]`` for softmax
trained one computation under three run ids, with equal records (found by h-break14g).
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest
import torch

from fwbench.run.grid import RunSpec
from fwbench.run.training import fit
from fwbench.tasks import MQARConfig, RetrievalConfig, ShakespeareConfig
from fwbench.variants.registry import form_in_use

CONFIGS = {"mqar": MQARConfig(vocab_size=16, seq_len=16, num_kv_pairs=2, d_model=8, batch_size=4, eval_sequences=8,
                              eval_every=3, max_steps=3),
           "shakespeare": ShakespeareConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16, context=8)}


def run_id(task: str, variant: str, form: str) -> str:
    return RunSpec("g", task, variant, 1, asdict(replace(CONFIGS[task], form=form))).run_id


@pytest.mark.parametrize("task", ["mqar", "shakespeare"])
@pytest.mark.parametrize(("variant", "same", "other"), [
    ("softmax", ("auto", "parallel", "chunk"), ("recurrent",)),
    ("linear", ("auto", "chunk"), ("parallel", "recurrent")),
    ("dpfp-delta:nu=1", ("auto", "chunk"), ("parallel", "recurrent")),
    ("tanh-fwm", ("auto", "recurrent"), ()),
])
def test_forms_running_autos_kernels_share_its_run_id(task, variant, same, other):
    assert len({run_id(task, variant, form) for form in same}) == 1
    assert len({run_id(task, variant, form) for form in (same[0], *other)}) == 1 + len(other)
    assert {form_in_use(variant, form) for form in same} == {form_in_use(variant, "auto")}


def test_softmax_forms_that_share_an_id_compute_the_same_record():
    torch.set_num_threads(1)
    results = [fit("mqar", "softmax", replace(CONFIGS["mqar"], form=form), 1, torch.device("cpu"))
               for form in ("auto", "parallel", "chunk")]
    assert results[0].curve == results[1].curve == results[2].curve


def retrieval_id(variant: str, form: str) -> str:
    return RunSpec("g", "retrieval", variant, 1, asdict(RetrievalConfig(setting=2, S=5, form=form))).run_id


def test_retrieval_softmax_forms_that_write_alike_share_a_run_id():
    """Every form writes softmax's cache alike (write_read reads after write()): parallel, chunk and
    recurrent name one run; auto without a window reads through the one-hot path, a run of its own."""
    assert len({retrieval_id("softmax", form) for form in ("parallel", "chunk", "recurrent")}) == 1
    assert retrieval_id("softmax", "auto") != retrieval_id("softmax", "chunk")
    assert len({retrieval_id("softmax:window=3", form) for form in ("auto", "parallel", "chunk", "recurrent")}) == 1
    assert retrieval_id("softmax", "auto") == RunSpec("g", "retrieval", "softmax", 1,
                                                      asdict(RetrievalConfig(setting=2, S=5))).run_id
    torch.set_num_threads(1)
    config = RetrievalConfig(setting=2, S=5, d_key=8, batch_size=4, eval_sequences=4, eval_every=3, max_steps=3)
    curves = [fit("retrieval", "softmax:window=3", replace(config, form=form), 1, torch.device("cpu")).curve
              for form in ("auto", "parallel", "recurrent")]
    assert curves[0] == curves[1] == curves[2]


@pytest.mark.parametrize("variant", ["linear-fwm", "tanh-fwm"])
def test_retrieval_fwm_forms_that_write_alike_share_a_run_id(variant):
    """The FWM rule writes with its one scan whichever form runs it: ``recurrent`` also computes the
    outputs ``forward`` returns, which the write-then-read discards, so ``auto`` and ``recurrent`` train
    the same weights and name one run (two run ids before; found by h-break14k). A plugin rule is not
    assumed to write alike: the built-in rule only."""
    assert retrieval_id(variant, "auto") == retrieval_id(variant, "recurrent")
    assert retrieval_id(variant, "auto") == RunSpec("g", "retrieval", variant, 1,
                                                    asdict(RetrievalConfig(setting=2, S=5))).run_id
    assert retrieval_id(variant, "auto") != retrieval_id("linear-delta", "auto")
    torch.set_num_threads(1)
    config = RetrievalConfig(setting=2, S=5, d_key=8, batch_size=4, eval_sequences=4, eval_every=3, max_steps=3)
    curves = [fit("retrieval", variant, replace(config, form=form), 1, torch.device("cpu")).curve
              for form in ("auto", "recurrent")]
    assert curves[0] == curves[1]


@pytest.mark.parametrize("variant", ["linear", "dpfp:nu=2", "favor:m=8"])
def test_retrieval_sum_rule_parallel_form_names_the_chunk_forms_run(variant):
    """The sum rule's parallel kernel ends with the sum W = Vᵀφ(K), z = Σφ(k) that its write computes
    (the chunk form's path), beside outputs the write-then-read discards: one run (two run ids before;
    found by h-break14k). ``auto`` (the one-hot read) and ``recurrent`` (a running sum) stay apart."""
    assert retrieval_id(variant, "parallel") == retrieval_id(variant, "chunk")
    assert len({retrieval_id(variant, form) for form in ("auto", "chunk", "recurrent")}) == 3
    torch.set_num_threads(1)
    config = RetrievalConfig(setting=2, S=5, d_key=8, batch_size=4, eval_sequences=4, eval_every=3, max_steps=3)
    curves = [fit("retrieval", variant, replace(config, form=form), 1, torch.device("cpu")).curve
              for form in ("chunk", "parallel")]
    assert curves[0] == curves[1]


def test_retrieval_delta_forms_stay_runs_of_their_own():
    assert len({retrieval_id("linear-delta", form) for form in ("auto", "chunk", "parallel", "recurrent")}) == 4
