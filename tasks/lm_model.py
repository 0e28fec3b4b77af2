"""A small decoder-only Transformer language model whose attention is any variant spec.

nanoGPT-sized and plain: token embedding (+ optional learned position embedding) → N pre-norm blocks
(x + Attn(LN(x)), then x + FFN(LN(x))) → final LayerNorm → output layer (tied to the embedding or not).

Positions (``positional``): ``"none"`` adds nothing, as the seed implementation and the paper's
carried-state language models do (``--no_pos`` in the official code): causal attention and the
fast-weight recurrence order the tokens by themselves (Irie et al. 2019). ``"learned"`` adds a learned
embedding of the position inside the segment, as the paper's limited-context models (Table 2) add
positional encodings; at a CPU budget it trains much faster.

Segments: the model reads any token stream in segments of ``context`` tokens aligned to the stream's
start (the carried state counts the tokens). Positions restart at every segment. Fast-weight
variants carry their state (W, and z for the sum rule) from segment to segment with no limit;
variants without a fixed-size memory (softmax, whose state is a KV cache that grows with every
token) start each segment with an empty cache: their window is their segment, the length they were
trained on. So, for a stream split anywhere,

    logits_a, states = model(tokens[:, :t])
    logits_b, states = model(tokens[:, t:], states)

equals one call on the whole stream (up to rounding), whichever form each call runs (the model's, or
one set for a block with :func:`variants.using_form`); generation
one token at a time is the special case t = 1, 2, ….
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fwbench.tasks.base import LAYERS_WHY, MAX_LAYERS, check_ids
from fwbench.variants import AttentionLayer, VariantSpec, parse_spec, using_form
from fwbench.variants.checks import check_state_position
from fwbench.variants.errors import MAX_SIZE, VariantError, bad_value, check_storage
from fwbench.variants.feature_maps import positive_int

POSITIONAL = ("none", "learned")


def check_decoder_storage(vocab_size: int, d_model: int, d_ff: int, context: int, positional: str,
                          error: type[ValueError] = VariantError) -> None:
    """Refuse sizes whose decoder weights no tensor holds (:func:`~fwbench.variants.errors.check_storage`): the
    (vocab_size, d_model) embedding, the (d_ff, d_model) feed-forward, the (d_model, d_model) attention
    projections, and the (context, d_model) position embedding where ``positional`` is ``"learned"`` (only then
    does it exist: a context of 10**17 without it was refused once, naming a tensor that was never built)."""
    sizes = [("vocab_size", vocab_size), ("d_ff", d_ff)] + ([("context", context)] if positional == "learned" else [])
    for name, rows in sizes:
        check_storage({name: rows, "d_model": d_model}, (rows, d_model), f"({name}, d_model) weight", error)
    check_storage({"d_model": d_model}, (d_model, d_model), "(d_model, d_model) attention projection", error)


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of a :class:`DecoderLM`.

    Attributes:
        vocab_size: number of token ids (65 characters for Tiny Shakespeare).
        d_model: residual stream width; n_heads: attention heads (d_key = d_model / n_heads).
        n_layers: number of blocks; d_ff: hidden size of each block's feed-forward network.
        context: training segment length in tokens (also softmax's key window).
        dropout: dropout on the embedding and on each residual branch (training only); any real number
            in [0, 1) (a numpy float, a ``Fraction``), kept as a ``float``.
        tied_output: output layer shares the token embedding matrix (Press & Wolf 2017).
        positional: ``"none"`` or ``"learned"`` (an embedding of the position inside the segment).
        form, chunk_size: the attention form and longest chunk of every layer (``auto`` / unset:
            the variant's fastest form and the rule's default chunk size); see
            :func:`variants.build_attention`. Generation switches to the recurrent form itself.

    Raises:
        VariantError: a size that is not a positive integer or is above 2**63 − 1 (``n_layers`` above
            :data:`~fwbench.tasks.base.MAX_LAYERS`), ``d_model`` not a multiple of
            ``n_heads``, ``dropout`` not a number in [0, 1), ``tied_output`` not a bool, an unknown
            ``positional``.
    """

    vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 512
    context: int = 128
    dropout: float = 0.0
    tied_output: bool = True
    positional: str = "none"
    form: str = "auto"
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "context"):
            # positive_int takes NumPy ints too (np.int64(2) was refused as "expected a positive integer")
            limit = (MAX_LAYERS, LAYERS_WHY) if name == "n_layers" else (MAX_SIZE, "")
            object.__setattr__(self, name, positive_int(name, getattr(self, name), *limit))
        check_decoder_storage(self.vocab_size, self.d_model, self.d_ff, self.context, self.positional)
        if self.d_model % self.n_heads:
            raise bad_value("d_model", self.d_model, f"a multiple of n_heads={self.n_heads}")
        # the types too: a string dropout raised a bare TypeError ('<='), and a truthy non-bool
        # tied_output ('no', 0.5) tied the output weights silently
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real) \
                or not 0.0 <= self.dropout < 1.0:
            raise bad_value("dropout", self.dropout, "a probability in [0, 1)")
        # any real number the check accepts is kept as the float torch reads: a Fraction(1, 2) passed
        # the check and then raised torch's bare TypeError (dropout(): argument 'p' must be float) at
        # the first training forward
        object.__setattr__(self, "dropout", float(self.dropout))
        if not isinstance(self.tied_output, bool):
            raise bad_value("tied_output", self.tied_output, "True or False")
        if self.positional not in POSITIONAL:
            raise bad_value("positional", self.positional, f"one of {', '.join(POSITIONAL)}")


def check_vocabulary(vocabulary: object, vocab_size: int) -> None:
    """Refuse a ``vocabulary`` that cannot name the ``vocab_size`` ids: not ``None`` or a string (an int raised a
    bare ``TypeError: object of type 'int' has no len()``), of another length, or repeating a symbol (``"aab"``
    was accepted, and two ids then decoded as one character).

    Raises:
        VariantError: naming ``vocabulary``.
    """
    if vocabulary is None:
        return
    if not isinstance(vocabulary, str):
        raise bad_value("vocabulary", vocabulary, f"None or a string of the {vocab_size} symbols (vocab_size), in id order")
    if len(vocabulary) != vocab_size:
        raise bad_value("vocabulary", f"{len(vocabulary)} symbols", f"{vocab_size} (vocab_size)")
    repeated = sorted(symbol for symbol, count in Counter(vocabulary).items() if count > 1)
    if repeated:
        raise bad_value("vocabulary", vocabulary, f"distinct symbols (repeated: {repeated!r}; two ids would decode alike)")


class FeedForward(nn.Module):
    """Position-wise FFN: Linear(d_model → d_ff), GELU, Linear(d_ff → d_model)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class DecoderBlock(nn.Module):
    """Pre-norm block: x + Attn(LN(x)), then x + FFN(LN(x)); (B, T, d_model) → same."""

    def __init__(self, variant: VariantSpec, config: DecoderConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = AttentionLayer(variant, config.d_model, config.n_heads, form=config.form,
                                        chunk_size=config.chunk_size)
        self.ffn_norm = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, state=None):
        y, state = self.attention(self.attention_norm(x), state=state)
        x = x + self.dropout(y)
        x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        return x, state


class DecoderLM(nn.Module):
    """Decoder-only Transformer LM around any attention variant.

    Args:
        variant: attention spec (``"dpfp-delta:nu=1"``, ``"softmax"``, …).
        config: :class:`DecoderConfig`.
        vocabulary: optional string of the ``vocab_size`` symbols, in id order; stored with the
            weights (a buffer of code points) so that a checkpoint can be sampled without the corpus.

    Raises:
        VariantError: bad spec or sizes (see :class:`variants.AttentionLayer`).
    """

    def __init__(self, variant: str | VariantSpec, config: DecoderConfig, vocabulary: str | None = None):
        super().__init__()
        check_vocabulary(vocabulary, config.vocab_size)
        self.config = config
        self.spec = parse_spec(variant)
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = (
            nn.Embedding(config.context, config.d_model) if config.positional == "learned" else None
        )
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(self.spec, config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        codes = [ord(c) for c in vocabulary] if vocabulary is not None else [-1] * config.vocab_size
        self.register_buffer("vocabulary_codes", torch.tensor(codes, dtype=torch.int64))
        self._init_weights()
        if config.tied_output:
            self.output.weight = self.embedding.weight

    def _init_weights(self) -> None:
        # GPT-2's scheme: N(0, 0.02), residual output projections scaled by 1/√(2·n_layers) so that
        # the residual stream's variance does not grow with depth.
        # Query and key projections keep the attention layer's own (PyTorch default) initialisation:
        # at N(0, 0.02) every q·k is near 0, φ(q)·φ(k) is nearly constant for every feature map, and
        # attention starts as a uniform average that is slow to leave (at the quick profile's budget:
        # softmax 2.78 vs 2.73 bpc, FAVOR+ with the delta rule stuck near 3.45 bpc).
        keep = {id(m) for block in self.blocks for m in (block.attention.q_proj, block.attention.k_proj)}
        for module in self.modules():
            if id(module) in keep:
                continue
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attention.out_proj.weight, std=residual_std)
            nn.init.normal_(block.ffn.down.weight, std=residual_std)

    @property
    def vocabulary(self) -> str | None:
        """The symbols in id order, or ``None`` if the model was built without them."""
        codes = self.vocabulary_codes.tolist()
        return None if any(c < 0 for c in codes) else "".join(chr(c) for c in codes)

    def num_parameters(self) -> int:
        """Trainable parameters, a tied output layer counted once."""
        return sum(p.numel() for p in self.parameters())

    @property
    def carries_state(self) -> bool:
        """Whether the attention keeps a fixed-size memory across segments (fast weights) rather
        than a KV cache emptied at every segment boundary (softmax)."""
        return self.blocks[0].attention.d_dot is not None

    def forward(self, tokens: Tensor, states: list | None = None) -> tuple[Tensor, list]:
        """Next-token logits for every position.

        Args:
            tokens: (B, T) int64 ids in [0, vocab_size), continuing the stream that ``states``
                summarises (``None``: a new stream).
            states: per-layer states returned by the previous call.

        Returns:
            logits (B, T, vocab_size) (unnormalised; log-softmax gives nats) and the list of
            per-layer states after the last token.
        """
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.int64:
            got = (tuple(tokens.shape), tokens.dtype) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise bad_value("tokens", got, "an int64 tensor of shape (B, T)")
        # meta ids into a CPU model read the CPU embedding (garbage logits, no error); an id outside the
        # vocabulary raised "IndexError: index out of range in self" from it
        check_ids("tokens", tokens, self.config.vocab_size, "vocab_size", self.embedding.weight.device, VariantError)
        if states is not None and not isinstance(states, (list, tuple)):  # one layer's state, an int, a generator:
            # "TypeError: object of type 'FastWeightState' has no len()"
            raise bad_value("states", type(states).__name__, "the list of per-layer states the previous call returned")
        if states is not None and not len(states):  # what a call of no token on a new stream returns:
            states = None  # still a new stream (refused as "0 states", a split at t = 0 did not continue)
        if states is not None and len(states) != len(self.blocks):
            raise bad_value("states", f"{len(states)} states", f"one per layer ({len(self.blocks)})")
        # every layer has seen the same tokens; the segments are cut at the first layer's position, so a
        # None (read as .position) or a state of another call beside it would be carried on unnoticed
        positions = [] if states is None else [getattr(state, "position", None) for state in states]
        # no set: a position may be unhashable
        if any(position is None or _differs(position, positions[0]) for position in positions):
            raise bad_value("states", f"positions {positions}", "the per-layer states of one call, all at one position")
        for position in positions:  # the segments are cut at the first before any layer checks its state (a
            check_state_position(position)  # float 3.0 raised a bare TypeError slicing the tokens, a string '3' one
            # adding to it); every one: a call of no token returned [3, 3.0] (equal) unchecked, which T > 0 refuses
        context = self.config.context
        offset = 0 if states is None else int(states[0].position)  # a NumPy count adds in its width (uint8 wraps)
        pieces, start = [], 0
        while start < tokens.shape[1]:
            # cut at the next segment boundary of the stream
            stop = min(tokens.shape[1], start + context - (offset + start) % context)
            if (offset + start) % context == 0 and states is not None and not self.carries_state:
                states = None  # a KV cache does not cross a segment boundary
            logits, states = self._segment(tokens[:, start:stop], (offset + start) % context, states)
            pieces.append(logits)
            start = stop
        if not pieces:
            return self.output.weight.new_zeros(tokens.shape[0], 0, self.config.vocab_size), states or []
        return torch.cat(pieces, dim=1), states

    def _segment(self, tokens: Tensor, first_position: int, states: list | None) -> tuple[Tensor, list]:
        """Tokens inside one segment, the first at position ``first_position`` of it."""
        x = self.embedding(tokens)
        if self.position_embedding is not None:
            x = x + self.position_embedding.weight[first_position : first_position + tokens.shape[1]]
        x = self.embedding_dropout(x)
        new_states = []
        for index, block in enumerate(self.blocks):
            x, state = block(x, None if states is None else states[index])
            new_states.append(state)
        return self.output(self.final_norm(x)), new_states

    @torch.no_grad()
    def generate(self, prompt: Tensor, n_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None, top_k: int | None = None,
                 states: list | None = None) -> tuple[Tensor, list]:
        """Sample ``n_tokens`` continuations of ``prompt`` one token at a time.

        The prompt is read in one call (the model's form), then every new token goes through the
        recurrent form with the carried state: O(1) memory per token for fast-weight variants
        (the state is W and z), a KV cache of at most ``context`` tokens for softmax (emptied at
        every segment boundary; see the module docstring).

        Args:
            prompt: (B, P) int64 ids, P ≥ 1.
            n_tokens: tokens to sample (≥ 0).
            temperature: logits are divided by it before sampling; 0 means greedy (argmax).
            generator: RNG for sampling (seeded by the caller for reproducible text).
            top_k: sample among the k most likely tokens only (``None``: all).

        Returns:
            (B, n_tokens) sampled ids and the per-layer states after the last one.

        Raises:
            VariantError: empty prompt, negative ``n_tokens`` (or one whose (B, n_tokens) ids no tensor holds) or
                ``temperature``, bad ``top_k``, a ``generator`` that is not a ``torch.Generator``.
        """
        # the types first: a list prompt raised AttributeError ('dim'), a string or None count, temperature or
        # top_k a bare TypeError ('<'), a float count or top_k one from range() or topk() after the prompt's
        # read; a bool count (True) sampled one token
        if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.shape[1] < 1:
            got = tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__
            raise bad_value("prompt", got, "ids of shape (B, P) with P >= 1")
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, numbers.Integral) or n_tokens < 0:
            raise bad_value("n_tokens", n_tokens, "an integer >= 0")
        n_tokens = int(n_tokens)
        # 2**62 tokens generated until killed, and no tensor could have held them
        check_storage({"n_tokens": n_tokens}, (prompt.shape[0], n_tokens), "(B, n_tokens) sampled ids")
        try:  # as a float: a Fraction passed the check and raised TypeError dividing the logits, an int
            # past float's range (10**400) raised OverflowError from math.isfinite
            value = math.nan if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
                else float(temperature)
        except OverflowError:
            value = math.inf
        if value < 0 or not math.isfinite(value):
            raise bad_value("temperature", temperature, "a finite number >= 0 (0 = greedy)")
        temperature = value
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                                  or not 1 <= top_k <= self.config.vocab_size):
            raise bad_value("top_k", top_k, f"an integer in [1, {self.config.vocab_size}] or None")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise bad_value("generator", type(generator).__name__, "a torch.Generator or None")
        was_training = self.training
        self.eval()
        try:  # a refused call (a prompt id outside the vocabulary, states of another batch) left it in eval mode
            logits, states = self(prompt, states)
            next_logits = logits[:, -1]
            sampled = []
            with using_form(self, "recurrent"):
                for _ in range(n_tokens):
                    token = sample_next(next_logits, temperature, generator, top_k)
                    sampled.append(token)
                    logits, states = self(token, states)
                    next_logits = logits[:, -1]
        finally:
            self.train(was_training)
        out = torch.cat(sampled, dim=1) if sampled else prompt.new_zeros(prompt.shape[0], 0)
        return out, states


def _differs(position: object, first: object) -> bool:
    """Whether two layers' positions differ; ``False`` where ``!=`` has no truth value (a tensor or an
    array of several counts raised a bare "Boolean value of Tensor with more than one value is
    ambiguous" or NumPy's ValueError): such a position is no count, and is refused as one next."""
    try:
        return bool(position != first)
    except (RuntimeError, ValueError):
        return False


def sample_next(logits: Tensor, temperature: float, generator: torch.Generator | None = None,
                top_k: int | None = None) -> Tensor:
    """One token id per row of ``logits`` (B, V) → (B, 1): greedy at temperature 0, else sampled
    from softmax(logits / temperature), restricted to the ``top_k`` largest logits if given."""
    if not torch.isfinite(logits).all():
        raise VariantError("logits: got non-finite values (NaN or inf); expected finite logits (a model whose "
                           "weights diverged cannot sample)")
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # subtract the max first: a tiny temperature then sends the others to −inf, never to inf − inf;
    # in float64, so that any positive Python float divides as itself (1e-46 is 0 in fp32: 0/0)
    scaled = logits.double()
    scaled = (scaled - scaled.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        threshold = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < threshold, -math.inf)
    probabilities = torch.softmax(scaled, dim=-1)
    # multinomial draws from a CPU generator; sample on CPU, then return on the logits' device
    return torch.multinomial(probabilities.cpu(), 1, generator=generator).to(logits.device)


def states_nbytes(states: list) -> int:
    """Bytes held by a list of per-layer carried states (W and z, or a KV cache)."""
    return sum(state.nbytes for state in states)
