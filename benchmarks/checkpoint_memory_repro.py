"""Why OVQ has no activation checkpointing yet: a minimal repro of what was measured (CPU, torch 2.13).

    MALLOC_MMAP_THRESHOLD_=65536 python -m benchmarks.checkpoint_memory_repro

A chain of functional dictionary updates (OVQ's training-mode chunk loop in miniature: read a 1 MB
dictionary, update it out of place) over 64 chunks, plain and under non-reentrant
``torch.utils.checkpoint`` in groups of 16. Prints the resident memory the forward adds, and what is
left once every output is freed. Seen here: plain ~140 MB -> ~7 MB after freeing; checkpointed
~158 MB -> ~149 MB, with no Python tensor alive to explain it (the symptom of pytorch/pytorch#147449
and #80151). Each variant runs in its own process, so one cannot leave memory to the other.
"""
from __future__ import annotations

import ctypes
import gc
import subprocess
import sys

import torch
from torch.utils.checkpoint import checkpoint

CHUNKS, GROUP = 64, 16


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def step(d: torch.Tensor, q: torch.Tensor):
    p = torch.bmm(q, d.transpose(1, 2)).softmax(-1)               # [4, 64, 1024] scores
    return torch.bmm(p, d), d.index_add(1, torch.arange(q.shape[1]), q)


def chunks(d: torch.Tensor, qs):
    outs = []
    for q in qs:
        o, d = step(d, q)
        outs.append(o)
    return outs, d


def measure(mode: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 1024, 64, requires_grad=True)
    qs = torch.randn(CHUNKS, 4, 64, 64, requires_grad=True)
    start = rss_mb()
    d, outs = x * 1.0, []
    for i in range(0, CHUNKS, GROUP):
        group = [qs[j] for j in range(i, i + GROUP)]
        o, d = checkpoint(chunks, d, group, use_reentrant=False) if mode == "checkpoint" else chunks(d, group)
        outs += o
    after_forward = rss_mb() - start
    del outs, d, o, group
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(f"{mode:10s}: forward adds {after_forward:6.1f} MB resident; {rss_mb() - start:6.1f} MB left after freeing"
          " every output")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        measure(sys.argv[1])
    else:
        for mode in ("plain", "checkpoint"):
            subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_memory_repro", mode], check=True)
