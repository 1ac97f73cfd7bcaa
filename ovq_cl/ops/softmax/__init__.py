from ovq_cl.ops.softmax.naive import KVCacheState, softmax_attention

__all__ = ["KVCacheState", "softmax_attention"]
