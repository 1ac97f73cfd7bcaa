"""Throughput at real sizes: tokens/s of OVQ against SDPA (flash, fp32) and fla's kernels, by batch and T.

    python -m benchmarks.throughput [--batches 1,8,64] [--max-T 65536] [--max-T-infer 262144]
                                    [--max-tokens 1048576] [--ops ...] [--out DIR] [--device cuda]

For every batch B and length T with B x T <= --max-tokens (inference also at T up to --max-T-infer,
batch 1, where flash attention's quadratic cost shows), the ops of ``benchmarks.gpu_ops`` (4 heads x
64; OVQ N = 1024, chunk 64) are timed forward without grad (inference) and forward + backward
(training) in one run, and reported as tokens/s (B T / time) with each op's ratio to SDPA flash's
time (> 1: slower than flash). Default ops: ovq-graph (static shapes + CUDA graphs; in training the
graphs are skipped, so its training numbers are the static path's), ovq (the dynamic path),
sdpa-flash, sdpa-fp32, fla-gdn. Writes ``throughput.json`` to --out. Every op runs in a try block:
one failure (a missing fla, out of memory) leaves the others' numbers. ``--device cpu`` runs the
non-fla ops on the CPU with small sizes (a check of the script, not a benchmark of record).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict

import torch

from benchmarks.common import fmt_time, machine_info, markdown_table, time_min
from benchmarks.gpu_ops import make_ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--max-T", type=int, default=64 * 1024, help="longest T for training and batched inference")
    p.add_argument("--max-T-infer", type=int, default=256 * 1024, help="longest T for inference at batch 1")
    p.add_argument("--max-tokens", type=int, default=2**20, help="skip B x T above this")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=20.0, help="stop repeating one measurement after this")
    p.add_argument("--ops", default="ovq-graph,ovq,sdpa-flash,sdpa-fp32,fla-gdn")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=os.environ.get("OUT") or "outputs/benchmarks/throughput")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no GPU here: pass --device cpu for a check of the script")
    names = [n.strip() for n in args.ops.split(",") if n.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    Ts = [2**i for i in range(10, 19) if 2**i <= max(args.max_T, args.max_T_infer)]
    info = machine_info(args.device)
    print(f"# {info.get('gpu', info['cpu'])}, torch {info['torch']}, ops {names}", flush=True)
    res: Dict[str, Dict[str, Dict[str, float]]] = {"infer": {n: {} for n in names}, "train": {n: {} for n in names}}
    for B in batches:
        for T in Ts:
            modes = [m for m, limit in (("infer", args.max_T_infer if B == 1 else args.max_T), ("train", args.max_T))
                     if T <= limit and B * T <= args.max_tokens * (4 if m == "infer" and B == 1 else 1)]
            if not modes:
                continue
            ops = make_ops(B, T, args.device)
            for n in names:
                for mode in modes:
                    key = f"{B}x{T}"
                    try:
                        if mode == "infer":
                            with torch.no_grad():
                                ops[n](False)                               # compile, capture, warm up
                                t = time_min(lambda: ops[n](False), args.device, args.repeats, args.max_seconds)
                        else:
                            ops[n](True).backward()
                            t = time_min(lambda: ops[n](True).backward(), args.device, args.repeats, args.max_seconds)
                        res[mode][n][key] = t
                        print(f"  {mode:5s} {n:11s} B={B:3d} T={T:7d} {fmt_time(t)}  {B * T / t / 1e6:.3g} Mtok/s", flush=True)
                    except Exception as exc:  # noqa: BLE001 - one failure leaves the other numbers
                        print(f"  {mode:5s} {n:11s} B={B:3d} T={T:7d} failed: {type(exc).__name__}: {str(exc)[:160]}",
                              flush=True)
                    if args.device == "cuda":
                        torch.cuda.empty_cache()
    for mode, title in (("infer", "inference (forward, no grad)"), ("train", "training (forward + backward)")):
        keys = sorted({k for n in names for k in res[mode][n]}, key=lambda k: tuple(map(int, k.split("x"))))
        print(f"\n## {title}: Mtokens/s, and (time / SDPA flash time)\n")
        rows = []
        for key in keys:
            B, T = map(int, key.split("x"))
            base = res[mode].get("sdpa-flash", {}).get(key)
            row = [str(B), str(T)]
            for n in names:
                t = res[mode][n].get(key)
                row.append("-" if t is None else f"{B * T / t / 1e6:.3g}" + ("" if base is None or n == "sdpa-flash" else f" ({t / base:.2f})"))
            rows.append(row)
        print(markdown_table(["B", "T"] + names, rows))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "throughput.json")
    with open(path, "w") as f:
        json.dump({"machine": info, "results": res}, f, indent=1)
    print(f"\nwritten {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
