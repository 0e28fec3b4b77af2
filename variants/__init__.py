"""The attention zoo: softmax, linear (elu+1), FAVOR+ and DPFP attention, each with the sum or the
delta update rule, behind one interface (:class:`Attention`, :class:`AttentionLayer`). Users add
their own feature maps and rules with :func:`register_feature_map` and :func:`register_rule`.

Schlag, Irie & Schmidhuber, "Linear Transformers Are Secretly Fast Weight Programmers", ICML 2021.
"""

from .attention import (
    DEFAULT_CHUNK_SIZE,
    FORMS,
    Attention,
    FastWeightAttention,
    SoftmaxAttention,
    set_check_finite,
    using_form,
    write_read_path,
)
from .errors import NonFiniteError, VariantError
from .feature_maps import DPFP, ElementwiseFeatureMap, EluPlusOne, Favor, FeatureMap, Tanh, sum_normalize
from .layer import AttentionLayer
from .plugins import import_variant_modules
from .registry import (
    FEATURE_MAPS,
    REGISTRY,
    VariantSpec,
    build_attention,
    chunk_size_in_use,
    d_dot_of,
    list_variants,
    parse_spec,
    register_feature_map,
    register_rule,
)
from .rules import RULES, UpdateRule
from .state import FastWeightState, KVCacheState

__all__ = [
    "DEFAULT_CHUNK_SIZE", "FEATURE_MAPS", "FORMS", "REGISTRY", "RULES", "DPFP", "UpdateRule", "chunk_size_in_use",
    "import_variant_modules", "register_feature_map", "register_rule", "using_form",
    "write_read_path", "Attention", "AttentionLayer", "ElementwiseFeatureMap", "EluPlusOne",
    "FastWeightAttention", "FastWeightState", "Favor", "FeatureMap", "KVCacheState", "NonFiniteError",
    "SoftmaxAttention",
    "Tanh", "VariantError", "VariantSpec", "build_attention", "d_dot_of", "list_variants", "parse_spec",
    "set_check_finite", "sum_normalize",
]
