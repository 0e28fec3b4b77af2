"""Training checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds the model, optimiser and schedule states, every random number generator the
loop draws from (torch's global RNG, which dropout uses, of every data-parallel rank; the data
generators and FAVOR+'s redraw stream; CUDA's RNG on a GPU), the step, the learning curve so far and
the loop's bookkeeping. Resuming from it on the same machine gives bit-for-bit the run that was
never interrupted.

Files are written to a temporary name and renamed into place, so a run killed while saving
leaves the previous checkpoint intact, never half a file.
"""

from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from fwbench.errors import FwbenchError, one_line

#: Bump when the checkpoint layout changes; older files are then refused with a clear message.
#: 2: the retrieval model stores W_k and W_β as their one-hot and embedding blocks.
#: 3: the loop state of :class:`fwbench.run.training.LoopState` (no ``best_eval`` of infinity), FAVOR+'s
#: redraw stream (``rng.generators.features``) and each data-parallel rank's dropout stream (``rng.ranks``).
CHECKPOINT_FORMAT = 3


def rng_states(generators: dict[str, torch.Generator], device: torch.device) -> dict[str, Any]:
    """Snapshot of torch's global RNG, CUDA's RNG (on a GPU) and the named generators."""
    states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    states["generators"] = {name: g.get_state() for name, g in generators.items()}
    return states


def restore_rng_states(states: dict[str, Any], generators: dict[str, torch.Generator], device: torch.device) -> None:
    """Inverse of :func:`rng_states`."""
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)
    for name, generator in generators.items():
        generator.set_state(states["generators"][name])


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (tensors, numbers, strings, lists, dicts) atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        torch.save({"format": CHECKPOINT_FORMAT, **payload}, temporary)
        os.chmod(temporary, 0o644)  # mkstemp creates 0600; a checkpoint is an ordinary result file
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return path


def discard_unfinished_writes(path: str | Path) -> list[Path]:
    """Delete the temporary files that :func:`save_checkpoint` left beside ``path`` when its process was killed
    between writing and renaming (SIGTERM or SIGKILL runs no ``finally``): each is a whole checkpoint, never read,
    and they piled up one per kill. Call it only where no other process can be writing ``path`` (the run's owner,
    before it trains). Returns the files deleted."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp")) if path.parent.is_dir() else []
    for temporary in stale:
        temporary.unlink(missing_ok=True)
    return stale


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    remedy: str = "delete it to restart") -> dict[str, Any] | None:
    """The payload saved at ``path``, or ``None`` if there is no file.

    ``remedy`` ends the error message: what the user should do about an unreadable file (a run
    resuming from its own checkpoint: delete it and start again; ``fwbench sample``: point
    ``--checkpoint`` at a checkpoint, never delete what it was pointed at).

    Raises:
        FwbenchError: the file is unreadable or from another checkpoint format; one line (torch's
            own message, which spans several lines, is cut to its first).
    """
    path = Path(path)
    if not path.is_file():
        return None
    # each refusal names the path by one_line: one holding a newline (a results directory $'R\nnew', --checkpoint
    # $'c\nk.pt') split the one-line error in two
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise FwbenchError(
            f"checkpoint {one_line(path)}: cannot be read ({type(exc).__name__}: {first_line}); {remedy}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise FwbenchError(f"checkpoint {one_line(path)}: format {got!r}, expected {CHECKPOINT_FORMAT}; {remedy}")
    return payload
