"""What the progress bar names each run: runs that share a label are told apart by their config.

New-user run of 7 December: the Shakespeare quick grid's carried-state runs and its second learning rate were
shown with the same label as other runs (``linear [d_model=64] seed=1`` three times), which read as runs trained
again."""

from __future__ import annotations

from fwbench.run.grid import expand, load_grid, shown_labels


def test_runs_sharing_a_label_are_told_apart_by_the_values_that_differ():
    specs = expand(load_grid("shakespeare"), "quick")
    shown = shown_labels(specs)
    assert len(set(shown.values())) == len(specs)
    linear_seed_1 = sorted(label for label in shown.values() if label.startswith("linear [d_model=64] seed=1 "))
    assert linear_seed_1 == ["linear [d_model=64] seed=1 (lr=0.006, train_segments=1)",
                             "linear [d_model=64] seed=1 (lr=0.006, train_segments=4)",
                             "linear [d_model=64] seed=1 (lr=0.012, train_segments=1)"]
    assert shown[next(s.run_id for s in specs if s.variant == "softmax")] == "softmax [d_model=64] seed=1 (lr=0.006)"


def test_a_run_alone_under_its_label_keeps_it():
    specs = expand(load_grid("capacity"), "quick")
    assert [shown_labels(specs)[spec.run_id] for spec in specs] == [spec.label for spec in specs]
