"""The paper's synthetic associative-retrieval tasks (Section 6.1, Figure 2), as the official code
defines them.

Setting 1 (capacity): S unique keys and S values; a sequence writes every key exactly once
(sequence length S), each with a distinct value; one query asks for one key's value.
Setting 2 (overwriting): keys and values drawn with replacement, sequence length 2S; the target is
the value at the queried key's *last* occurrence, so a memory must overwrite old associations.

Model (one layer, one head, no FFN): token x_t = [onehot(v_t); e(k_t)] with a learned key embedding e
of size int(2.2·S); key k_t = W_k x_t ∈ R^{d_key}, write strength β_t = σ(W_β x_t), value = the fixed
one-hot onehot(v_t) ∈ R^S; query q = W_q e(k_query). The attention variant writes the whole
sequence into its memory and answers the query with one read. Loss ½‖v − v̂‖² (0.5 = "outputs
nothing"). Evaluation: fresh sequences with every key present queried (the official code capped
this at 200 keys; we do not).

Initialisation: the official code has two models, and each variant starts as the official model
of its family does (:func:`official_initial_weights`): softmax draws W_k and W_q Xavier-uniform over
whole tokens (initial score std ≈ 1.6 at S=600), the linear family from U(±1/√d_key) (≈ 7 at
S=600, which would saturate a softmax: it then stayed at loss 0.83 at S=500).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.nn.utils import skip_init

from fwbench.tasks.base import acting_config, check_fields, check_ids, check_int, variant_over
from fwbench.variants import build_attention, parse_spec, write_read_path
from fwbench.variants.errors import check_storage, shown
from fwbench.variants.kernels.precision import compute_dtype
from fwbench.variants.rules.fwm import FWM
from fwbench.variants.rules.sum import SUM

from .key_rows import KeyRows, row_sums, rows
from .one_hot_read import coded_write_read, one_hot_codes, one_hot_write_read, reads_one_hot


@dataclass(frozen=True)
class RetrievalConfig:
    """Hyper-parameters of one retrieval run; defaults are the official setup.

    Attributes:
        setting: 1 (capacity, unique keys) or 2 (overwriting, keys with replacement).
        S: number of unique keys (and of values).
        d_key: key/query size before φ.
        embedding_factor: key embedding size is int(embedding_factor · S).
        batch_size, lr: Adam with this learning rate on batches of this many sequences.
        eval_every: steps between evaluations; eval_sequences: fresh sequences per evaluation.
        target_loss: stop once the evaluation loss is at most this.
        patience: stop after this many evaluations without a new best.
        max_steps: hard cap on training steps.
        form: attention form of the write (``auto``: the rule's fused write-then-read, the fastest;
            ``chunk``: the write without outputs; ``parallel``/``recurrent``: the full forward).
        chunk_size: longest chunk of the chunked kernels; unset (``None``), the rule's default for the
            path (the delta rule's fused write-then-read: 24). It acts only where the variant's
            kernels are chunked (:func:`variants.chunk_size_acts`), and only there enters the run id.
    """

    setting: int = 1
    S: int = 20
    d_key: int = 64
    embedding_factor: float = 2.2
    batch_size: int = 32
    lr: float = 1e-3
    eval_every: int = 100
    eval_sequences: int = 20
    target_loss: float = 0.001
    patience: int = 10
    max_steps: int = 100_000
    form: str = "auto"
    chunk_size: int | None = None

    @property
    def sequence_length(self) -> int:
        """S in Setting 1, 2S in Setting 2."""
        return self.S if self.setting == 1 else 2 * self.S


def generate_sequences(setting: int, S: int, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Key and value ids, each (batch, L) int64 in [0, S), L = S (Setting 1) or 2S (Setting 2).

    Setting 1 uses a random permutation of the keys and of the values, so every key appears once
    with a distinct value; Setting 2 draws both with replacement.

    Raises:
        ValueError: ``setting`` not 1 or 2 (an int), ``S`` not a positive integer, ``batch`` not an
            integer >= 0 (0: an empty batch); checked before anything is drawn.
    """
    setting, S, batch = check_sizes(setting, S, batch)
    if setting == 1:
        keys = torch.argsort(torch.rand(batch, S, generator=generator), dim=-1)
        values = torch.argsort(torch.rand(batch, S, generator=generator), dim=-1)
    else:
        keys = torch.randint(0, S, (batch, 2 * S), generator=generator)
        values = torch.randint(0, S, (batch, 2 * S), generator=generator)
    return keys, values


def check_sizes(setting: int, S: int, batch: int) -> tuple[int, int, int]:
    """(setting, S, batch) as Python ints, or refuse a retrieval setting other than the int 1 or 2 (``3`` or
    ``"1"`` drew Setting 2 silently) and sizes that are not integers (``S`` >= 1, ``batch`` >= 0), before torch
    raises its own error on them.

    Raises:
        ValueError: naming ``setting``, ``S`` or ``batch``.
    """
    try:
        number = check_int("setting", setting)
    except ValueError:
        number = None
    if number not in (1, 2):
        raise ValueError(f"setting: got {shown(setting)}; expected 1 (capacity) or 2 (overwriting)")
    S, batch = check_int("S", S), check_int("batch", batch, 0, " (sequences; 0 draws an empty batch)")
    check_storage({"batch": batch, "S": S}, (batch, 2 * S), "drawn (batch, 2·S) keys", ValueError)
    return number, S, batch


def last_occurrence_values(keys: Tensor, values: Tensor, queries: Tensor) -> tuple[Tensor, Tensor]:
    """For each query key, the value at its last occurrence in the sequence.

    keys, values: (B, L); queries: (B, Q). Returns (targets (B, Q), present (B, Q) bool); a query
    whose key does not occur has ``present`` False and target 0.
    """
    positions = torch.arange(keys.shape[1], device=keys.device)
    matches = keys[:, None, :] == queries[:, :, None]  # (B, Q, L)
    last = torch.where(matches, positions, -1).max(dim=-1).values
    present = last >= 0
    targets = torch.gather(values, 1, last.clamp(min=0))
    return torch.where(present, targets, 0), present


def sample_batch(setting: int, S: int, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
    """A training batch: sequences plus one query per sequence, drawn among its keys.

    Raises:
        ValueError: as :func:`generate_sequences` (a bad ``setting``, ``S`` or ``batch``).
    """
    setting, S, batch = check_sizes(setting, S, batch)
    keys, values = generate_sequences(setting, S, batch, generator)
    position = torch.randint(0, keys.shape[1], (batch, 1), generator=generator)
    queries = torch.gather(keys, 1, position)
    targets, _ = last_occurrence_values(keys, values, queries)
    return {"keys": keys, "values": values, "queries": queries, "targets": targets}


def model_family(variant: str) -> str:
    """Which official model a variant's initialisation follows: ``"softmax"`` for softmax
    attention, ``"linear"`` for every fast-weight variant (any φ, any update rule)."""
    return "softmax" if parse_spec(variant).info.rule == "softmax" else "linear"


def official_initial_weights(family: str, S: int, embedding_size: int, d_key: int) -> dict[str, Tensor | None]:
    """The official retrieval model's initial weights, drawn from the global RNG in its order.

    The official code (``synthetic/softmaxAttention.py`` and ``synthetic/linearAttention.py`` of
    the paper's repository) builds its modules, then re-initialises some of them:

    - both models: an (S × S) value embedding (drawn, then replaced by the identity), a key
      embedding over the whole vocabulary (2S rows: keys, then values; only the key rows are ever
      read) re-drawn from N(0, 1), W_k and W_v over whole tokens (S + e → d_key), W_q (e → d_key);
      W_v is never used (values are the one-hot codes) but its draws move the RNG;
    - softmax model: W_v, W_k, W_q re-drawn Xavier-uniform, bound √(6 / (fan_in + fan_out)),
      which shrinks as S grows;
    - linear-attention model: also W_f (unused) and W_β (S + e → 1) at PyTorch's default
      initialisation; W_v Xavier-uniform, W_k and W_q re-drawn from U(±1/√d_key).

    Biases keep PyTorch's default U(±1/√fan_in). Returns tensors key_embedding (S, e), W_k
    (d_key, S + e), b_k (d_key,), W_q (d_key, e), b_q (d_key,), W_beta (1, S + e) and b_beta (1,),
    the last two ``None`` for the softmax model, which has no W_β.

    Raises:
        ValueError: ``family`` is not ``"softmax"`` or ``"linear"``; ``S``, ``embedding_size`` or ``d_key``
            not a positive integer (d_key = 0 raised ``ZeroDivisionError`` from the bound).
    """
    if family not in ("softmax", "linear"):
        raise ValueError(f"family: got {family!r}; expected 'softmax' or 'linear'")
    # the checked ints from here on: a narrow NumPy int (np.uint8(200)) overflowed in 2.2·S and S + embedding_size
    S, embedding_size, d_key = (check_int(name, size) for name, size in (
        ("S", S), ("embedding_size", embedding_size), ("d_key", d_key)))
    token_size = S + embedding_size
    check_storage({"S": S}, (S, S), "(S, S) value codes", ValueError)
    check_storage({"S": S, "embedding_size": embedding_size}, (2 * S, embedding_size),
                  "(2·S, embedding_size) key embedding", ValueError)
    check_storage({"S": S, "embedding_size": embedding_size, "d_key": d_key}, (d_key, token_size),
                  "(d_key, S + embedding_size) key projection", ValueError)
    with torch.no_grad():
        nn.Embedding(S, S)  # the value codes: their draw moves the RNG, the identity replaces them
        key_embedding = nn.Embedding(2 * S, embedding_size)
        W_k = nn.Linear(token_size, d_key)
        W_v = nn.Linear(token_size, d_key)
        W_q = nn.Linear(embedding_size, d_key)
        W_beta = None
        if family == "linear":
            nn.Linear(token_size, d_key)  # W_f, the unused "forget key" map
            W_beta = nn.Linear(token_size, 1)
        nn.init.normal_(key_embedding.weight, mean=0.0, std=1.0)
        nn.init.xavier_uniform_(W_v.weight)
        if family == "softmax":
            nn.init.xavier_uniform_(W_k.weight)
            nn.init.xavier_uniform_(W_q.weight)
        else:
            bound = d_key**-0.5
            nn.init.uniform_(W_k.weight, -bound, bound)
            nn.init.uniform_(W_q.weight, -bound, bound)
    return {
        "key_embedding": key_embedding.weight[:S].detach(), "W_k": W_k.weight.detach(), "b_k": W_k.bias.detach(),
        "W_q": W_q.weight.detach(), "b_q": W_q.bias.detach(),
        "W_beta": None if W_beta is None else W_beta.weight.detach(),
        "b_beta": None if W_beta is None else W_beta.bias.detach(),
    }


class RetrievalModel(nn.Module):
    """One-layer, one-head associative memory around any attention variant (official setup).

    The initial weights are the official model's for the variant's family, drawn in the official
    order (:func:`official_initial_weights`), so ``torch.manual_seed(s)`` followed by this
    constructor gives the weights the official code gives with seed s.

    Raises:
        ValueError: ``S``, ``d_key`` or ``embedding_size`` (where given) not a positive integer, before
            anything is drawn (``d_key=0`` raised ``ZeroDivisionError``, ``S="4"`` a TypeError).
        VariantError: a bad variant spec, form or chunk size (:func:`variants.build_attention`).
    """

    def __init__(self, variant: str, S: int, d_key: int = 64, embedding_size: int | None = None,
                 form: str = "auto", chunk_size: int | None = None):
        super().__init__()
        S, d_key = check_int("S", S), check_int("d_key", d_key)
        if embedding_size is not None:
            embedding_size = check_int("embedding_size", embedding_size)
        if embedding_size is None:  # derived from S: its tensors' sizes are S's (an error named embedding_size)
            embedding_size = int(2.2 * S)
            check_storage({"S": S}, (S, S), "(S, S) value codes", ValueError)
            check_storage({"S": S}, (2 * S, embedding_size), "(2·S, 2.2·S) key embedding", ValueError)
            check_storage({"S": S, "d_key": d_key}, (d_key, S + embedding_size), "(d_key, 3.2·S) key projection",
                          ValueError)
        self.S = S
        self.embedding_size = embedding_size
        family = model_family(variant)
        official = official_initial_weights(family, S, self.embedding_size, d_key)
        if official["W_beta"] is None:  # the softmax model has no W_β; drawn after the official weights
            W_beta = nn.Linear(S + self.embedding_size, 1)
            official["W_beta"], official["b_beta"] = W_beta.weight.detach(), W_beta.bias.detach()
        # The official W_k and W_β act on whole tokens [onehot(v); e(k)]; they are stored as their
        # two column blocks: the one-hot block as a (S, ·) table read by row lookups, the embedding
        # block as a Linear. Slicing one (·, S + e) weight at every step instead costs a
        # zero-filled copy of the whole weight per slice in the backward.
        # skip_init: every weight is copied in, and drawing it would move the global RNG.
        with torch.no_grad():
            self.key_embedding = skip_init(nn.Embedding, S, self.embedding_size)
            self.key_embedding.weight.copy_(official["key_embedding"])
            self.W_q = skip_init(nn.Linear, self.embedding_size, d_key)
            self.W_q.weight.copy_(official["W_q"])
            self.W_q.bias.copy_(official["b_q"])
            self.key_by_value = nn.Parameter(official["W_k"][:, :S].T.contiguous())        # (S, d_key)
            self.key_projection = skip_init(nn.Linear, self.embedding_size, d_key)
            self.key_projection.weight.copy_(official["W_k"][:, S:])
            self.key_projection.bias.copy_(official["b_k"])
            self.beta_by_value = nn.Parameter(official["W_beta"][:, :S].T.contiguous())     # (S, 1)
            self.beta_projection = skip_init(nn.Linear, self.embedding_size, 1)
            self.beta_projection.weight.copy_(official["W_beta"][:, S:])
            self.beta_projection.bias.copy_(official["b_beta"])
        # after the official draws (FAVOR+ draws Ω)
        self.attention = build_attention(variant, d_key, form=form, chunk_size=chunk_size)

    def token_projections(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """W_k x, W_β x and W_q e(k) as lookup tables over key and value ids.

        A token is [onehot(v); e(k)], so W x = W[:, :S] onehot(v) + (W[:, S:] E)[k]: two row
        lookups replace a (B·L × (S + e)) matmul. The function and its gradients are the same as
        the official model's; only the cost changes, from O(B·L·S) to O(S²) per step.
        Returns key_by_value (S, d_key), key_by_key (S, d_key), beta_by_value (S, 1),
        beta_by_key (S, 1).
        """
        embedding = self.key_embedding.weight
        return self.key_by_value, self.key_projection(embedding), self.beta_by_value, self.beta_projection(embedding)

    def query_projections(self, queries: Tensor) -> Tensor:
        """W_q e(k) + b_q for query ids (B, Q) → (B, Q, d_key).

        Fewer queries than keys (training: one per sequence) project only their own embeddings;
        more (evaluation: every key of every sequence) project each key once and look the rows up.
        """
        embedding = self.key_embedding.weight
        if queries.numel() < self.S:
            return self.W_q(rows(embedding, queries))
        return rows(self.W_q(embedding), queries)

    def dense_token_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The official model's (W_k, b_k, W_β, b_β) over whole tokens: (d_key, S + e), (d_key,),
        (1, S + e), (1,). For checks against the dense formulation; training never forms them."""
        W_k = torch.cat([self.key_by_value.T, self.key_projection.weight], dim=1)
        W_beta = torch.cat([self.beta_by_value.T, self.beta_projection.weight], dim=1)
        return W_k, self.key_projection.bias, W_beta, self.beta_projection.bias

    def forward(self, keys: Tensor, values: Tensor, queries: Tensor) -> Tensor:
        """Write (keys, values) (B, L), then read every query (B, Q); returns v̂ (B, Q, S) in fp32
        (float64 for a float64 model). The attention's form and chunk size (chosen when built) pick
        the path; see :meth:`variants.Attention.write_read`.

        Raises:
            ValueError: ids that are not integer (B, L), (B, L), (B, Q) tensors or lie outside [0, S),
                naming the argument (:func:`check_token_ids`).
        """
        check_token_ids(self.S, keys, values, queries, self.key_embedding.weight.device)
        embedding = self.key_embedding.weight
        key_rows = KeyRows(self.key_by_value, values, self.key_projection(embedding), keys)
        q = self.query_projections(queries)[:, None]
        if self.attention.form == "auto" and reads_one_hot(self.attention):  # the fastest: no codes, no β
            return one_hot_write_read(self.attention, key_rows, values, q, self.S)[:, 0]
        k = key_rows.materialise()  # (B, 1, L, d_key)
        beta_by_key = self.beta_projection(embedding)
        beta = torch.sigmoid(row_sums(self.beta_by_value, values, beta_by_key, keys)).view(keys.shape[0], 1, keys.shape[1])
        value_codes = one_hot_codes(values, self.S, dtype=k.dtype)[:, None]
        output = coded_write_read(self.attention, k, value_codes, q, beta)[:, 0]
        return output if output.dtype == torch.float64 else output.float()


def check_token_ids(S: int, keys: Tensor, values: Tensor, queries: Tensor, device: torch.device | None = None) -> None:
    """Refuse retrieval inputs that are not key and value ids: keys and values (B, L), queries (B, Q),
    integer tensors with every id in [0, S), on ``device`` (the model's) where given.

    The embedding lookups and the compiled table loops would otherwise fail deep in torch
    ("IndexError: index out of range in self") or name their internal tables; the device and range
    checks are :func:`~fwbench.tasks.base.check_ids` (a host read per tensor, as :func:`retrieval_loss`'s).

    Raises:
        ValueError: naming ``keys``, ``values`` or ``queries``, with the shape, dtype, device or range expected.
    """
    named = (("keys", keys), ("values", values), ("queries", queries))
    for name, ids in named:
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
            got = f"{ids.dtype} of shape {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"{name}: got {got}; expected int64 (or int32) ids of shape (B, L) for keys and "
                             f"values, (B, Q) for queries")
    if values.shape != keys.shape or queries.shape[0] != keys.shape[0]:
        raise ValueError(f"keys, values, queries: got shapes {tuple(keys.shape)}, {tuple(values.shape)}, "
                         f"{tuple(queries.shape)}; expected (B, L), (B, L), (B, Q)")
    for name, ids in named:
        check_ids(name, ids, S, "S", device)


def retrieval_loss(predicted: Tensor, targets: Tensor, S: int, mask: Tensor | None = None) -> Tensor:
    """½‖v − v̂‖² per query, averaged over queries (over ``mask``-ed ones if given), in fp32 (float64
    for float64 predictions, as the kernels compute): 0.5 is the loss of a memory that outputs
    nothing; NaN for zero queries (the mean of nothing).

    predicted: (B, Q, S) scores; targets: (B, Q) integer value ids in [0, S); mask: (B, Q) or ``None``.

    Raises:
        ValueError: a shape, dtype or id out of range, naming the argument.
    """
    if predicted.shape[-1:] != (S,) or targets.shape != predicted.shape[:-1]:
        raise ValueError(f"predicted, targets: got shapes {tuple(predicted.shape)}, {tuple(targets.shape)}; "
                         f"expected (…, S={S}) and the same shape without the last axis")
    if targets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"targets: got dtype {targets.dtype}; expected integer value ids (int64)")
    if targets.device.type != "cpu" and targets.numel():  # on CPU scatter_ reports a bad id itself (below)
        low, high = torch.aminmax(targets)
        if low < 0 or high >= S:
            raise ValueError(f"targets: got ids in [{int(low)}, {int(high)}]; expected ids in [0, {S})")
    # a sum over many queries in fp16 overflows; a float64 model's loss (and gradient) stays float64
    predicted = predicted.to(compute_dtype(predicted))
    # scatter_ rather than one_hot: one_hot checks the ids' range with two host syncs per call
    try:
        codes = predicted.new_zeros(*targets.shape, S).scatter_(-1, targets[..., None].long(), 1.0)
    except RuntimeError as exc:
        raise ValueError(f"targets: {exc}; expected ids in [0, {S})") from None
    if mask is None:  # one fused op; the division gives NaN for zero queries, as a mean would
        return torch.nn.functional.mse_loss(predicted, codes, reduction="sum").mul(0.5).div(targets.numel())
    per_query = 0.5 * (predicted - codes).pow(2).sum(-1)
    return (per_query * mask).sum() / mask.sum().clamp(min=1)


class RetrievalTask:
    """Setting 1 / Setting 2 associative retrieval, driven by ``fwbench.run.training.fit``."""

    name: ClassVar[str] = "retrieval"
    config_class: ClassVar[type] = RetrievalConfig
    #: 2: ``chunk_size`` reaches the delta rule's write-then-read kernel (schema 1 ran it at 24 whatever
    #: the config said, so a schema-1 record with another chunk size names a run that never happened)
    record_schema: ClassVar[int] = 2
    #: the key embedding's int(embedding_factor · S) features are computed in float64
    float64_keys: ClassVar[frozenset[str]] = frozenset({"embedding_factor"})

    def validate(self, config: RetrievalConfig) -> None:
        """Raise ``ValueError`` naming the field when a hyper-parameter is out of range."""
        if config.setting not in (1, 2):
            raise ValueError(f"setting: got {shown(config.setting)}; expected 1 (capacity) or 2 (overwriting)")
        check_fields(config, positive=("S", "d_key", "batch_size", "eval_every", "eval_sequences", "patience",
                                       "max_steps", "chunk_size"))
        if config.S < 2:
            raise ValueError(f"S: got {config.S}; expected at least 2 keys")
        for name in ("lr", "embedding_factor"):
            if getattr(config, name) <= 0:
                raise ValueError(f"{name}: got {getattr(config, name)}; expected > 0")
        try:  # an int factor (a spec built in Python) times S: float() of it overflows past 1.8e308
            size = float(config.embedding_factor) * config.S
        except OverflowError:
            size = math.inf
        if not math.isfinite(size):  # int() of it raised OverflowError / ValueError
            raise ValueError(f"embedding_factor: got {shown(config.embedding_factor)} with S={config.S}; expected a "
                             "finite key embedding size embedding_factor × S")
        # build_model passes int(embedding_factor · S) on: its errors named an embedding_size no grid sets
        embedding_size = int(config.embedding_factor * config.S)
        sizes = {"S": config.S, "embedding_factor": config.embedding_factor}
        check_storage({"S": config.S}, (config.S, config.S), "(S, S) value codes", ValueError)
        check_storage(sizes, (2 * config.S, embedding_size), "(2·S, embedding_factor·S) key embedding", ValueError)
        check_storage({**sizes, "d_key": config.d_key}, (config.d_key, config.S + embedding_size),
                      "(d_key, S + embedding_factor·S) key projection", ValueError)
        for name in ("batch_size", "eval_sequences"):  # eval_sequences = 2**62 trained, then failed naming 'batch'
            check_storage({name: getattr(config, name), "S": config.S}, (getattr(config, name), 2 * config.S),
                          f"({name}, 2·S) key sequences", ValueError)
        if int(config.embedding_factor * config.S) < 1:
            raise ValueError(f"embedding_factor: got {config.embedding_factor} with S={config.S}, a key embedding of "
                             f"int({config.embedding_factor} × {config.S}) = 0 features; expected embedding_factor × S >= 1")

    def build_model(self, config: RetrievalConfig, variant: str) -> RetrievalModel:
        parse_spec(variant)
        return RetrievalModel(variant, config.S, config.d_key, int(config.embedding_factor * config.S),
                              form=config.form, chunk_size=config.chunk_size)

    def acting_config(self, config: RetrievalConfig, variant: str) -> dict:
        """The config keys that change what ``variant`` computes (the run id hashes these): the
        chunk size only where the write-then-read path of ``config.form`` is chunked (the delta
        rule's fused kernel and write), as the chunk size it runs with (see
        :func:`fwbench.tasks.base.acting_config`). Softmax's memory is its keys and values, which every
        form writes alike: its forms are hashed as ``chunk`` (one run), but for ``auto`` without a
        window, which reads through the code-free one-hot path. The FWM rule's ``recurrent`` form is
        hashed as ``auto``: both write with its one scan (``recurrent`` also computes the outputs
        ``forward`` returns, which the write-then-read discards), then read alike, so they train the
        same weights (``form = ["auto", "recurrent"]`` was one computation under two run ids). The one
        difference: a chunk whose reads overflow fp32 while its write does not (keys of norm near 1e19,
        a diverging run) is rescanned token by token only under ``recurrent``. Likewise the sum rule's
        ``parallel`` form is hashed as ``chunk``: its parallel kernel ends with the very sum
        W = Vᵀφ(K), z = Σφ(k) that the write computes, beside outputs the write-then-read discards."""
        acting = acting_config(config, variant, write_read_path(config.form))
        spec = parse_spec(variant)
        if spec.info.update_rule is None and not (config.form == "auto" and spec.params.get("window") is None):
            acting["form"] = "chunk"
        if spec.info.update_rule is FWM and config.form == "recurrent":  # the built-in rule (a plugin's may differ)
            acting["form"] = "auto"
        if spec.info.update_rule is SUM and config.form == "parallel":
            acting["form"] = "chunk"
        return acting

    def acting_variant(self, config: RetrievalConfig, variant: str) -> str:
        """The variant as it computes here (the run id hashes it): every query reads a memory of the
        sequence's ``sequence_length`` keys (S in Setting 1, 2S in Setting 2), so softmax with a window
        of at least that many keys is softmax (:func:`fwbench.tasks.base.variant_over`); its form is
        still hashed from the spec as given (:meth:`acting_config`: ``auto`` under a window is not the
        one-hot path), so such a window beside softmax's ``chunk`` form names one run."""
        return variant_over(variant, config.sequence_length)

    def values_as_they_act(self, config: RetrievalConfig) -> dict[str, tuple[int, str]]:
        """``embedding_factor`` acts as the key embedding's int(embedding_factor · S) features: two factors
        that round to one size build the same model (see :func:`fwbench.run.grid._refuse_equal_computations`)."""
        size = int(config.embedding_factor * config.S)
        return {"embedding_factor": (size, f"a key embedding of int(embedding_factor × S={config.S}) = {size} features")}

    def chunked_tokens(self, config: RetrievalConfig) -> int:
        """Tokens T of every chunked write of a run, training and evaluation alike: the sequence
        (S in Setting 1, 2S in Setting 2), so chunk sizes with equal
        :func:`~fwbench.variants.kernels.chunking.chunk_length` at T act alike."""
        return config.sequence_length

    def train_batch(self, config: RetrievalConfig, generator: torch.Generator) -> dict[str, Tensor]:
        return sample_batch(config.setting, config.S, config.batch_size, generator)

    def loss(self, model: RetrievalModel, batch: dict[str, Tensor], config: RetrievalConfig) -> Tensor:
        predicted = model(batch["keys"], batch["values"], batch["queries"])
        return retrieval_loss(predicted, batch["targets"], config.S)

    @torch.no_grad()
    def evaluate(self, model: RetrievalModel, config: RetrievalConfig, generator: torch.Generator,
                 device: torch.device) -> dict[str, float]:
        """Loss and accuracy over fresh sequences, every key that occurs queried (no 200-key cap)."""
        keys, values = generate_sequences(config.setting, config.S, config.eval_sequences, generator)
        keys, values = keys.to(device), values.to(device)
        queries = torch.arange(config.S, device=device).expand(config.eval_sequences, -1)
        targets, present = last_occurrence_values(keys, values, queries)
        predicted = model(keys, values, queries)
        mask = present.float()
        loss = retrieval_loss(predicted, targets, config.S, mask)
        correct = (predicted.argmax(-1) == targets).float()
        accuracy = (correct * mask).sum() / mask.sum()
        return {"loss": loss.item(), "accuracy": accuracy.item()}
