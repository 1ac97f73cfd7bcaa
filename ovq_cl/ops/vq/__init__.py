from ovq_cl.ops.vq.naive import VQState, empty_vq_state, quantize, vq_attention

__all__ = ["VQState", "empty_vq_state", "quantize", "vq_attention"]
