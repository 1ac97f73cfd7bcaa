"""The position curve: bits per byte against the position in a long document (the paper's PG19 curve).

A model reads each held-out document of ``length`` bytes from a fresh state, in chunks of ``chunk``
tokens with its state carried (what the text stream does across windows), and every byte's loss is
binned by its position: buckets ``[0, 64), [64, 256), [256, 1024), ...`` (x4 each) up to ``length``.
A memory that uses long context predicts later bytes better, so its curve falls with position; one
that keeps only a window flattens after it::

    curve = measure_position_curve(model, documents, length=16384)
    curve.table()        # bits per byte per bucket, s.e. over documents

Standard errors are over documents (the bytes of one document are not independent): the per-document
mean of each bucket, then the s.e. of those means.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Dict, List

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ovq_cl.base import collate_episodes


@dataclass
class PositionBucket:
    lo: int                    # positions [lo, hi) of the document
    hi: int
    bits_per_byte: float
    standard_error: float      # over documents
    documents: int


@dataclass
class PositionCurve:
    buckets: List[PositionBucket] = field(default_factory=list)

    def as_dict(self) -> Dict:
        return {"buckets": [asdict(b) for b in self.buckets]}

    @classmethod
    def from_dict(cls, d: Dict) -> "PositionCurve":
        return cls([PositionBucket(**b) for b in d.get("buckets", [])])

    def table(self) -> str:
        lines = ["positions        bits/byte   s.e.   documents"]
        for b in self.buckets:
            lines.append(f"[{b.lo:>6}, {b.hi:>6})  {b.bits_per_byte:9.4f}  {b.standard_error:6.4f}  {b.documents:>5}")
        return "\n".join(lines)


def position_edges(length: int, first: int = 64) -> List[int]:
    """0, first, 4 * first, ... below ``length``, then ``length``."""
    if length < 1 or first < 1:
        raise ValueError(f"position curve: length and first must be >= 1, got {length}, {first}")
    edges, e = [0], first
    while e < length:
        edges.append(e)
        e *= 4
    return edges + [length]


@torch.no_grad()
def measure_position_curve(model: torch.nn.Module, documents, length: int, chunk: int = 1024,
                           batch_size: int = 4, device="cpu") -> PositionCurve:
    """Bits per byte per position bucket over ``documents`` (items (x [length], y [length]) of bytes: y is
    the next byte of x), each read from a fresh state in chunks of ``chunk`` tokens, state carried."""
    if chunk < 1 or batch_size < 1:
        raise ValueError(f"position curve: chunk and batch_size must be >= 1, got {chunk}, {batch_size}")
    edges = position_edges(length)
    per_doc: List[List[float]] = [[] for _ in range(len(edges) - 1)]   # bucket -> per-document mean bits
    was_training = model.training
    model.eval()
    try:
        for x, y, *_ in DataLoader(documents, batch_size=batch_size, collate_fn=collate_episodes):
            if x.shape[1] != length:
                raise ValueError(f"position curve: documents of {x.shape[1]} bytes, expected {length}")
            x, y = x.to(device), y.to(device)
            bits = torch.empty(x.shape, dtype=torch.float64)
            states = None
            for lo in range(0, length, chunk):
                out, states = model(x[:, lo:lo + chunk], states)
                nll = F.cross_entropy(out.float().transpose(1, 2), y[:, lo:lo + chunk], reduction="none")
                bits[:, lo:lo + chunk] = (nll / math.log(2)).double().cpu()
            for k in range(len(edges) - 1):
                per_doc[k] += bits[:, edges[k]:edges[k + 1]].mean(1).tolist()
    finally:
        model.train(was_training)
    curve = PositionCurve()
    for k, values in enumerate(per_doc):
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
        curve.buckets.append(PositionBucket(edges[k], edges[k + 1], statistics.fmean(values), se, len(values)))
    return curve


def plot_position(curves: Dict[str, PositionCurve], title: str):
    """Bits per byte against position (log x), one line per domain."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, curve in curves.items():
        mids = [max(b.lo, 1) * 0.5 + b.hi * 0.5 for b in curve.buckets]
        ax.errorbar(mids, [b.bits_per_byte for b in curve.buckets], yerr=[1.96 * b.standard_error for b in curve.buckets],
                    marker="o", capsize=3, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("position in the document (bytes, bucket middle)")
    ax.set_ylabel("bits per byte (95% interval over documents)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=8)
    return fig
