"""Functional attention kernels on (B, H, T, D) tensors: each rule in parallel, chunk and
recurrent forms that agree (the FWM rule, whose rescaling is not associative, only recurrent), plus
a fused write-then-read. The modules in :mod:`variants.attention` choose between them."""

from .delta_rule import (
    delta_rule_chunk,
    delta_rule_parallel,
    delta_rule_read,
    delta_rule_recurrent,
    delta_rule_write_read,
)
from .fwm_rule import fwm_rule_read, fwm_rule_recurrent, fwm_rule_write
from .softmax import softmax_parallel, softmax_read, softmax_recurrent
from .sum_rule import (
    sum_rule_chunk,
    sum_rule_parallel,
    sum_rule_read,
    sum_rule_recurrent,
    sum_rule_write,
    sum_rule_write_read,
)

__all__ = [
    "delta_rule_chunk", "delta_rule_parallel", "delta_rule_read", "delta_rule_recurrent", "delta_rule_write_read",
    "fwm_rule_read", "fwm_rule_recurrent", "fwm_rule_write",
    "softmax_parallel", "softmax_read", "softmax_recurrent",
    "sum_rule_chunk", "sum_rule_parallel", "sum_rule_read", "sum_rule_recurrent", "sum_rule_write",
    "sum_rule_write_read",
]
