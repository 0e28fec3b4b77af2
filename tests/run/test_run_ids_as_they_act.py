"""The run id hashes each config value as it acts (issue 14 item 12, break-it pass AH): values that act alike
were refused when one grid listed both, but hashed as given, so a second invocation with the other value
(``embedding_factor`` 2.0 then 2.2 at S = 4, the LM's ``checkpoint_every`` 3 then 0, MQAR's ``power_a`` with
one query gap) trained the same computation again under a new id."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from fwbench.run.grid import RunSpec
from fwbench.run.launchers import LaunchOptions
from fwbench.run.runner import run_grid
from fwbench.run.store import ResultsStore
from fwbench.tasks.mqar import MQARConfig
from fwbench.tasks.retrieval import RetrievalConfig
from fwbench.tasks.shakespeare import ShakespeareConfig


def run_id(task: str, config) -> str:
    return RunSpec("g", task, "linear", 1, asdict(config)).run_id


@pytest.mark.parametrize(("task", "make", "alike", "unlike"), [
    ("retrieval", lambda v: RetrievalConfig(S=4, d_key=4, embedding_factor=v), (2.0, 2.2), (2.0, 3.0)),
    ("shakespeare", lambda v: ShakespeareConfig(checkpoint_every=v), (0, 125), None),
    ("shakespeare", lambda v: ShakespeareConfig(train_fraction=v), (0.9, 0.9000001), (0.9, 0.8)),
    # a split too short for the default 64 segments: 64 and 0 both score all of it (break-it pass AI: two ids)
    ("shakespeare", lambda v: ShakespeareConfig(train_fraction=0.995, eval_segments=v), (0, 64), (0, 3)),
    ("mqar", lambda v: MQARConfig(seq_len=4, num_kv_pairs=1, vocab_size=16, power_a=v), (0.01, 3.0), None),
    ("mqar", lambda v: MQARConfig(seq_len=16, num_kv_pairs=2, vocab_size=16, power_a=v), (0.01, 0.010000001),
     (0.01, 0.5)),
])
def test_values_that_act_alike_share_a_run_id_and_values_that_do_not_keep_theirs(task, make, alike, unlike):
    assert run_id(task, make(alike[0])) == run_id(task, make(alike[1]))
    if unlike is not None:
        assert run_id(task, make(unlike[0])) != run_id(task, make(unlike[1]))


def test_a_second_invocation_with_a_value_that_acts_alike_trains_nothing(tmp_path):
    store = ResultsStore(tmp_path / "results")
    options = LaunchOptions(device="cpu")
    config = dict(S=4, d_key=4, batch_size=2, eval_every=2, eval_sequences=2, max_steps=2)
    first = RunSpec("g", "retrieval", "linear", 1, asdict(RetrievalConfig(**config, embedding_factor=2.0)))
    second = RunSpec("g", "retrieval", "linear", 1, asdict(RetrievalConfig(**config, embedding_factor=2.2)))
    run_grid([first], store, options, quiet=True)
    run_grid([second], store, options, quiet=True)
    assert len(store.records()) == 1


@pytest.mark.parametrize(("task", "config"), [("retrieval", RetrievalConfig(S=20)), ("shakespeare", ShakespeareConfig()),
                                              ("mqar", MQARConfig())])
def test_a_run_whose_values_are_the_defaults_keeps_the_id_it_had(task, config):
    """Hashing values as they act re-keys only runs whose values act as another: one at the task's defaults is
    hashed as before (its config as given), so its stored records are found."""
    spec = RunSpec("g", task, "linear", 1, asdict(config))
    assert spec.run_id == spec.given_id
    moved = RunSpec("g", task, "linear", 1, {**asdict(config), "patience": 10**6 + 7, "max_steps": 4, "eval_every": 2})
    assert moved.run_id != moved.given_id  # a patience no run can exhaust acts as the 2 evaluations scheduled


def test_a_python_spec_is_type_checked_but_hashed_as_given():
    """Break-it pass AN: task_config_of converted the values it checked (an int lr to 1.0), so the run id of a
    spec built in Python with lr=1 changed (b880be672634027d at 361cd0b) and its stored runs would retrain; a
    field annotated other than int/float/str/bool (a registered task's tuple) was checked as a str and its own
    default refused."""
    from dataclasses import dataclass, fields

    from fwbench.run.grid import _plain_type

    assert RunSpec(grid="g", task="retrieval", variant="linear", seed=1, config={"S": 4, "lr": 1}).run_id == \
        "b880be672634027d"

    @dataclass
    class Annotated:
        lengths: tuple[int, ...] = (1, 2)
        extra: int | None = 3
        rate: float = 0.5

    assert [_plain_type(field) for field in fields(Annotated)] == [None, int, float]
