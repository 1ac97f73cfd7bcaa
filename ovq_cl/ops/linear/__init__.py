from ovq_cl.ops.linear.naive import (
    FEATURE_MAPS,
    LinearAttentionState,
    feature_dim,
    feature_map_names,
    linear_attention_chunked,
    linear_attention_recurrent,
    taylor_feature_map,
)

linear_attention = linear_attention_chunked

__all__ = ["FEATURE_MAPS", "LinearAttentionState", "feature_dim", "feature_map_names", "linear_attention", "linear_attention_chunked", "linear_attention_recurrent",
           "taylor_feature_map"]
