"""What an update rule of fast-weight attention is: its kernels per form, its state, whether it
uses β and whether it sum-normalises φ — everything :class:`~variants.attention.FastWeightAttention`
needs to know about a rule, in one object.

Every kernel of a rule is called with the same arguments, already through the feature map:

    y, W, z = rule.kernels[form](pq, pk, v, beta, W0, z0, chunk_size)

pq (B, H, T, d_dot) φ-mapped queries, pk (B, H, T, d_dot) φ-mapped keys, v (B, H, T, d_v),
beta (B, H, T) or ``None`` (rules without β), W0 (B, H, d_v, d_dot) and z0 (B, H, d_dot) the carried
state or ``None`` (zeros), chunk_size the longest chunk (chunk kernels; others ignore it). Returns y
(B, H, T, d_v) and the state after the last token: W fp32, z fp32 or ``None`` for rules without a
normaliser. ``write``, ``read`` and ``write_read`` are the task-facing helpers (Section 3's view of a
linear Transformer as a fast-weight programmer: store, then query).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from torch import Tensor

from ..errors import bad_value
from ..kernels.chunking import DEFAULT_CHUNK_SIZE

#: A kernel in the rule calling convention (module docstring).
Kernel = Callable[[Tensor, Tensor, Tensor, "Tensor | None", "Tensor | None", "Tensor | None", int],
                  "tuple[Tensor, Tensor, Tensor | None]"]
#: Paths of an attention module that may split the sequence into chunks.
CHUNK_PATHS = ("chunk", "write", "write_read")


@dataclass(frozen=True)
class UpdateRule:
    """An update rule: kernels per form plus the facts the attention module checks and reports.

    Attributes:
        name: the rule family written in records and reports (``sum``, ``delta``, ``fwm``).
        key: the name in the rules table and the spec-name suffix (``dpfp-<key>``; the table's ``sum``
            entry has none); differs from ``name`` for configurations such as ``delta-unnorm``.
        description, source: one line each, for ``fwbench variants`` and the registry.
        kernels: form (``parallel``, ``chunk``, ``recurrent``) → kernel; the forms the rule has.
        auto_form: the form ``form="auto"`` runs.
        uses_beta: whether writes need β (B, H, T).
        carries_normalizer: whether the state holds the attention normaliser z (the sum rule).
        sum_normalize: whether φ(k), φ(q) are divided by their sum before the kernels.
        needs_non_negative_features: whether φ must be ≥ 0 (a normaliser Σφ or zᵀφ(q) can be 0 otherwise).
        chunk_sizes: path (``chunk``, ``write``, ``write_read``) → chunk size used when the module was
            built without one, for paths whose measured best differs from :data:`DEFAULT_CHUNK_SIZE`.
        chunked_paths: the paths whose kernels split the sequence into chunks (where a chunk size acts).
        why_forms: why the missing forms are missing (said in the error for one of them).
    """

    name: str
    key: str
    description: str
    source: str
    kernels: Mapping[str, Kernel]
    auto_form: str
    uses_beta: bool
    carries_normalizer: bool
    sum_normalize: bool
    needs_non_negative_features: bool = True
    chunk_sizes: Mapping[str, int] = field(default_factory=dict)
    chunked_paths: tuple[str, ...] = ("chunk",)
    why_forms: str = ""

    @property
    def forms(self) -> tuple[str, ...]:
        """The forms this rule runs (``auto`` runs :attr:`auto_form`)."""
        return tuple(self.kernels)

    @property
    def suffix(self) -> str:
        """What the rule adds to a feature map's name in a spec: ``""`` for sum, ``-delta``, ..."""
        return "" if self.key == "sum" else f"-{self.key}"

    def resolve_form(self, form: str) -> str:
        """The kernel form a requested form runs: ``auto`` → :attr:`auto_form`."""
        return self.auto_form if form == "auto" else form

    def kernel_form(self, form: str) -> str:
        """The form of the kernel that ``form`` runs (``auto``: :attr:`auto_form`).

        Raises:
            VariantError: a form the rule has no kernel for, saying why where the rule says.
        """
        kernel_form = self.resolve_form(form)
        if kernel_form not in self.kernels:
            why = f": {self.why_forms}" if self.why_forms else ""
            choices = " or ".join(f"'{f}'" for f in (*self.forms, "auto"))
            raise bad_value("form", form, f"{choices} for the {self.name} rule{why}")
        return kernel_form

    def default_chunk_size(self, path: str) -> int:
        """Chunk size of ``path`` (``chunk``, ``write``, ``write_read``) when none is chosen."""
        return self.chunk_sizes.get(path, DEFAULT_CHUNK_SIZE)

    def chunk_size_acts(self, path: str) -> bool:
        """Whether the chunk size changes what ``path`` computes (rounding included).

        ``path``: a form (``parallel``, ``chunk``, ``recurrent``), ``write`` or ``write_read``.
        """
        return path in self.chunked_paths

    def with_sum_normalize(self, enabled: bool) -> UpdateRule:
        """The same rule with φ sum-normalised or not (the ablation of paper Section 4.2)."""
        return self if enabled == self.sum_normalize else replace(self, sum_normalize=enabled)

    def write(self, pk: Tensor, v: Tensor, beta: Tensor | None, W0: Tensor | None, z0: Tensor | None,
              chunk_size: int) -> tuple[Tensor, Tensor | None]:
        """Store every (φ(k_t), v_t) without computing outputs; returns the state (W, z)."""
        raise NotImplementedError

    def read(self, pq: Tensor, W: Tensor, z: Tensor | None) -> Tensor:
        """The memory's answer (B, H, T_q, d_v) fp32 to φ-mapped queries, writing nothing."""
        raise NotImplementedError

    def write_read(self, pq: Tensor, pk: Tensor, v: Tensor, beta: Tensor | None, W0: Tensor | None,
                   z0: Tensor | None, chunk_size: int) -> Tensor:
        """``read(pq, *write(pk, v, beta, W0, z0))``; rules override it with a fused kernel."""
        return self.read(pq, *self.write(pk, v, beta, W0, z0, chunk_size))
