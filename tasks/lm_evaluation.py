"""Language-model evaluation: loss per token (nats), perplexity, bits per character, the unigram
baseline, and the long-context evaluation with the state carried across segments.

Units: losses are natural-log cross-entropies in nats per token; perplexity = exp(loss);
bits per character (bpc) = loss / ln 2 (one token is one character here).

Two ways to score the same validation tokens (every token after the first is predicted once):

- ``carry=False`` (the training condition): the text is cut into segments of ``context`` tokens and
  each segment starts from an empty memory; segments are independent, so they run as one batch.
- ``carry=True`` (Table 4 of the paper, in spirit): the text is one stream, read segment after
  segment with each layer's state carried on, never reset or truncated: fast-weight variants carry
  W (and z), softmax its KV cache, limited to its window of ``context`` keys.

Comparing the two per position bucket shows whether a memory degrades (sum rule: ever more
associations summed into a fixed-size W) or holds (delta rule) as the stream grows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from fwbench.variants.kernels.precision import compute_dtype

LN2 = math.log(2.0)


def bits_per_character(loss_nats: float) -> float:
    """Cross-entropy in nats per character → bits per character."""
    return loss_nats / LN2


def perplexity(loss_nats: float) -> float:
    """exp(loss); ``inf`` when the loss overflows."""
    return math.exp(loss_nats) if loss_nats < 700 else math.inf


def language_model_metrics(loss_nats: float) -> dict[str, float]:
    """``loss`` (nats/token), ``ppl`` and ``bpc`` of one mean cross-entropy."""
    return {"loss": loss_nats, "ppl": perplexity(loss_nats), "bpc": bits_per_character(loss_nats)}


def segment_starts(n_tokens: int, context: int) -> list[int]:
    """Start of each segment: the stream of ``n_tokens`` ids predicts ids 1..n−1 in non-overlapping
    windows of ``context`` inputs (the last one may be shorter)."""
    return list(range(0, max(n_tokens - 1, 0), context))


def evenly_spaced(items: list, count: int) -> list:
    """``count`` items spread evenly over ``items`` (all of them if ``count`` ≤ 0 or ≥ len)."""
    if count <= 0 or count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


@torch.no_grad()
def token_losses(model, ids: Tensor, context: int, device: torch.device, carry: bool,
                 batch_size: int = 64, max_segments: int = 0) -> Tensor:
    """Cross-entropy (nats) of every predicted token of ``ids`` (1-D int64), as a 1-D fp32 tensor
    (float64 for a float64 model).

    Entry i is the loss of predicting ids[i + 1] from what came before it: all previous tokens of
    its segment (``carry=False``) or of the whole stream (``carry=True``).

    Args:
        model: a :class:`tasks.lm_model.DecoderLM` (or anything with its call signature).
        ids: (N,) token ids; N − 1 tokens are scored.
        context: segment length (the training context).
        batch_size: segments per forward pass when ``carry=False``.
        max_segments: score only this many evenly spaced segments (``carry=False``; 0 = all);
            the returned tensor then holds only their tokens.
    """
    was_training = model.training
    model.eval()
    starts = segment_starts(ids.numel(), context)
    losses = []
    if carry:
        states = None
        for start in starts:
            window = ids[start : start + context + 1].to(device)
            logits, states = model(window[None, :-1], states)
            losses.append(F.cross_entropy(logits[0].to(compute_dtype(logits)), window[1:], reduction="none"))
    else:
        chosen = evenly_spaced(starts, max_segments)
        full = [s for s in chosen if s + context + 1 <= ids.numel()]
        tail = [s for s in chosen if s + context + 1 > ids.numel()]
        for first in range(0, len(full), batch_size):
            group = torch.tensor(full[first : first + batch_size])
            windows = ids[group[:, None] + torch.arange(context + 1)].to(device)
            logits, _ = model(windows[:, :-1])
            per_token = F.cross_entropy(logits.to(compute_dtype(logits)).transpose(1, 2), windows[:, 1:], reduction="none")
            losses.append(per_token.reshape(-1))
        for start in tail:
            window = ids[start:].to(device)
            logits, _ = model(window[None, :-1])
            losses.append(F.cross_entropy(logits[0].to(compute_dtype(logits)), window[1:], reduction="none"))
    model.train(was_training)
    return torch.cat(losses).cpu() if losses else torch.zeros(0)


def position_buckets(n_scored: int, context: int) -> list[tuple[int, int]]:
    """Position ranges [lo, hi) of a stream: the first segment, then doubling spans
    [context, 2·context), [2·context, 4·context), … up to ``n_scored``."""
    edges = [0, context]
    while edges[-1] < n_scored:
        edges.append(edges[-1] * 2)
    edges = [e for e in edges if e < n_scored] + [n_scored]
    return list(zip(edges[:-1], edges[1:], strict=True))


def bucket_losses(losses: Tensor, buckets: list[tuple[int, int]]) -> list[float]:
    """Mean loss (nats) of each position bucket."""
    return [losses[lo:hi].double().mean().item() for lo, hi in buckets]


def long_context_evaluation(model, ids: Tensor, context: int, device: torch.device, batch_size: int = 64) -> dict:
    """Score ``ids`` with and without the carried state; perplexity per position bucket.

    Returns a JSON-ready dict: ``context``, ``tokens`` (scored), ``buckets`` ([lo, hi) pairs),
    ``carried_ppl`` and ``reset_ppl`` per bucket, and the overall ``carried_loss`` /
    ``reset_loss`` (nats) with their ``_ppl``. The first bucket is identical in both (the
    memory starts empty), a built-in check.
    """
    carried = token_losses(model, ids, context, device, carry=True)
    reset = token_losses(model, ids, context, device, carry=False, batch_size=batch_size)
    buckets = position_buckets(carried.numel(), context)
    carried_loss, reset_loss = carried.double().mean().item(), reset.double().mean().item()
    return {
        "context": context,
        "tokens": int(carried.numel()),
        "buckets": [list(b) for b in buckets],
        "carried_ppl": [perplexity(x) for x in bucket_losses(carried, buckets)],
        "reset_ppl": [perplexity(x) for x in bucket_losses(reset, buckets)],
        "carried_loss": carried_loss,
        "carried_ppl_all": perplexity(carried_loss),
        "reset_loss": reset_loss,
        "reset_ppl_all": perplexity(reset_loss),
    }


def unigram_loss(train_ids: Tensor, eval_ids: Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats/char) of ``eval_ids`` under the character frequencies of ``train_ids``.

    The baseline that knows only how often each character occurs; add-one (Laplace) smoothing
    keeps a character unseen in training finite.
    """
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    log_p = counts.log() - counts.sum().log()
    return -log_p[eval_ids].mean().item()


#: Carried lengths of the long-context evaluation, as multiples of the length carried in training (C10).
CARRIED_MULTIPLES = (1, 4, 16)


def sliding_window_ends(n_tokens: int, context: int, stride: int) -> list[int]:
    """End (exclusive, in input positions) of each sliding window over a stream of ``n_tokens`` ids.

    Windows end at ``context``, ``context + stride``, … and the last one at ``n_tokens − 1``, so that
    every predicted id 1..n−1 is scored once: the first window scores all its tokens, each later one
    only the targets after the previous window's end.
    """
    last = n_tokens - 1
    if last < 1:
        return []
    ends = list(range(min(context, last), last + 1, stride))
    if ends[-1] != last:
        ends.append(last)
    return ends


@torch.no_grad()
def sliding_window_losses(model, ids: Tensor, context: int, stride: int, device: torch.device,
                          batch_size: int = 64) -> Tensor:
    """Cross-entropy (nats) of every predicted token of ``ids`` (1-D int64) by a sliding window.

    The paper's evaluation of limited-context models (Sec. 6): each window of ``context`` inputs
    starts from an empty memory; it moves by ``stride`` tokens and scores only the targets it adds,
    so every token after the first ``context`` is predicted from at least ``context − stride + 1``
    preceding tokens (exactly ``context`` at stride 1), never from a truncated segment start as in
    ``token_losses(carry=False)``. Entry i is the loss of ids[i + 1]; N − 1 entries for N ids.

    Cost: about context / stride times the forward passes of the independent-segment evaluation.

    Raises:
        ValueError: ``stride`` outside [1, context] (the message names it).
    """
    if not 1 <= stride <= context:
        raise ValueError(f"stride: got {stride}; expected an integer in [1, context={context}]")
    was_training = model.training
    model.eval()
    ends = sliding_window_ends(ids.numel(), context, stride)
    # every window holds min(context, N − 1) inputs (the first and last are aligned to the stream's
    # ends), so they batch; window i scores the targets after the previous window's end
    starts = [max(0, end - context) for end in ends]
    scored_from = [0] + ends[:-1]
    losses = []
    for first in range(0, len(ends), batch_size):
        group = slice(first, first + batch_size)
        inputs = torch.stack([ids[s : e + 1] for s, e in zip(starts[group], ends[group], strict=True)]).to(device)
        logits, _ = model(inputs[:, :-1])
        per_token = F.cross_entropy(logits.to(compute_dtype(logits)).transpose(1, 2), inputs[:, 1:], reduction="none")
        for row, (start, scored) in enumerate(zip(starts[group], scored_from[group], strict=True)):
            losses.append(per_token[row, scored - start :])
    model.train(was_training)
    return torch.cat(losses).cpu() if losses else torch.zeros(0)


def carried_stream(ids: Tensor, longest: int) -> Tensor:
    """The longest prefix of ``ids`` whose scored tokens fill whole windows of ``longest`` inputs
    (at least one window; shorter streams are returned whole)."""
    windows = max(1, (ids.numel() - 1) // longest)
    return ids[: windows * longest + 1]


@torch.no_grad()
def carried_length_evaluation(model, ids: Tensor, train_length: int, context: int, device: torch.device,
                              batch_size: int = 64, multiples: tuple[int, ...] = CARRIED_MULTIPLES) -> dict:
    """Perplexity with the state carried over ``m × train_length`` tokens, for each m in ``multiples`` (C10).

    The same tokens are scored at every length: the stream (the longest prefix of ``ids`` holding whole
    windows of the longest length) is cut into windows of ``m · train_length`` tokens, each read from
    an empty memory, segment by segment of ``context`` with every layer's state carried across the
    segments inside it (the paper's Table 4 evaluation, at finite lengths). A memory that holds keeps
    its perplexity as m grows; one that fills up (the sum rule) degrades. Softmax, whose KV cache
    never crosses a segment boundary (see :mod:`tasks.lm_model`), scores the same at every m.

    Args:
        ids: (N,) validation ids; train_length: tokens carried in training (context × train_segments).

    Returns a JSON-ready dict: ``train_length``, ``lengths`` (tokens carried), ``tokens`` (scored),
    ``loss`` (nats) and ``ppl`` per length, and ``ppl_ratio`` (each ppl ÷ the ppl at the first length).
    """
    lengths = [m * train_length for m in multiples]
    stream = carried_stream(ids, max(lengths))
    losses = [token_losses(model, stream, length, device, carry=False,
                           batch_size=max(1, batch_size * context // length)).double().mean().item()
              for length in lengths]
    ppl = [perplexity(loss) for loss in losses]
    return {"train_length": train_length, "lengths": lengths, "tokens": int(stream.numel() - 1), "loss": losses,
            "ppl": ppl, "ppl_ratio": [p / ppl[0] for p in ppl]}
