"""Seeded, pure generators of episodes, and their Avalanche benchmarks. Nothing here knows of models."""
from streams.common import IGNORE, EpisodeDataset, StreamData, StreamInfo, scored_mask, stack_items, to_benchmark
from streams.icl import ICLConfig, ICLInfo, icl_benchmark, icl_config, icl_data
from streams.icr import ICRConfig, ICRInfo, icr_benchmark, icr_config, icr_data
from streams.text import TextConfig, TextDomain, TextInfo, text_benchmark, text_config, text_data

BENCHMARKS = {"icr": icr_benchmark, "icl": icl_benchmark, "text": text_benchmark}

__all__ = [
    "BENCHMARKS", "EpisodeDataset", "ICLConfig", "ICLInfo", "ICRConfig", "ICRInfo", "IGNORE", "StreamData",
    "StreamInfo", "TextConfig", "TextDomain", "TextInfo", "icl_benchmark", "icl_config", "icl_data",
    "icr_benchmark", "icr_config", "icr_data", "scored_mask", "stack_items", "text_benchmark", "text_config",
    "text_data", "to_benchmark",
]
