"""Multi-query associative recall (MQAR), following the generator of Zoology (Arora, Eyuboglu et al.
2023, "Zoology: Measuring and Improving Recall in Efficient Language Models", Section 3).

A sequence of ``seq_len`` tokens opens with ``num_kv_pairs`` key-value pairs ``k₁ v₁ k₂ v₂ …``:
keys are distinct tokens from the lower half of the vocabulary (``[1, V/2)``), values distinct tokens
from the upper half (``[V/2, V)``). Each key is then asked once more, later in the sequence, at a
position drawn without replacement from a power law over the ``(seq_len − 2·num_kv_pairs) / 2`` even
query slots, p(gap = i) ∝ i^(a − 1) for i = 1, 2, … (``power_a`` = a = 0.01: most queries come soon
after the context, a few much later). The model must predict, at each query position, the value
paired with the key there; only those positions are scored (label ``IGNORE`` = −100 elsewhere). Every
other position holds a token drawn uniformly from the whole vocabulary (Zoology's
``random_non_queries``; with ``random_non_queries=False`` they are 0).

Model (small, one attention variant per run): token embedding of size d_model, then ``n_layers``
pre-norm residual blocks, each a token-shift mixer (a linear map of [x_t; x_{t−1}], the causal
short-convolution that Zoology's models use so that a value token can see the key before it)
followed by :class:`variants.AttentionLayer`; a final layer norm and a linear read-out to the
vocabulary. Loss: cross-entropy (nats) at the scored positions only.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fwbench.tasks.base import LAYERS_WHY, MAX_LAYERS, check_fields, check_ids, check_int, forward_acting_config, variant_over
from fwbench.variants import AttentionLayer, parse_spec
from fwbench.variants.errors import check_storage, shown
from fwbench.variants.kernels.precision import compute_dtype

#: Label of a position that is not scored (as in Zoology and torch's cross_entropy default).
IGNORE = -100


@dataclass(frozen=True)
class MQARConfig:
    """Hyper-parameters of one MQAR run.

    Attributes:
        vocab_size: V; keys come from [1, V/2), values from [V/2, V).
        seq_len: tokens per sequence (even).
        num_kv_pairs: key-value pairs per sequence, each queried once.
        power_a: exponent a of the query-gap power law p(i) ∝ i^(a−1) (1.0 = uniform).
        random_non_queries: fill unscored positions with random tokens (else 0).
        d_model, n_heads, n_layers: model size; d_key = d_model / n_heads.
        batch_size, lr: Adam with this learning rate on batches of this many sequences.
        eval_every, eval_sequences: evaluation cadence (steps) and fresh sequences per evaluation.
        target_loss, patience, max_steps: early stopping (see :mod:`fwbench.run.training`).
        form, chunk_size: attention form (``auto`` picks the fastest the variant has) and longest
            chunk (unset: :data:`variants.DEFAULT_CHUNK_SIZE`), chosen when the model is built.
    """

    vocab_size: int = 512
    seq_len: int = 64
    num_kv_pairs: int = 8
    power_a: float = 0.01
    random_non_queries: bool = True
    d_model: int = 64
    n_heads: int = 1
    n_layers: int = 2
    batch_size: int = 64
    lr: float = 1e-3
    eval_every: int = 100
    eval_sequences: int = 256
    target_loss: float = 0.01
    patience: int = 5
    max_steps: int = 5000
    form: str = "auto"
    chunk_size: int | None = None

    @property
    def sequence_length(self) -> int:
        return self.seq_len

    @property
    def d_key(self) -> int:
        """Per-head key size d_model / n_heads (what φ's d_dot is computed from)."""
        return self.d_model // self.n_heads


def power_law_probabilities(space: int, power_a: float) -> Tensor:
    """p(i) ∝ a · i^(a−1) for i = 1..space, normalised (Zoology's query-gap distribution), (space,)."""
    i = torch.arange(1, space + 1, dtype=torch.float64)
    terms = power_a * i ** (power_a - 1)
    p = terms / terms.sum()
    if not bool(torch.isfinite(terms.sum())) or bool((terms.abs() < torch.finfo(terms.dtype).tiny).any()):
        # i^(a−1) overflows float64 for a large a (a ≈ 400 at 240 gaps), or only their sum does (a = 129.5:
        # finite terms / inf gave p = 0 everywhere, finite, so it went unnoticed), and a · i^(a−1) is subnormal or 0
        # for a subnormal a (a = 5e-324 put all the mass on gap 1, not ∝ 1/i): the same law from its logarithm
        # (the factor a cancels), shifted so that the largest term is exp(0) (i = space for a > 1, i = 1
        # for a < 1)
        log_i = torch.log(i)
        exponent = (power_a - 1) * (log_i - (log_i[-1] if power_a > 1 else 0.0))
        p = torch.exp(exponent)
        p = p / p.sum()
    return p


def generate_mqar(batch: int, vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float,
                  generator: torch.Generator, random_non_queries: bool = True) -> tuple[Tensor, Tensor]:
    """MQAR inputs and labels, each (batch, seq_len) int64; labels are ``IGNORE`` except at queries.

    Raises:
        ValueError: seq_len odd, vocabulary too small for distinct keys and values, more pairs
            than fit (Zoology's constraint 4·num_kv_pairs ≤ seq_len), or a ``power_a`` so large that
            fewer than num_kv_pairs gaps keep a non-zero probability; ``batch`` not an integer >= 0,
            ``vocab_size``, ``seq_len`` or ``num_kv_pairs`` not a positive integer (sizes at most
            2**63 − 1), ``power_a`` not a finite number > 0, ``generator`` not a torch.Generator,
            ``random_non_queries`` not a bool (checked first: torch raised its own errors on them, and
            ``"no"`` filled randomly).
    """
    # the checked ints from here on: a narrow NumPy int (np.uint8) overflowed in the arithmetic below (4 · 64 = 0)
    batch = check_int("batch", batch, 0, " (sequences; 0 draws an empty batch)")
    vocab_size, seq_len, num_kv_pairs = (check_int(name, size) for name, size in (
        ("vocab_size", vocab_size), ("seq_len", seq_len), ("num_kv_pairs", num_kv_pairs)))
    # power_a <= 0 drew from a distribution that looked valid; a string raised a TypeError deep in the power law
    try:
        valid = not isinstance(power_a, bool) and isinstance(power_a, numbers.Real) and 0 < float(power_a) < math.inf
    except OverflowError:  # an int such as 10**400
        valid = False
    if not valid:
        # a Fraction(1, 10**400), an int 10**400 or a long double 1e-4000 is > 0 and finite, but not as the
        # float the power law takes
        exact_but_not_float = (not isinstance(power_a, bool) and isinstance(power_a, numbers.Real)
                               and math.inf > power_a > 0)
        rounds = "; it is not one as a float (0.0 or inf)" if exact_but_not_float else ""
        raise ValueError(f"power_a: got {shown(power_a)}; expected a finite number > 0 (p(gap = i) ∝ i^(a−1)){rounds}")
    power_a = float(power_a)  # a Fraction passed the check and raised a TypeError against a tensor
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: got {generator!r}; expected a torch.Generator")
    if not isinstance(random_non_queries, (bool, np.bool_)):
        raise ValueError(f"random_non_queries: got {random_non_queries!r}; expected True or False")
    check_storage({"batch": batch, "seq_len": seq_len}, (batch, seq_len), "(batch, seq_len) inputs", ValueError)
    if seq_len % 2:
        raise ValueError(f"seq_len: got {seq_len}; expected an even number")
    if 4 * num_kv_pairs > seq_len:
        raise ValueError(f"num_kv_pairs: got {num_kv_pairs}; expected at most seq_len / 4 = {seq_len // 4}")
    half = vocab_size // 2
    if half - 1 < num_kv_pairs:
        raise ValueError(f"vocab_size: got {vocab_size}; expected at least 2·(num_kv_pairs + 1) = "
                         f"{2 * (num_kv_pairs + 1)} for distinct keys and values")
    context = 2 * num_kv_pairs
    # distinct keys in [1, V/2) and distinct values in [V/2, V) per sequence: the first n of a permutation
    keys = torch.rand(batch, half - 1, generator=generator).argsort(dim=-1)[:, :num_kv_pairs] + 1
    values = torch.rand(batch, vocab_size - half, generator=generator).argsort(dim=-1)[:, :num_kv_pairs] + half
    space = (seq_len - context) // 2
    p = power_law_probabilities(space, power_a).float()
    if int((p > 0).sum()) < num_kv_pairs:  # multinomial without replacement would fail with a bare RuntimeError
        raise ValueError(f"power_a: got {shown(power_a)}; with {space} possible query gaps, p(gap = i) ∝ i^(a−1) leaves "
                         f"{int((p > 0).sum())} gap(s) a non-zero probability in fp32, fewer than num_kv_pairs = "
                         f"{num_kv_pairs}; expected a smaller power_a")
    p = p.expand(batch, space)
    gaps = torch.multinomial(p, num_kv_pairs, replacement=False, generator=generator)  # (batch, n) in [0, space)

    inputs = torch.zeros(batch, seq_len, dtype=torch.long)
    inputs[:, 0:context:2] = keys
    inputs[:, 1:context:2] = values
    query_positions = context + 2 * gaps
    inputs.scatter_(1, query_positions, keys)
    labels = torch.full((batch, seq_len), IGNORE, dtype=torch.long)
    labels.scatter_(1, query_positions, values)
    if random_non_queries:
        filler = torch.randint(0, vocab_size, (batch, seq_len), generator=generator)
        is_filler = torch.ones(batch, seq_len, dtype=torch.bool)
        is_filler[:, :context] = False
        is_filler.scatter_(1, query_positions, False)
        inputs = torch.where(is_filler, filler, inputs)
    return inputs, labels


class TokenShift(nn.Module):
    """y_t = W [x_t; x_{t−1}] (x_{−1} = 0): a causal convolution of width 2 over tokens."""

    def __init__(self, d_model: int):
        super().__init__()
        self.mix = nn.Linear(2 * d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        previous = F.pad(x, (0, 0, 1, 0))[:, :-1]
        return self.mix(torch.cat([x, previous], dim=-1))


def check_mqar_storage(vocab_size: int, d_model: int) -> None:
    """Refuse sizes whose :class:`MQARModel` weights no tensor holds (:func:`~fwbench.variants.errors.check_storage`):
    the (vocab_size, d_model) embedding and output head, and the (d_model, d_model) attention projections.

    Raises:
        ValueError: naming ``vocab_size`` and ``d_model``, or ``d_model``.
    """
    check_storage({"vocab_size": vocab_size, "d_model": d_model}, (vocab_size, d_model),
                  "(vocab_size, d_model) embedding", ValueError)
    check_storage({"d_model": d_model}, (d_model, d_model), "(d_model, d_model) attention projection", ValueError)


class MQARModel(nn.Module):
    """Embedding → n_layers × (token shift, attention variant), pre-norm residual → read-out.

    Raises:
        ValueError: ``vocab_size``, ``d_model``, ``n_heads`` or ``n_layers`` not a positive integer, a size
            above 2**63 − 1, or ``n_layers`` above :data:`~fwbench.tasks.base.MAX_LAYERS`.
        VariantError: a bad variant spec, form or chunk size, or d_model not a multiple of n_heads
            (:class:`variants.AttentionLayer`).
    """

    def __init__(self, variant: str, vocab_size: int, d_model: int, n_heads: int = 1, n_layers: int = 2,
                 form: str = "auto", chunk_size: int | None = None):
        super().__init__()
        # before any module is made: vocab_size -1 raised torch's RuntimeError, n_layers 0 (or -1) built a
        # model without attention silently
        vocab_size, d_model, n_heads = (check_int(name, size) for name, size in (
            ("vocab_size", vocab_size), ("d_model", d_model), ("n_heads", n_heads)))
        n_layers = check_int("n_layers", n_layers, maximum=MAX_LAYERS, why=LAYERS_WHY)
        check_mqar_storage(vocab_size, d_model)
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.shift_norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.shifts = nn.ModuleList(TokenShift(d_model) for _ in range(n_layers))
        self.attention_norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.attentions = nn.ModuleList(
            AttentionLayer(variant, d_model, n_heads, form=form, chunk_size=chunk_size) for _ in range(n_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        self.read_out = nn.Linear(d_model, vocab_size)

    def hidden(self, tokens: Tensor) -> Tensor:
        """(B, T) token ids → (B, T, d_model) final hidden states."""
        x = self.embedding(tokens)
        for shift_norm, shift, attention_norm, attention in zip(
            self.shift_norms, self.shifts, self.attention_norms, self.attentions, strict=True
        ):
            x = x + shift(shift_norm(x))
            y, _ = attention(attention_norm(x))
            x = x + y
        return self.final_norm(x)

    def forward(self, tokens: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Logits (N, V) at the N scored positions (row-major order) and their labels (N,).

        Raises:
            ValueError: tokens that are not (B, T) integer ids in [0, vocab_size) on the model's device, or
                labels not of the tokens' shape, naming the argument (:func:`check_mqar_ids`).
        """
        check_mqar_ids(self.embedding.num_embeddings, tokens, labels, self.embedding.weight.device)
        h = self.hidden(tokens)
        scored = labels != IGNORE
        return self.read_out(h[scored]), labels[scored]


def check_mqar_ids(vocab_size: int, tokens: Tensor, labels: Tensor, device: torch.device) -> None:
    """Refuse MQAR inputs that are not token ids and their labels: tokens (B, T) int64 (or int32) ids in
    [0, vocab_size) on ``device``, labels an integer tensor of the same shape, as the retrieval model's
    ids are (:func:`fwbench.tasks.retrieval.check_token_ids`). An id outside the vocabulary raised
    "IndexError: index out of range in self" from the embedding (a device-side assert on CUDA), float
    or 1-D tokens a RuntimeError deep in torch, labels of another shape an IndexError from the mask.
    The device and range checks are :func:`~fwbench.tasks.base.check_ids`.

    Raises:
        ValueError: naming ``tokens`` or ``labels``, with the shape, dtype, device or range expected.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype not in (torch.int32, torch.int64):
        got = f"{tokens.dtype} of shape {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens: got {got}; expected int64 (or int32) ids of shape (B, T)")
    if not isinstance(labels, Tensor) or labels.shape != tokens.shape or labels.dtype not in (torch.int32, torch.int64):
        got = f"{labels.dtype} of shape {tuple(labels.shape)}" if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels: got {got}; expected int64 (or int32) labels of the tokens' shape "
                         f"{tuple(tokens.shape)} ({IGNORE} where unscored)")
    check_ids("tokens", tokens, vocab_size, "vocab_size", device)
    check_ids("labels", labels, None, "", device)  # the device only: labels are no lookups (IGNORE is < 0)


class MQARTask:
    """MQAR driven by ``fwbench.run.training.fit``: cross-entropy and accuracy at query positions."""

    name: ClassVar[str] = "mqar"
    config_class: ClassVar[type] = MQARConfig
    #: the power law of the query gaps is computed in float64 (a power_a of 1e-39 draws as 1e-30 does)
    float64_keys: ClassVar[frozenset[str]] = frozenset({"power_a"})

    def validate(self, config: MQARConfig) -> None:
        """Raise ``ValueError`` naming the field when a hyper-parameter is out of range."""
        check_fields(config, positive=("vocab_size", "seq_len", "num_kv_pairs", "d_model", "n_heads", "n_layers",
                                       "batch_size", "eval_every", "eval_sequences", "patience", "max_steps", "chunk_size"))
        for name in ("lr", "power_a"):
            if getattr(config, name) <= 0:
                raise ValueError(f"{name}: got {getattr(config, name)}; expected > 0")
        if config.d_model % config.n_heads:
            raise ValueError(f"d_model: got {config.d_model}; expected a multiple of n_heads={config.n_heads}")
        check_mqar_storage(config.vocab_size, config.d_model)  # d_model = 2**63 - 1 passed and failed every run
        # named as the config names them: the trial draw below is of one sequence ("batch, seq_len: got 1, …")
        for name in ("batch_size", "eval_sequences"):  # eval_sequences = 2**62 trained, then failed naming 'batch'
            check_storage({name: getattr(config, name), "seq_len": config.seq_len},
                          (getattr(config, name), config.seq_len), f"({name}, seq_len) inputs", ValueError)
        try:  # one sequence drawn: the generator's own constraints between the sizes
            generate_mqar(1, config.vocab_size, config.seq_len, config.num_kv_pairs, config.power_a,
                          torch.Generator().manual_seed(0), config.random_non_queries)
        except (RuntimeError, OverflowError) as exc:  # sizes torch cannot index (vocab_size = 2**63 - 1): a traceback
            raise ValueError(f"vocab_size, seq_len: got {config.vocab_size}, {config.seq_len}; expected sizes one "
                             f"sequence can be drawn at (torch: {str(exc).splitlines()[0]})") from None

    def build_model(self, config: MQARConfig, variant: str) -> MQARModel:
        parse_spec(variant)
        return MQARModel(variant, config.vocab_size, config.d_model, config.n_heads, config.n_layers,
                         form=config.form, chunk_size=config.chunk_size)

    def acting_config(self, config: MQARConfig, variant: str) -> dict:
        """The config keys that act for ``variant`` (see :func:`fwbench.tasks.base.acting_config`)."""
        return forward_acting_config(config, variant)

    def values_as_they_act(self, config: MQARConfig) -> dict[str, tuple[list[float], str]]:
        """``power_a`` acts only through the fp32 query-gap distribution :func:`generate_mqar` draws from (see
        :func:`fwbench.run.grid._refuse_equal_computations`; the run id hashes the distribution): with one
        possible gap (seq_len = 4·num_kv_pairs + 2) every power_a draws alike, and 0.01 and 0.010000001 round
        to one distribution (break-it pass AH: each trained a run of its own, with identical curves)."""
        space = (config.seq_len - 2 * config.num_kv_pairs) // 2
        p = power_law_probabilities(space, config.power_a).float().tolist()
        return {"power_a": (p, f"the query gaps' fp32 distribution p(gap = i) ∝ i^(a−1) over {space} possible "
                                f"gap{'' if space == 1 else 's'}")}

    def acting_variant(self, config: MQARConfig, variant: str) -> str:
        """The variant as it computes here (the run id hashes it): the last scored position is a query
        at ``seq_len − 2`` (queries sit on even positions), which attends to ``seq_len − 1`` keys, and
        nothing scored reads a later output (causal), so softmax with a window of at least
        ``seq_len − 1`` keys is softmax (:func:`fwbench.tasks.base.variant_over`)."""
        return variant_over(variant, config.seq_len - 1)

    def chunked_tokens(self, config: MQARConfig) -> int:
        """Tokens T of every chunked attention call of a run, training and evaluation alike
        (``seq_len``), so chunk sizes with equal
        :func:`~fwbench.variants.kernels.chunking.chunk_length` at T act alike."""
        return config.seq_len

    def _batch(self, config: MQARConfig, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
        inputs, labels = generate_mqar(batch, config.vocab_size, config.seq_len, config.num_kv_pairs,
                                       config.power_a, generator, config.random_non_queries)
        return {"inputs": inputs, "labels": labels}

    def train_batch(self, config: MQARConfig, generator: torch.Generator) -> dict[str, Tensor]:
        return self._batch(config, config.batch_size, generator)

    def loss(self, model: MQARModel, batch: dict[str, Tensor], config: MQARConfig) -> Tensor:
        logits, labels = model(batch["inputs"], batch["labels"])
        return F.cross_entropy(logits.to(compute_dtype(logits)), labels)  # fp32, float64 for a float64 model

    @torch.no_grad()
    def evaluate(self, model: MQARModel, config: MQARConfig, generator: torch.Generator,
                 device: torch.device) -> dict[str, float]:
        """Cross-entropy (nats) and accuracy over the query positions of fresh sequences."""
        batch = self._batch(config, config.eval_sequences, generator)
        logits, labels = model(batch["inputs"].to(device), batch["labels"].to(device))
        loss = F.cross_entropy(logits.to(compute_dtype(logits)), labels)
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return {"loss": loss.item(), "accuracy": accuracy.item()}
