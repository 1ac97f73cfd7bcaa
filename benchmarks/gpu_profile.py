"""Where the time of one OVQ layer call goes on a GPU: torch.profiler over an inference call.

    python -m benchmarks.gpu_profile [--T 4096] [--mixer ovq]

Prints the top host-side ops by self CPU time, the number of kernel launches and of host-device
synchronisations per 64-token chunk (the chunk loop runs on the host, so these set the floor of a
batch-1 call), the GPU-busy fraction of the wall time, and where the synchronisations come from
(``torch.cuda.set_sync_debug_mode``: the ovq_cl source lines of the ops that synchronised).
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import D_MODEL, HEADS, MIXER_OPTIONS, fmt_time, time_min


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--mixer", default="ovq")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("no GPU here")
    from ovq_cl.layers import build_mixer

    model = build_mixer(args.mixer, D_MODEL, HEADS, dict(MIXER_OPTIONS[args.mixer])).cuda().eval()
    x = torch.randn(1, args.T, D_MODEL, device="cuda")
    with torch.inference_mode():
        model(x)
        wall = time_min(lambda: model(x), "cuda", 3)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model(x)
            torch.cuda.synchronize()
    events = prof.key_averages()
    chunks = max(1, args.T // MIXER_OPTIONS[args.mixer].get("chunk_size", 64))
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"))
    syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"))
    items = sum(e.count for e in events if e.key == "aten::_local_scalar_dense")   # .item() and friends
    copies = sum(e.count for e in events if e.key == "cudaMemcpyAsync")
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"# {args.mixer} T={args.T}: wall {fmt_time(wall)}; per chunk: {launches / chunks:.1f} kernel launches,"
          f" {syncs / chunks:.1f} CUDA synchronize calls (the profiled call's final one included),"
          f" {items / chunks:.1f} tensor-to-Python reads, {copies / chunks:.1f} cudaMemcpyAsync;"
          f" GPU busy {gpu_us / 1e6 / wall:.1%} of the wall time")
    print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=45))
    print_sync_sources(model, x)
    return 0


def print_sync_sources(model, x) -> None:
    """One call with sync debugging on: each synchronising op warns; report where in ovq_cl it was."""
    def call():
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with torch.inference_mode():
                model(x)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")

    print("\n# synchronising ops during one call (count, innermost ovq_cl frame):")
    for where, n in warning_sources(call, "ovq_cl").most_common(10):
        print(f"  {n:6d}  {where}")


def warning_sources(fn, package: str):
    """Runs fn; counts the warnings it raises by the innermost stack frame inside ``package``."""
    import collections
    import traceback
    import warnings

    sources: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack() if package in f.filename and f.filename != __file__]
        sources[f"{frames[-1].filename.split(package)[-1]}:{frames[-1].lineno} {frames[-1].line}" if frames
                else f"{filename}:{lineno}"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        original, warnings.showwarning = warnings.showwarning, record
        try:
            fn()
        finally:
            warnings.showwarning = original
    return sources


if __name__ == "__main__":
    sys.exit(main())
