"""Checkpoint files: written atomically, read back, and refused with one clear line when they come
from another layout (a resume must not load weights into the wrong parameters)."""

from __future__ import annotations

import pytest
import torch

from fwbench.errors import FwbenchError
from fwbench.run.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint


def test_round_trip_and_missing_file(tmp_path):
    path = save_checkpoint(tmp_path / "run.pt", {"model": {"w": torch.ones(2)}, "loop": {"step": 3}})
    payload = load_checkpoint(path)
    assert payload["format"] == CHECKPOINT_FORMAT and payload["loop"]["step"] == 3
    assert torch.equal(payload["model"]["w"], torch.ones(2))
    assert load_checkpoint(tmp_path / "absent.pt") is None


def test_a_checkpoint_of_another_format_is_refused_with_one_line(tmp_path):
    """Format 1 stored the retrieval model's whole-token W_k and W_β; format 2 stores their blocks."""
    path = tmp_path / "run.pt"
    torch.save({"format": 1, "model": {"W_k.weight": torch.zeros(4, 9)}}, path)
    with pytest.raises(FwbenchError, match=rf"format 1, expected {CHECKPOINT_FORMAT}; delete it to restart"):
        load_checkpoint(path)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(FwbenchError, match="(?s)cannot be read .*delete it to restart"):
        load_checkpoint(path)


@pytest.mark.parametrize("content", ["not a checkpoint", "other format"])
def test_a_checkpoint_path_holding_a_newline_is_named_on_one_line(tmp_path, content):
    """Break-it finding (h-breakE, the kind of 9588a00): the refusals named the path as it is, so a checkpoint in a
    results directory $'R\\nnew' (or ``fwbench sample --checkpoint $'c\\nk.pt'``) split the one-line error in two,
    'checkpoint …/c' / 'k.pt: cannot be read …'; the path is now written as one_line writes it."""
    path = tmp_path / "c\nk.pt"
    if content == "other format":
        torch.save({"format": 1}, path)
    else:
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(FwbenchError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"checkpoint {tmp_path}/c\\nk.pt: "), message

