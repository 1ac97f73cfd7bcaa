"""Causal linear attention: ``chunk.py`` (the fast chunked form), ``naive.py`` (the token-by-token
oracle), ``common.py`` (feature maps, state)."""
from ovq_cl.ops.linear.chunk import linear_attention_chunked
from ovq_cl.ops.linear.common import FEATURE_MAPS, LinearAttentionState, feature_dim, feature_map, feature_map_names, taylor_feature_map
from ovq_cl.ops.linear.naive import linear_attention_recurrent

linear_attention = linear_attention_chunked

__all__ = ["FEATURE_MAPS", "LinearAttentionState", "feature_dim", "feature_map", "feature_map_names", "linear_attention", "linear_attention_chunked", "linear_attention_recurrent",
           "taylor_feature_map"]
