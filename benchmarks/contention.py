"""CPU under load: how much OVQ slows down beside competing processes, against SDPA under the same load.

    python -m benchmarks.contention [--T 16384] [--competitors 2] [--threads 2] [--repeats 3] [--out DIR]

One OVQ layer (N = 1024, chunk 64) and one full-attention layer (PyTorch SDPA) at d_model 256 = 4 heads
x 64, batch 1, forward without grad, each timed idle and then beside ``--competitors`` processes that
each run single-threaded 512^3 matmuls without pause (a stand-in for other training jobs on the
node), all in this one run, the three layers interleaved in each condition. OVQ runs under each loop
thread policy (``ovq_cl.ops.ovq.threads``): ``inherit`` (torch's threads inside the chunk loop, the
behaviour before the policy) and ``auto`` (the default: single-threaded while others hold cores).

Prints the times (min and median over repeats), each layer's slowdown (loaded / idle, medians) and
OVQ's slowdown over SDPA's (the target of issue 16: at most 2); writes ``contention.json`` to --out.
Start it on an otherwise idle machine: the idle column must be idle.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

from benchmarks.common import D_MODEL, HEADS, MIXER_OPTIONS, load_average, machine_info, markdown_table


def _compete(stop) -> None:
    """A competing process: single-threaded matmuls until told to stop."""
    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    while not stop.is_set():
        a @ b


def _times(fn: Callable[[], object], repeats: int, max_seconds: float) -> List[float]:
    out, spent = [], 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        spent += out[-1]
        if spent > max_seconds:
            break
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--competitors", type=int, default=None, help="competing processes (default: one per core)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=60.0, help="stop repeating a layer after this long")
    p.add_argument("--out", default=os.environ.get("OUT") or "outputs/benchmarks/contention")
    args = p.parse_args(argv)
    from experiments.threads import auto_threads
    from ovq_cl.layers import build_mixer
    from ovq_cl.ops.ovq import threads as loop

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(args.threads or cores)
    n_comp = cores if args.competitors is None else args.competitors
    torch.manual_seed(0)
    layers = {"ovq": build_mixer("ovq", D_MODEL, HEADS, MIXER_OPTIONS["ovq"]).eval(),
              "full": build_mixer("full", D_MODEL, HEADS, {}).eval()}
    x = torch.randn(1, args.T, D_MODEL)
    variants: Dict[str, Callable[[], object]] = {}

    def ovq_with(policy):
        def run():
            loop.set_loop_threads(policy)
            with torch.no_grad():
                return layers["ovq"](x)
        return run

    variants["ovq (inherit)"] = ovq_with("inherit")
    variants["ovq (auto)"] = ovq_with(auto_threads)
    def sdpa():
        with torch.no_grad():
            return layers["full"](x)

    variants["sdpa"] = sdpa
    info = machine_info()
    print(f"machine: {info['nproc']} cores, torch threads {torch.get_num_threads()}, load {load_average()}, "
          f"T = {args.T}, competitors {n_comp}", flush=True)
    for fn in variants.values():                                    # warm-up
        fn()
    results: Dict[str, Dict[str, List[float]]] = {"idle": {}, "loaded": {}}
    for name, fn in variants.items():
        results["idle"][name] = _times(fn, args.repeats, args.max_seconds)
        print(f"idle   {name}: {min(results['idle'][name]):.3f} s", flush=True)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_compete, args=(stop,), daemon=True) for _ in range(n_comp)]
    for proc in procs:
        proc.start()
    time.sleep(3.0)                                                 # the competitors are running
    load_during = load_average()
    try:
        for name, fn in variants.items():
            results["loaded"][name] = _times(fn, args.repeats, args.max_seconds)
            print(f"loaded {name}: {min(results['loaded'][name]):.3f} s", flush=True)
    finally:
        stop.set()
        for proc in procs:
            proc.join(timeout=10)
    loop.set_loop_threads("inherit")
    med = {c: {n: statistics.median(t) for n, t in r.items()} for c, r in results.items()}
    slow = {n: med["loaded"][n] / med["idle"][n] for n in variants}
    rows = [[n, f"{min(results['idle'][n]):.3f} / {med['idle'][n]:.3f} s",
             f"{min(results['loaded'][n]):.3f} / {med['loaded'][n]:.3f} s", f"{slow[n]:.2f}x",
             f"{slow[n] / slow['sdpa']:.2f}"] for n in variants]
    print(markdown_table(["layer", "idle (min / median)", f"{n_comp} competitors (min / median)", "slowdown",
                          "slowdown / SDPA's"], rows))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "contention.json")
    with open(path, "w") as fh:
        json.dump({"machine": info, "T": args.T, "competitors": n_comp, "load_during": load_during,
                   "times": results, "slowdown": slow}, fh, indent=1)
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
