"""Character-level language modelling on Tiny Shakespeare (the paper's LM claims, Tables 2, 4, 5, at a
scale a CPU can train; the WikiText-103 numbers are the qualitative target).

Data: the corpus (1,115,394 characters, located and verified by :mod:`tasks.corpus`), a character
vocabulary built from the whole text (65 symbols), the first 90 % for training and the last 10 % for
validation. Training batches are random windows of ``context + 1`` characters; the loss is the mean
next-character cross-entropy in nats.

Model: :class:`tasks.lm_model.DecoderLM` with the run's attention variant.

Evaluation during training scores ``eval_segments`` evenly spaced validation segments (all of them
when 0), each from an empty memory. After training, :meth:`ShakespeareTask.final_evaluation`
scores the whole validation split that way (``val_loss``, ``val_ppl``, ``val_bpc``), then again as one
stream with the state carried across segments (:func:`tasks.lm_evaluation.long_context_evaluation`),
computes the unigram baseline, and samples ``sample_tokens`` characters after ``prompt``.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fwbench.tasks.base import check_fields, forward_acting_config, variant_over
from fwbench.variants import parse_spec
from fwbench.variants.errors import check_storage, shown
from fwbench.variants.kernels.precision import compute_dtype

from .corpus import CACHE_DIR_ENV, CORPUS_CHARACTERS, CORPUS_SHA256, CORPUS_URL, DATA_DIR_ENV, CorpusError, locate_corpus
from .lm_evaluation import (
    CARRIED_MULTIPLES,
    bits_per_character,
    carried_length_evaluation,
    language_model_metrics,
    long_context_evaluation,
    perplexity,
    segment_starts,
    sliding_window_losses,
    token_losses,
    unigram_loss,
)
from .lm_model import POSITIONAL, DecoderConfig, DecoderLM, check_decoder_storage

SCHEDULES = ("constant", "noam")
#: Validation segments per forward pass (at least; the training batch size if larger): evaluation
#: needs no gradients, and small batches would make a pass over the split needlessly slow.
EVAL_BATCH_SEGMENTS = 64


#: The longest sample a run or ``fwbench sample`` draws: one model step per character, so a million characters
#: take minutes to hours on a CPU (``sample_tokens`` of 2**60 - 1 passed the loader, trained, then sampled until
#: killed, with no record written).
MAX_SAMPLE_TOKENS = 1_000_000
SAMPLE_TOKENS_WHY = "one model step per sampled character"
#: The smallest dropout probability p whose keep probability 1 − p is not 1 in float64 (1 − 2**-54 ties to even, at
#: 1): below it dropout keeps every unit and rescales none, on any device, and acts as 0. (Above it a p may still
#: round away in float32, where the rescaling 1 / (1 − p) is computed, but the CPU draws which units to keep in
#: float64: p = 2.9e-8 dropped units, unscaled.)
SMALLEST_DROPOUT = math.nextafter(2.0 ** -54, math.inf)


@dataclass(frozen=True)
class ShakespeareConfig:
    """Hyper-parameters of one Tiny Shakespeare run (defaults: a CPU-sized model).

    Attributes:
        d_model, n_heads, n_layers, d_ff, dropout, tied_output, positional: the model (see
            :class:`tasks.lm_model.DecoderConfig`); d_key = d_model / n_heads.
        context: segment length in characters: the model's training context and softmax's window.
        train_segments: consecutive segments per training sequence. 1: independent segments, each
            from an empty memory (the paper's limited-context setup, Table 2). K > 1: every layer's
            state is carried from one segment into the next (the paper's carried-state training,
            Table 4, over K · context characters: the carried length seen in training).
        truncated_bptt: with K > 1, stop gradients at every segment boundary (the state is carried
            forward detached, as the official code carries it from batch to batch); off: gradients
            flow through all K segments.
        batch_size: sequences per training step.
        lr: peak learning rate of Adam; schedule: ``noam`` (linear warm-up over ``warmup_steps``,
            then ∝ 1/√step) or ``constant``; grad_clip: global gradient-norm clip (0 = off).
        max_steps: training steps; eval_every: steps between evaluations; eval_segments:
            validation segments scored per evaluation (0 = the whole split).
        patience, target_loss: early stopping (off by default: LM runs use their whole budget).
        checkpoint_every: save a resumable checkpoint every this many steps (0 = never).
        form, chunk_size: attention form and longest chunk of the model, for training and
            evaluation (unset chunk size: :data:`variants.DEFAULT_CHUNK_SIZE`); chosen when it is built.
        stream_eval: run the long-context evaluations after training, on the first
            ``stream_characters`` characters of the validation split (0 = all of it): the whole
            stream carried, and the carried-length evaluation at 1×, 4× and 16× the carried length
            seen in training (:func:`tasks.lm_evaluation.carried_length_evaluation`).
        sliding_stride: after training, also score the first ``stream_characters`` validation
            characters with a sliding window of ``context`` moved by this many characters (the
            paper's evaluation; 0 = off; see :func:`tasks.lm_evaluation.sliding_window_losses`).
        prompt, sample_tokens, temperature: the text sample stored in the record.
        train_fraction: leading share of the corpus used for training (the rest validates).
    """

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.0
    tied_output: bool = True
    positional: str = "none"
    context: int = 128
    train_segments: int = 1
    truncated_bptt: bool = False
    batch_size: int = 32
    lr: float = 2e-3
    schedule: str = "noam"
    warmup_steps: int = 100
    grad_clip: float = 1.0
    max_steps: int = 1000
    eval_every: int = 100
    eval_segments: int = 64
    patience: int = 1_000_000
    target_loss: float = 0.0
    checkpoint_every: int = 100
    form: str = "auto"
    chunk_size: int | None = None
    stream_eval: bool = True
    stream_characters: int = 0
    sliding_stride: int = 0
    prompt: str = "It is"
    sample_tokens: int = 500
    temperature: float = 0.8
    train_fraction: float = 0.9

    @property
    def d_key(self) -> int:
        """Key size per head (d_model / n_heads): the d_key of the attention variant, for d_dot."""
        return self.d_model // self.n_heads

    @property
    def sequence_length(self) -> int:
        """Tokens per training sequence (the harness's tokens/s uses it), also the carried length
        seen in training."""
        return self.context * self.train_segments

    def decoder_config(self, vocab_size: int) -> DecoderConfig:
        return DecoderConfig(
            vocab_size=vocab_size, d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers,
            d_ff=self.d_ff, context=self.context, dropout=self.dropout, tied_output=self.tied_output,
            positional=self.positional, form=self.form, chunk_size=self.chunk_size,
        )


@dataclass(frozen=True)
class CharCorpus:
    """A text as character ids with its train / validation split.

    Attributes:
        vocabulary: the distinct characters, sorted (id i is ``vocabulary[i]``).
        train, valid: 1-D int64 ids; ``train`` is the first ``train_fraction`` of the text.
    """

    vocabulary: str
    train: Tensor
    valid: Tensor

    @classmethod
    def from_text(cls, text: str, train_fraction: float = 0.9) -> CharCorpus:
        if len(text) < 4:
            raise CorpusError(f"corpus: got {len(text)} characters; expected a text of at least 4")
        vocabulary = "".join(sorted(set(text)))
        index = {c: i for i, c in enumerate(vocabulary)}
        ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
        split = int(train_fraction * len(text))
        return cls(vocabulary, ids[:split], ids[split:])

    def encode(self, text: str) -> Tensor:
        """Ids of ``text`` (1-D int64). Raises :class:`CorpusError` naming a character outside the vocabulary."""
        return encode(text, self.vocabulary)


def eval_batch(config: ShakespeareConfig) -> int:
    """Segments per evaluation forward pass."""
    return max(config.batch_size, EVAL_BATCH_SEGMENTS)


def encode(text: str, vocabulary: str) -> Tensor:
    """Ids of ``text`` under ``vocabulary`` (1-D int64).

    Raises:
        CorpusError: a character of ``text`` is not in the vocabulary (the message names it).
    """
    index = {c: i for i, c in enumerate(vocabulary)}
    missing = sorted({c for c in text if c not in index})
    if missing:
        raise CorpusError(f"text: characters {missing!r} are not in the {len(vocabulary)}-symbol vocabulary")
    return torch.tensor([index[c] for c in text], dtype=torch.int64)


def decode(ids: Tensor | list[int], vocabulary: str) -> str:
    """Text of a sequence of ids."""
    return "".join(vocabulary[i] for i in (ids.tolist() if isinstance(ids, Tensor) else ids))


@functools.lru_cache(maxsize=4)
def _corpus_at(path: str, train_fraction: float) -> CharCorpus:
    return CharCorpus.from_text(Path(path).read_text(encoding="utf-8"), train_fraction)


def check_fits_corpus(config: ShakespeareConfig, corpus: CharCorpus, error: type[ValueError]) -> None:
    """Check that ``config`` fits ``corpus``: its prompt in the vocabulary, one training window in the training
    split, one evaluation window in the validation split, and the long-context evaluation's stream there.

    Raises:
        error: naming ``prompt`` or ``train_fraction`` (:class:`~tasks.corpus.CorpusError` where a run builds its
            model, ``ValueError`` where the grid loader validates).
    """
    missing = sorted(set(config.prompt) - set(corpus.vocabulary))
    if missing:
        raise error(f"prompt: got {config.prompt!r}; characters {missing!r} are not in the corpus's "
                    f"{len(corpus.vocabulary)}-symbol vocabulary")
    whole = corpus.train.numel() + corpus.valid.numel()
    if whole < config.sequence_length + config.context + 2:  # then no train_fraction could help: not its fault
        raise error(f"context, train_segments: got {config.context}, {config.train_segments}; the corpus holds {whole} "
                    f"characters, fewer than a training window (context × train_segments + 1 = "
                    f"{config.sequence_length + 1}) and a validation window (context + 1) together")
    longest = max(CARRIED_MULTIPLES) * config.sequence_length
    if config.stream_eval and whole < config.sequence_length + longest + 2:  # no train_fraction fits both either
        raise error(f"context, train_segments: got {config.context}, {config.train_segments} with stream_eval = true; "
                    f"the corpus holds {whole} characters, fewer than a training window (context × train_segments + 1 = "
                    f"{config.sequence_length + 1}) and the long-context evaluation's stream ({max(CARRIED_MULTIPLES)} × "
                    f"context × train_segments + 1 = {longest + 1}) together (or stream_eval = false)")
    if corpus.train.numel() < config.sequence_length + 1:
        raise error(f"train_fraction: got {config.train_fraction}, which leaves {corpus.train.numel()} training "
                    f"characters; expected at least context × train_segments + 1 = {config.sequence_length + 1}")
    if corpus.valid.numel() < config.context + 1:
        raise error(f"train_fraction: got {config.train_fraction}, which leaves {corpus.valid.numel()} "
                    f"validation characters; expected at least context + 1 = {config.context + 1}")
    stream = min(config.stream_characters or corpus.valid.numel(), corpus.valid.numel())
    if config.stream_eval and stream < longest + 1:
        # validate() checks a stream_characters it is given; the split itself may be shorter: the carried
        # evaluation then read the whole stream at every length and recorded carried_ppl_16x for a length
        # it never carried
        raise error(f"train_fraction: got {config.train_fraction}, which leaves {corpus.valid.numel()} "
                    f"validation characters (stream_characters={config.stream_characters}); the long-context "
                    f"evaluation needs at least {max(CARRIED_MULTIPLES)} × context × train_segments + 1 = "
                    f"{longest + 1} (or stream_eval = false)")


class ShakespeareTask:
    """Character-level LM on Tiny Shakespeare, driven by ``fwbench.run.training.fit``.

    Args:
        data_dir: where to look for the corpus first (``None``: ``FWBENCH_DATA_DIR``, which
            ``fwbench run --data-dir`` sets); then the user cache, then a download.
        sha256, url, fetch: passed to :func:`tasks.corpus.locate_corpus` (tests use a small
            fake corpus with its own checksum).
    """

    name: ClassVar[str] = "shakespeare"
    config_class: ClassVar[type] = ShakespeareConfig
    #: computed in float64: the corpus split int(train_fraction · characters), and the sampling temperature,
    #: which divides the logits in float64 (1e-39 samples greedily, as ``fwbench sample --temperature 1e-39``)
    float64_keys: ClassVar[frozenset[str]] = frozenset({"train_fraction", "temperature"})

    def __init__(self, data_dir: str | Path | None = None, sha256: str = CORPUS_SHA256, url: str = CORPUS_URL,
                 fetch=None):
        self.data_dir, self.sha256, self.url, self.fetch = data_dir, sha256, url, fetch
        #: where the corpus was found and verified, per search setting: (path, size, mtime) of the file
        self._verified: dict[tuple, tuple[Path, int, int]] = {}

    def corpus(self, train_fraction: float = 0.9, download: bool = True) -> CharCorpus:
        """The located, verified corpus as ids (cached per file); ``download=False`` never touches the network.

        The checksum is computed once per file and search setting, not on every batch (hashing
        1.1 MB costs a few ms, a tenth of a small model's training step); it is computed again if
        the file's size or modification time changes, or the data-directory setting does.

        Raises:
            CorpusError: not found and not downloadable, or a checksum mismatch.
        """
        key = (str(self.data_dir), os.environ.get(DATA_DIR_ENV), os.environ.get(CACHE_DIR_ENV), self.sha256)
        known = self._verified.get(key)
        if known is not None:
            path, size, mtime = known
            try:
                stat = path.stat()
            except OSError:
                stat = None
            if stat is not None and (stat.st_size, stat.st_mtime_ns) == (size, mtime):
                return _corpus_at(str(path), train_fraction)
        path = Path(locate_corpus(self.data_dir, sha256=self.sha256, url=self.url, fetch=self.fetch, download=download))
        stat = path.stat()
        self._verified[key] = (path, stat.st_size, stat.st_mtime_ns)
        return _corpus_at(str(path), train_fraction)

    def validate(self, config: ShakespeareConfig) -> None:
        """Raise ``ValueError`` naming the field when a hyper-parameter is out of range."""
        check_fields(config,
                     positive=("d_model", "n_heads", "n_layers", "d_ff", "context", "train_segments", "batch_size",
                               "max_steps", "eval_every", "patience", "chunk_size"),
                     non_negative=("eval_segments", "checkpoint_every", "warmup_steps", "sample_tokens",
                                   "stream_characters", "sliding_stride"))
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model: got {config.d_model}; expected a multiple of n_heads={config.n_heads}")
        # sizes no tensor holds passed the grid loader and failed every run (the vocabulary is the corpus's: 1 here)
        check_decoder_storage(1, config.d_model, config.d_ff, config.context, config.positional, ValueError)
        check_storage({"batch_size": config.batch_size, "context": config.context, "train_segments": config.train_segments},
                      (config.batch_size, config.context * config.train_segments + 1),
                      "(batch_size, context · train_segments + 1) training windows", ValueError)
        # sample_tokens = 2**62 passed and the run failed at its end, after training, in generate(); 2**60 - 1 trained,
        # then sampled until killed, with no record written
        if config.sample_tokens > MAX_SAMPLE_TOKENS:
            raise ValueError(f"sample_tokens: got {shown(config.sample_tokens)}; expected at most {MAX_SAMPLE_TOKENS} "
                             f"({SAMPLE_TOKENS_WHY})")
        if config.lr <= 0:
            raise ValueError(f"lr: got {config.lr}; expected > 0")
        for name in ("grad_clip", "temperature"):
            if getattr(config, name) < 0:
                raise ValueError(f"{name}: got {getattr(config, name)}; expected >= 0")
        if not 0.0 <= config.dropout < 1.0:
            raise ValueError(f"dropout: got {config.dropout}; expected a probability in [0, 1)")
        if config.dropout and 1.0 - config.dropout == 1.0:
            # 1e-30 trained exactly as 0, under a run id of its own (break-it pass AU)
            raise ValueError(f"dropout: got {config.dropout!r}; expected 0 or at least {SMALLEST_DROPOUT!r} (1 − "
                             f"{config.dropout!r} rounds to 1 in float64, and so in float32: dropout keeps every unit "
                             "with probability 1 and rescales none, so it acts as 0)")
        if 0 < config.stream_characters < config.context + 1:
            raise ValueError(f"stream_characters: got {config.stream_characters}; expected 0 (the whole validation "
                             f"split) or at least context + 1 = {config.context + 1}")
        longest = max(CARRIED_MULTIPLES) * config.sequence_length
        if config.stream_eval and 0 < config.stream_characters < longest + 1:
            raise ValueError(f"stream_characters: got {config.stream_characters}; expected 0 (the whole validation "
                             f"split) or at least {max(CARRIED_MULTIPLES)} × context × train_segments + 1 = "
                             f"{longest + 1} (the longest carried length evaluated)")
        if config.sliding_stride > config.context:
            raise ValueError(f"sliding_stride: got {config.sliding_stride}; expected 0 (off) or at most "
                             f"context = {config.context}")
        if not 0.0 < config.train_fraction < 1.0:
            raise ValueError(f"train_fraction: got {config.train_fraction}; expected a fraction in (0, 1)")
        if config.schedule not in SCHEDULES:
            raise ValueError(f"schedule: got {config.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if config.positional not in POSITIONAL:
            raise ValueError(f"positional: got {config.positional!r}; expected one of {', '.join(POSITIONAL)}")
        if not config.prompt:
            raise ValueError("prompt: got ''; expected at least one character")
        self._check_against_corpus(config)

    def _check_against_corpus(self, config: ShakespeareConfig) -> None:
        """:func:`check_fits_corpus` where a verified copy of the corpus is already here (no download): a prompt
        character outside the vocabulary, or a ``train_fraction`` leaving no training window, passed the grid
        loader and stopped the grid after its earlier runs had trained (the local launcher; ``--jobs 2``
        recorded failed runs), naming ``text`` and ``context × train_segments``. Without a copy here the run
        locates or downloads it and checks the same in :meth:`build_model`."""
        try:
            corpus = self.corpus(config.train_fraction, download=False)
        except CorpusError:
            return
        check_fits_corpus(config, corpus, ValueError)

    def build_model(self, config: ShakespeareConfig, variant: str) -> DecoderLM:
        parse_spec(variant)
        corpus = self.corpus(config.train_fraction)
        check_fits_corpus(config, corpus, CorpusError)  # before training, not after it: every run would fail alike
        return DecoderLM(variant, config.decoder_config(len(corpus.vocabulary)), corpus.vocabulary)

    def inactive_keys(self, config: ShakespeareConfig, variant: str | None = None) -> dict[str, str]:
        """Config keys whose value cannot change what this config's run computes (with ``variant``, if
        given), each with why."""
        inactive = {}
        if config.schedule != "noam":
            inactive["warmup_steps"] = f"schedule={config.schedule!r} has no warm-up"
        if config.train_segments == 1:
            inactive["truncated_bptt"] = "train_segments=1 has no segment boundary to cut gradients at"
        elif variant is not None and parse_spec(variant).info.update_rule is None:
            # the model empties softmax's cache at every segment boundary (DecoderLM.forward): the segments
            # of a training sequence share no state, so cutting gradients there cuts nothing
            inactive["truncated_bptt"] = ("softmax's KV cache does not cross a segment boundary, so no gradient "
                                          "flows from one segment into the next")
        if not config.stream_eval and not config.sliding_stride:
            inactive["stream_characters"] = "stream_eval=false and sliding_stride=0 read no validation stream"
        if config.sample_tokens == 0:  # the prompt is still checked against the vocabulary (validate)
            inactive["temperature"] = "sample_tokens=0 samples no character"
            inactive["prompt"] = "sample_tokens=0 samples no character"
        return inactive

    def acting_config(self, config: ShakespeareConfig, variant: str) -> dict:
        """The config keys that act for ``variant`` (see :func:`fwbench.tasks.base.acting_config`); a key
        of :meth:`inactive_keys` is hashed at its default value, whatever the grid gave it, so that its
        values name one run (a grid that varies it is refused as naming a run twice) and runs that
        leave it at its default keep their ids."""
        acting = forward_acting_config(config, variant)
        if config.schedule == "noam" and config.warmup_steps == 0:  # the noam factor warms up over max(warmup, 1)
            acting["warmup_steps"] = 1
        defaults = {f.name: f.default for f in fields(ShakespeareConfig)}
        for key in self.inactive_keys(config, variant):
            acting[key] = defaults[key]
        return acting

    def values_as_they_act(self, config: ShakespeareConfig) -> dict[str, tuple[int | None, str]]:
        """Keys whose value acts as another (see :func:`fwbench.run.grid._refuse_equal_computations`; the run id
        hashes each as it acts): ``checkpoint_every`` acts on
        nothing a run computes (a resumed run ends with the same metrics); on the corpus this task
        verifies by its checksum, whose length is known, ``train_fraction`` acts as its training split's
        int(train_fraction · length) characters, and ``eval_segments`` of at least the validation split's
        segments and ``stream_characters`` of at least its characters act as 0 (all of it), and a
        ``sliding_stride`` of at least the characters between the first and the last sliding window's ends
        acts as that many (every such stride scores the same two windows)."""
        acts: dict[str, tuple[int | None, str]] = {
            "checkpoint_every": (None, "checkpoints say where a run can resume from, not what it computes")}
        if self.sha256 != CORPUS_SHA256:  # another corpus (tests): its length is not known before it is read
            return acts
        split = int(config.train_fraction * CORPUS_CHARACTERS)
        valid = CORPUS_CHARACTERS - split
        # CharCorpus.from_text splits at int(train_fraction · characters): fractions that round to one split
        # (0.9 and 0.9000001) train and score the same characters
        acts["train_fraction"] = (split, f"a training split of int(train_fraction × {CORPUS_CHARACTERS}) = {split} "
                                         "characters")
        segments = len(segment_starts(valid, config.context))
        # reported for every value, not only those of at least `segments`: 0 acts as itself, and hashed as given
        # it split from a default of 64 that acts as 0 too (train_fraction 0.995: two ids, break-it pass AI)
        everything = config.eval_segments == 0 or config.eval_segments >= segments
        acts["eval_segments"] = (0 if everything else config.eval_segments,
                                 f"the validation split has {segments} segments of context={config.context}; "
                                 "as many or more is all of them, as 0")
        if config.stream_characters >= valid:
            acts["stream_characters"] = (0, f"the validation split has {valid} characters; as many or more is all "
                                            "of them, as 0")
        if config.sliding_stride:
            # sliding_window_ends: windows end at min(context, N − 1), then every stride, and the last at N − 1;
            # a stride of at least the D = N − 1 − min(context, N − 1) characters between the first and last ends
            # leaves only those two ends (one window where D = 0): stride 36 and 64 at context 64 over 100
            # characters scored the same windows (a short stream_characters with stream_eval = false)
            text = min(config.stream_characters, valid) if config.stream_characters else valid
            last = text - 1
            first = min(config.context, last)
            widest = max(last - first, 1)
            if config.sliding_stride >= widest:
                acts["sliding_stride"] = (widest, f"the sliding window over the {text}-character validation text ends "
                                                  f"at {first} and then at {last}, the last character, for every "
                                                  f"stride of at least {widest}")
        return acts

    def longest_chunked_call(self, config: ShakespeareConfig) -> int:
        """The most tokens one attention call of a run covers: ``context`` (the model reads every stream in
        segments of ``context`` tokens aligned to its start; a call covers a segment or part of one,
        in training, evaluation and generation), so chunk sizes of at least ``context`` act alike
        (see :func:`fwbench.run.grid._chunks_as_they_act`)."""
        return config.context

    def chunked_call_lengths(self, config: ShakespeareConfig) -> set[int] | None:
        """The token counts T of the attention calls a run makes, on the corpus this task verifies by its
        checksum (whose length is known before it is read); ``None`` for another corpus (tests).

        Every call covers one segment of ``context`` tokens or part of one (:class:`~tasks.lm_model.DecoderLM`):
        ``context`` (training, every full segment of the evaluations, the sliding windows and the carried
        lengths, whose streams hold whole windows), the last, shorter segment of each stream scored segment
        by segment (:func:`~tasks.lm_evaluation.segment_starts`: the validation split, and the stream
        ``stream_characters`` keeps when ``stream_eval`` or ``sliding_stride`` reads one), the first sliding
        window of a stream shorter than ``context`` + 1, and the prompt's last piece where characters are
        sampled (with ``sample_tokens = 0`` the prompt is still read, in the model's form, but nothing
        it gives reaches the record: ``chunk_size = [6, 7]`` with the 7-character prompt "It is a"
        stored identical records). Two chunk sizes that cut each of these lengths into
        chunks of one length compute the same numbers (``chunk_size = [6, 7]`` at ``context = 16``: 3 chunks
        of 6 tokens, and the 3-token last segment of the validation split in one chunk, for both).
        """
        if self.sha256 != CORPUS_SHA256:  # another corpus: its split lengths are not known before it is read
            return None
        context = config.context

        def last_segment(characters: int) -> int:  # inputs of the last segment of segment_starts(characters)
            return characters - 1 - (characters - 2) // context * context

        valid = CORPUS_CHARACTERS - int(config.train_fraction * CORPUS_CHARACTERS)
        lengths = {context, last_segment(valid)}
        if config.stream_eval or config.sliding_stride:
            stream = min(config.stream_characters, valid) if config.stream_characters else valid
            lengths |= {last_segment(stream), min(context, stream - 1)}
        if config.sample_tokens:  # with nothing to sample, the prompt's read leaves nothing in the record
            lengths.add(len(config.prompt) % context or context)
        return lengths

    def acting_variant(self, config: ShakespeareConfig, variant: str) -> str:
        """The variant as it computes here (the run id hashes it): every attention call covers at most
        one segment of ``context`` tokens (softmax's cache starts empty in each), so softmax with a
        window of at least ``context`` keys is softmax (:func:`fwbench.tasks.base.variant_over`)."""
        return variant_over(variant, config.context)

    def train_batch(self, config: ShakespeareConfig, generator: torch.Generator) -> Tensor:
        """(batch_size, train_segments · context + 1) ids: random windows of the training split."""
        train = self.corpus(config.train_fraction).train
        length = config.sequence_length
        if train.numel() < length + 1:
            raise CorpusError(f"context × train_segments: got {length}; the training split has only "
                              f"{train.numel()} characters, expected at least {length + 1} (one window)")
        # a window is length + 1 characters: starts 0 … numel − length − 1, the last one included
        starts = torch.randint(0, train.numel() - length, (config.batch_size,), generator=generator)
        return train[starts[:, None] + torch.arange(length + 1)]

    def loss(self, model: DecoderLM, batch: Tensor, config: ShakespeareConfig) -> Tensor:
        """Mean next-character cross-entropy (nats) over the batch; the model reads each sequence in
        segments of ``context``, carrying fast-weight states across them (see :class:`DecoderLM`),
        with gradients cut at every segment boundary when ``config.truncated_bptt``."""
        inputs, targets = batch[:, :-1], batch[:, 1:]
        if config.truncated_bptt and inputs.shape[1] > config.context:
            pieces, states = [], None
            for start in range(0, inputs.shape[1], config.context):
                logits, states = model(inputs[:, start : start + config.context], states)
                states = [state.detach() for state in states]
                pieces.append(logits)
            logits = torch.cat(pieces, dim=1)
        else:
            logits, _ = model(inputs)
        # fp32 (float64 for a float64 model: .float() rounded its loss and gradients to fp32)
        return F.cross_entropy(logits.to(compute_dtype(logits)).reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model: DecoderLM, config: ShakespeareConfig, generator: torch.Generator,
                 device: torch.device) -> dict[str, float]:
        """``loss`` (nats/char), ``ppl`` and ``bpc`` on ``eval_segments`` validation segments
        (deterministic: the same segments every time; ``generator`` is unused)."""
        valid = self.corpus(config.train_fraction).valid
        losses = token_losses(model, valid, config.context, device, carry=False, batch_size=eval_batch(config),
                              max_segments=config.eval_segments)
        return language_model_metrics(losses.double().mean().item())

    @torch.no_grad()
    def final_evaluation(self, model: DecoderLM, config: ShakespeareConfig, device: torch.device,
                         seed: int) -> dict:
        """Whole-split validation metrics, the unigram baseline, the long-context evaluation and a sample.

        Returns ``{"metrics": {val_loss, val_ppl, val_bpc, unigram_bpc, [stream_ppl, stream_bpc,
        stream_reset_ppl, carried_ppl_1x, carried_ppl_4x, carried_ppl_16x], [sliding_ppl, sliding_bpc,
        segments_ppl]}, "long_context": {...} and "carried_lengths": {...} (if ``stream_eval``),
        "sliding_window": {stride, characters, ppl, segments_ppl} (if ``sliding_stride``),
        "sample": {prompt, temperature, seed, text}}``. ``segments_ppl`` is the independent-segment
        perplexity of the same characters the sliding window scored.
        """
        corpus = self.corpus(config.train_fraction)
        out: dict = {}
        val_loss = token_losses(model, corpus.valid, config.context, device, carry=False,
                                batch_size=eval_batch(config)).double().mean().item()
        val = language_model_metrics(val_loss)
        metrics = {"val_loss": val["loss"], "val_ppl": val["ppl"], "val_bpc": val["bpc"],
                   "unigram_bpc": bits_per_character(unigram_loss(corpus.train, corpus.valid, len(corpus.vocabulary)))}
        if config.stream_eval:
            stream = corpus.valid[: config.stream_characters] if config.stream_characters else corpus.valid
            out["long_context"] = long_context_evaluation(model, stream, config.context, device,
                                                          batch_size=eval_batch(config))
            metrics["stream_ppl"] = out["long_context"]["carried_ppl_all"]
            metrics["stream_bpc"] = bits_per_character(out["long_context"]["carried_loss"])
            metrics["stream_reset_ppl"] = out["long_context"]["reset_ppl_all"]
            carried = carried_length_evaluation(model, stream, config.sequence_length, config.context, device,
                                                batch_size=eval_batch(config))
            out["carried_lengths"] = carried
            for multiple, ppl in zip(CARRIED_MULTIPLES, carried["ppl"], strict=True):
                metrics[f"carried_ppl_{multiple}x"] = ppl
        if config.sliding_stride:
            text = corpus.valid[: config.stream_characters] if config.stream_characters else corpus.valid
            sliding = sliding_window_losses(model, text, config.context, config.sliding_stride, device,
                                            batch_size=eval_batch(config)).double().mean().item()
            segments = token_losses(model, text, config.context, device, carry=False,
                                    batch_size=eval_batch(config)).double().mean().item()
            out["sliding_window"] = {"stride": config.sliding_stride, "characters": int(text.numel()),
                                     "ppl": perplexity(sliding), "segments_ppl": perplexity(segments)}
            metrics.update(sliding_ppl=perplexity(sliding), sliding_bpc=bits_per_character(sliding),
                           segments_ppl=perplexity(segments))
        out["metrics"] = metrics
        out["sample"] = sample_text(model, corpus.vocabulary, config.prompt, config.sample_tokens,
                                    config.temperature, seed, device)
        return out


def sample_text(model: DecoderLM, vocabulary: str, prompt: str, n_tokens: int, temperature: float, seed: int,
                device: torch.device, top_k: int | None = None) -> dict:
    """Generate ``n_tokens`` characters after ``prompt`` (recurrent form, carried state).

    Returns ``{prompt, temperature, seed, tokens, text}``; ``text`` includes the prompt.
    """
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = encode(prompt, vocabulary)[None].to(device)
    ids, _ = model.generate(prompt_ids, n_tokens, temperature, generator, top_k=top_k)
    return {"prompt": prompt, "temperature": temperature, "seed": seed, "tokens": n_tokens,
            "text": prompt + decode(ids[0], vocabulary)}


__all__ = ["CharCorpus", "ShakespeareConfig", "ShakespeareTask", "decode", "encode", "sample_text"]
