"""ovq_cl: Online Vector-Quantized attention and its baselines, as plain PyTorch modules.

No Avalanche or MLflow in here: ``OVQAttention`` drops into any PyTorch model. The names below load
lazily (PEP 562), so that ``import ovq_cl.base`` (what streams and strategies share) does not import
the model, the layers or the kernels.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelConfig": "ovq_cl.config", "model_config": "ovq_cl.config",
    "MIXERS": "ovq_cl.layers", "Mixer": "ovq_cl.layers", "build_mixer": "ovq_cl.layers",
    "register_mixer": "ovq_cl.layers", "LinearAttention": "ovq_cl.layers", "OVQAttention": "ovq_cl.layers",
    "SoftmaxAttention": "ovq_cl.layers",
    "DecoderLM": "ovq_cl.model", "RegressionLM": "ovq_cl.model",
    "OVQParams": "ovq_cl.ops.ovq", "OVQState": "ovq_cl.ops.ovq", "ovq_attention": "ovq_cl.ops.ovq",
    "MixerState": "ovq_cl.state",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ovq_cl' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
