"""Reference implementations timed beside ours in ``fwbench bench`` (all optional).

- torch ``scaled_dot_product_attention`` (causal) for softmax attention: always available.
- fla-core's pure-PyTorch ``delta_rule_chunkwise`` and ``delta_rule_recurrence``
  (``fla/ops/delta_rule/naive.py``), loaded from their file: importing the ``fla`` package
  itself needs triton, which a CPU machine does not have (``pip install fla-core einops``).
- On CUDA, fla's Triton kernel ``chunk_delta_rule`` (needs triton and a GPU).

fla's conventions differ from ours: it scales queries by d_k^−½ inside and keeps the state as
S = Wᵀ (d_k × d_v); its tensors are (B, H, T, D) for the naive kernels and (B, T, H, D) for the
Triton one. The wrappers here take our (B, H, T, D) tensors and return our outputs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor


def sdpa_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax attention (B, H, T, D) → (B, H, T, d_v) by torch's fused kernel."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def load_fla_naive() -> tuple[ModuleType | None, str]:
    """fla-core's ``ops/delta_rule/naive.py`` as a module, or ``None`` and why it is unavailable."""
    if importlib.util.find_spec("einops") is None:
        return None, "einops is not installed (pip install einops), which fla-core's reference needs"
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        return None, "fla-core is not installed (pip install fla-core==0.6.0; triton is not needed)"
    path = Path(list(spec.submodule_search_locations)[0]) / "ops" / "delta_rule" / "naive.py"
    if not path.is_file():
        return None, f"fla-core has no {path.name} at {path.parent} (tested with fla-core 0.6.0)"
    module_spec = importlib.util.spec_from_file_location("fwbench_fla_delta_rule_naive", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module, ""


def fla_chunkwise(fla: ModuleType, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, chunk_size: int = 32) -> Tensor:
    """fla's ``delta_rule_chunkwise`` on our inputs: y_t = W_t q_t (q pre-scaled to undo d_k^−½).

    T must be a multiple of ``chunk_size`` (fla asserts it).
    """
    y, _ = fla.delta_rule_chunkwise(q * q.shape[-1] ** 0.5, k, v, beta, chunk_size=chunk_size)
    return y


def fla_recurrence(fla: ModuleType, q: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """fla's token-by-token ``delta_rule_recurrence`` on our inputs."""
    y, _ = fla.delta_rule_recurrence(q * q.shape[-1] ** 0.5, k, v, beta, output_final_state=False)
    return y


def load_fla_triton_chunk() -> tuple[object | None, str]:
    """fla's Triton ``chunk_delta_rule`` (CUDA), or ``None`` and why it is unavailable."""
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    try:
        from fla.ops.delta_rule import chunk_delta_rule
    except Exception as exc:  # ImportError without triton; anything fla raises on import
        reason = f"fla's Triton kernels cannot be imported ({type(exc).__name__}: {exc})"
        return None, reason + "; pip install triton fla-core"
    return chunk_delta_rule, ""


def fla_triton_chunk(kernel, q: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> Tensor:
    """fla's Triton ``chunk_delta_rule`` on our (B, H, T, D) inputs, in their dtype (bf16 here)."""
    y, _ = kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2), scale=1.0)
    return y.transpose(1, 2)
