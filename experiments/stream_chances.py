"""Per-experience chance for records made before runs stored it.

The stream gate and the per-experience learning gate score each R[j][j] against experience j's own chance
(the best context-free predictor on j's test labels: ``strategies.evaluation.gate.stream_gate``). Runs made
before that rule stored one chance for the whole stream (``stream_gate.chance``). Their per-experience
chances are recomputed here from the record's own stream parameters: the stream is rebuilt (its test sets
only are read; building is lazy and takes milliseconds) and each experience's test labels are scored.

The rebuild checks itself: the pooled chance over the rebuilt test labels must equal the one the run
stored, else the stream was not rebuilt as the run saw it and nothing is returned (the record is then
scored against its pooled chance, as before, and :func:`unrebuilt` counts it).
"""
from __future__ import annotations

import ast
import json
import math
from typing import Dict, List, Optional, Tuple

_CACHE: Dict[Tuple[str, str, str], Optional[Tuple[List[float], float]]] = {}
_UNREBUILT: set = set()


def _value(text: str):
    """A flattened param back to a value ('0.25' -> 0.25, 'None' -> None, 'prose' stays text)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _rebuild(name: str, options: Dict[str, object], metric: str) -> Optional[Tuple[List[float], float]]:
    """(per-experience chances, pooled chance) of the stream ``name`` with ``options``; None if it cannot
    be built (a stream this code does not have, a plugin's, options it refuses)."""
    import torch

    from streams import stream_benchmark
    from streams.common import stack_items
    from strategies.evaluation.gate import experience_chances as chances_of
    from strategies.evaluation.metrics import chance_score

    try:
        bench = stream_benchmark(name, options)
        labels = [stack_items(exp.dataset)[1] for exp in bench.test_stream]
        context = bench.info.metric_context
        return chances_of(labels, metric, context), chance_score(metric, torch.cat(labels), context)
    except Exception:                                 # noqa: BLE001 - any failure means "cannot rebuild"
        return None


def experience_chances(params: Dict[str, str], metric: str, stored_pooled: float) -> List[float]:
    """The per-experience chances of a record's stream (``params``: its flattened config), or [] when the
    stream cannot be rebuilt or its rebuilt chance differs from the stored one (relative 1e-6). The stored
    chance is the pooled one for a run made before 2026-12-04 and, since, the mean of the per-experience
    chances (the stream gate's ``chance``; a run read back from MLflow that did not log them one by one):
    either matches, as both are functions of the test labels the run saw."""
    name = params.get("stream.name")
    if not name or math.isnan(stored_pooled):
        return []
    options = {k[len("stream.options."):]: _value(v) for k, v in params.items() if k.startswith("stream.options.")}
    key = (str(name), json.dumps(options, sort_keys=True, default=str), metric)
    if key not in _CACHE:
        _CACHE[key] = _rebuild(str(name), options, metric)
    built = _CACHE[key]
    def same(x: float) -> bool:
        return math.isclose(x, stored_pooled, rel_tol=1e-6, abs_tol=1e-9)

    if built is None or not (same(built[1]) or (built[0] and same(sum(built[0]) / len(built[0])))):
        _UNREBUILT.add(key)
        return []
    return list(built[0])


def unrebuilt() -> int:
    """How many distinct streams could not be rebuilt as their runs saw them (since the process started)."""
    return len(_UNREBUILT)
