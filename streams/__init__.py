"""Seeded, pure generators of episodes, and their Avalanche benchmarks. Nothing here knows of models."""
from streams.common import IGNORE, EpisodeDataset, StreamData, StreamInfo, scored_mask, stack_items, to_benchmark
from streams.cicr import CICRConfig, CICRInfo, cicr_benchmark, cicr_config, cicr_data
from streams.icl import ICLConfig, ICLInfo, icl_benchmark, icl_config, icl_data
from streams.icr import ICRConfig, ICRInfo, icr_benchmark, icr_config, icr_data
from streams.registry import STREAMS, check_stream_options, register_stream, stream_benchmark, stream_data
from streams.text import TextConfig, TextDomain, TextInfo, text_benchmark, text_config, text_data

register_stream("icr", icr_data, ICRConfig)
register_stream("icl", icl_data, ICLConfig)
register_stream("text", text_data, TextConfig)
register_stream("cicr", cicr_data, CICRConfig)

__all__ = [
    "CICRConfig", "CICRInfo", "cicr_benchmark", "cicr_config", "cicr_data", "EpisodeDataset", "ICLConfig", "ICLInfo", "ICRConfig", "ICRInfo", "IGNORE", "STREAMS", "StreamData",
    "StreamInfo", "TextConfig", "TextDomain", "TextInfo", "check_stream_options", "icl_benchmark", "icl_config",
    "icl_data", "icr_benchmark", "icr_config", "icr_data", "register_stream", "scored_mask", "stack_items",
    "stream_benchmark", "stream_data", "text_benchmark", "text_config", "text_data", "to_benchmark",
]
