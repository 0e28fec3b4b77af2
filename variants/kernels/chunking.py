"""Splitting (B, H, T, D) tensors into chunks for the chunkwise-parallel kernels."""

from __future__ import annotations

import torch
from torch import Tensor

from .precision import compute_dtype

#: The one default chunk size of the chunkwise kernels and of every attention module built without
#: one. Chosen by ``fwbench bench --profile full`` on CPU (B=2, H=8, d_head=64, T=4096): C=32 was
#: fastest forward+backward for DPFP with both rules and forward for the delta rule (16 and 128
#: slower); see the chunk-size sweep in the report. A rule may keep a measured default of its own for
#: one path (the delta rule's fused write-then-read, :data:`WRITE_READ_CHUNK_SIZE`), declared on the
#: rule object (:mod:`variants.rules`).
DEFAULT_CHUNK_SIZE = 32


def chunk_length(T: int, chunk_size: int) -> int:
    """Length C of the N = ⌈T / chunk_size⌉ chunks that cover T tokens as evenly as possible.

    ``chunk_size`` is the longest chunk allowed; balancing the chunks (C = ⌈T / N⌉) keeps their
    number and avoids padding where N divides T (T = 120 with chunk_size 32 gives 4 chunks of 30
    rather than 4 of 32 with 8 padded tokens).
    """
    n_chunks = -(-T // chunk_size)
    return -(-T // n_chunks)


def split_chunks(tensors: list[Tensor], chunk_size: int, dtype: torch.dtype | None = None) -> list[Tensor]:
    """Each (B, H, T, D) tensor as (B, H, N, C, D) in ``dtype``, with C = :func:`chunk_length` (T ≥ 1).

    ``dtype`` defaults to the compute dtype of the tensors (:func:`~.precision.compute_dtype`:
    float64 if any is float64, else fp32).

    The tail is zero-padded to a whole chunk; the kernels make zero keys write nothing, so the
    padding changes no output and no state (the padded outputs are sliced off by the caller).
    """
    B, H, T = tensors[0].shape[:3]
    C = chunk_length(T, chunk_size)
    n_chunks = -(-T // C)
    pad = n_chunks * C - T
    dtype = dtype or compute_dtype(*tensors)
    out = []
    for x in tensors:
        x = x.to(dtype)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        out.append(x.reshape(B, H, n_chunks, C, x.shape[-1]))
    return out
