"""The attention zoo: softmax, linear (elu+1), FAVOR+ and DPFP attention, each with the sum or the
delta update rule, behind one interface (:class:`Attention`, :class:`AttentionLayer`).

Schlag, Irie & Schmidhuber, "Linear Transformers Are Secretly Fast Weight Programmers", ICML 2021.
"""

from .attention import DEFAULT_CHUNK_SIZE, FORMS, Attention, FastWeightAttention, SoftmaxAttention, set_check_finite
from .errors import NonFiniteError, VariantError
from .feature_maps import DPFP, EluPlusOne, Favor, FeatureMap, Tanh, sum_normalize
from .layer import AttentionLayer
from .registry import REGISTRY, VariantSpec, build_attention, d_dot_of, list_variants, parse_spec
from .state import FastWeightState, KVCacheState

__all__ = [
    "DEFAULT_CHUNK_SIZE", "FORMS", "REGISTRY", "DPFP", "Attention", "AttentionLayer", "EluPlusOne",
    "FastWeightAttention", "FastWeightState", "Favor", "FeatureMap", "KVCacheState", "NonFiniteError",
    "SoftmaxAttention",
    "Tanh", "VariantError", "VariantSpec", "build_attention", "d_dot_of", "list_variants", "parse_spec",
    "set_check_finite", "sum_normalize",
]
