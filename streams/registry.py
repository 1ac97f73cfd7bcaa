"""The stream registry: a stream is a name, a function that builds its data, and its options dataclass.

    register_stream("my_stream", my_stream_data, MyStreamConfig)
    bench = stream_benchmark("my_stream", {"n_experiences": 3})      # an Avalanche benchmark

``build(options) -> StreamData`` must be a pure function of its options (seeded generators, no global
state); it receives them validated, as an instance of the registered options dataclass, so a variant of a
built-in stream is a subclass that changes defaults, registered under a name of its own with the
built-in's builder (README, "Your own stream in ten minutes"); the options dataclass is validated before anything runs (``check_stream_options``), so a bad
key in ``stream.options`` fails in one line before meta-training. Runs get the run's seed as
``stream.options.seed`` unless set, so the dataclass should have a ``seed`` field (every built-in has).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ovq_cl.base import Registry, validate
from streams.common import StreamData, to_benchmark


@dataclass(frozen=True)
class StreamSpec:
    build: Callable[[Any], StreamData]
    options_type: type


STREAMS: Registry[StreamSpec] = Registry("stream", "ovq_cl.streams")


def register_stream(name: str, build: Callable[[Any], StreamData], options_type: type) -> StreamSpec:
    """Makes the stream available to runs as ``stream.name: <name>``."""
    return STREAMS.register(name, StreamSpec(build, options_type))


def check_stream_options(name: str, options: Any):
    """The stream's options validated against its dataclass (ValueError naming a bad key)."""
    return validate(STREAMS.get(name).options_type, dict(options or {}), f"stream {name!r} options")


def stream_data(name: str, options: Any = None) -> StreamData:
    """The stream's data, built from its options validated against its registered options type: a stream
    registered as a variant of another (``register_stream("icr8", icr_data, ICR8Config)``, a subclass that
    changes defaults) gets its own defaults, not the builder's."""
    return STREAMS.get(name).build(check_stream_options(name, options))


def stream_benchmark(name: str, options: Any = None):
    """The Avalanche benchmark of stream ``name`` (``.info``, ``.meta_train``, ``.meta_train_episodes``)."""
    return to_benchmark(stream_data(name, options))
