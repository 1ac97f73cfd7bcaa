"""ovq_cl: Online Vector-Quantized attention and its baselines, as plain PyTorch modules.

No Avalanche or MLflow in here: ``OVQAttention`` drops into any PyTorch model.
"""
from ovq_cl.config import FullAttentionConfig, LinearAttentionConfig, ModelConfig, OVQConfig, model_config
from ovq_cl.layers import MIXERS, LinearAttention, Mixer, OVQAttention, SoftmaxAttention, build_mixer, register_mixer
from ovq_cl.model import DecoderLM, RegressionLM
from ovq_cl.ops.ovq import OVQParams, OVQState, ovq_attention
from ovq_cl.state import MixerState

__all__ = [
    "DecoderLM", "RegressionLM", "FullAttentionConfig", "LinearAttention", "LinearAttentionConfig", "MIXERS", "Mixer",
    "MixerState", "ModelConfig", "OVQAttention", "OVQConfig", "OVQParams", "OVQState", "SoftmaxAttention",
    "build_mixer", "model_config", "ovq_attention", "register_mixer",
]
