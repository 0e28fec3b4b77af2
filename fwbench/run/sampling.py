"""``fwbench sample``: text from a trained language-model checkpoint.

The checkpoint of a Tiny Shakespeare run (``<results_dir>/checkpoints/<run_id>.pt``) holds the
model's weights, its config and vocabulary, so sampling needs neither the corpus nor the grid.
Generation runs token by token in the recurrent form with the carried state.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fwbench.errors import FwbenchError, check_seed
from fwbench.run.checkpoint import load_checkpoint
from fwbench.run.grid import task_config_of
from fwbench.tasks.lm_model import DecoderLM
from fwbench.tasks.shakespeare import MAX_SAMPLE_TOKENS, SAMPLE_TOKENS_WHY, ShakespeareTask, sample_text
from fwbench.variants.errors import shown


def load_language_model(path: str | Path, device: torch.device) -> tuple[DecoderLM, dict]:
    """The trained :class:`DecoderLM` stored in a run checkpoint, and that run's metadata.

    Raises:
        FwbenchError: no such file, an unreadable file, or a checkpoint of another task.
    """
    saved = load_checkpoint(path, device, remedy="expected a checkpoint of a Shakespeare run, "
                                                 "<results-dir>/checkpoints/RUN_ID.pt")
    if saved is None:  # no file there: nothing, or a directory (which "does not exist" would misname)
        # Path("") is the working directory: --checkpoint "$UNSET" is named as what it is
        what = "is empty" if not str(path) else "is a directory" if Path(path).is_dir() else "does not exist"
        raise FwbenchError(f"--checkpoint: {str(path)!r} {what}; expected a checkpoint file of a Shakespeare run, "
                           "<results-dir>/checkpoints/RUN_ID.pt")
    if saved.get("task") != ShakespeareTask.name:
        raise FwbenchError(f"--checkpoint: {str(path)!r} is from task {saved.get('task')!r}; expected shakespeare")
    try:  # a key this version's config lacks raised the dataclass's bare TypeError
        config = task_config_of(ShakespeareTask.name, saved["config"])
    except FwbenchError as exc:
        raise FwbenchError(f"--checkpoint: {str(path)!r} holds a config this version of fwbench cannot read: {exc}") from None
    vocabulary = "".join(chr(c) for c in saved["model"]["vocabulary_codes"].tolist())
    model = DecoderLM(saved["variant"], config.decoder_config(len(vocabulary)), vocabulary).to(device)
    model.load_state_dict(saved["model"])
    model.eval()
    loop = saved["loop"]
    return model, {"variant": saved["variant"], "config": config, "seed": saved["seed"], "step": loop["step"],
                   "finished": loop["finished"], "status": loop.get("status")}


def sample_from_checkpoint(path: str | Path, prompt: str, tokens: int, temperature: float, seed: int,
                           device: torch.device, top_k: int | None = None) -> tuple[str, dict]:
    """Generated text (prompt included) and the checkpoint's metadata.

    Raises:
        FwbenchError: bad checkpoint, a prompt character outside the vocabulary, or a bad
            ``tokens`` / ``temperature`` / ``top_k``.
    """
    if tokens < 0:
        raise FwbenchError(f"--tokens: got {tokens}; expected an integer >= 0")
    if tokens > MAX_SAMPLE_TOKENS:  # 2**60 - 1 sampled until killed, printing nothing; 2**62 was named n_tokens
        raise FwbenchError(f"--tokens: got {shown(tokens)}; expected at most {MAX_SAMPLE_TOKENS} ({SAMPLE_TOKENS_WHY})")
    if not math.isfinite(temperature) or temperature < 0:
        raise FwbenchError(f"--temperature: got {temperature}; expected a finite number >= 0 (0 = greedy)")
    check_seed(seed, "--seed")
    model, info = load_language_model(path, device)
    if info["status"] == "diverged":
        raise FwbenchError(
            f"--checkpoint: {str(path)!r} holds a run that diverged at step {info['step']}; its samples would "
            "mean nothing: sample from a run that finished"
        )
    vocabulary = model.vocabulary
    if not prompt:
        raise FwbenchError("--prompt: got ''; expected at least one character")
    missing = sorted({c for c in prompt if c not in vocabulary})
    if missing:
        raise FwbenchError(
            f"--prompt: characters {missing!r} are not in the model's {len(vocabulary)}-symbol vocabulary"
        )
    if top_k is not None and not 1 <= top_k <= len(vocabulary):
        raise FwbenchError(f"--top-k: got {top_k}; expected an integer in [1, {len(vocabulary)}]")
    sample = sample_text(model, vocabulary, prompt, tokens, temperature, seed, device, top_k=top_k)
    return sample["text"], info
