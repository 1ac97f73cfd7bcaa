"""GPU, op level: OVQ on its Triton kernels against PyTorch SDPA (flash) and fla's Triton kernels.

    python -m benchmarks.gpu_ops --max-T 65536 [--batch 1] [--out DIR]

For T = 1k .. max-T (batch B, 4 heads x 64), forward (no grad) and forward + backward of:

- ``ovq``: ``ovq_attention(..., backend="triton")``, N = 1024, chunk 64, float32 (the Triton read in
  IEEE fp32; the chunk loop runs on the host, one iteration per chunk);
- ``ovq-torch``: the same op on the PyTorch reference (``backend="chunk"``) on the GPU;
- ``ovq-static``: the Triton op with static shapes (the whole dictionary every chunk, masked);
  ``ovq-graph``: the same, runs of 16 chunks replayed from one captured CUDA graph (inference; in
  training the blocks are skipped, so its training time is ovq-static's); ``ovq-tf32``: ovq-graph
  with TF32 dots in the read and the assignment;
- ``sdpa-flash``: ``F.scaled_dot_product_attention(is_causal=True)`` in bfloat16 with the flash
  backend; ``sdpa-fp32``: the same in float32 (whatever backend PyTorch picks);
- ``fla-linear``: ``fla.ops.linear_attn.chunk_linear_attn`` (bfloat16, normalised);
- ``fla-gdn``: ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (bfloat16, l2-normalised q, k).

Prints a markdown table (times and ratios against OVQ) and the peak memory of each forward; writes
``gpu_ops.json`` to --out. Every op runs in a try block, so one failure does not stop the others.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from benchmarks.common import fmt_time, machine_info, markdown_table, time_min

H, D = 4, 64


def make_ops(B: int, T: int, device: str) -> Dict[str, Callable[[bool], torch.Tensor]]:
    """name -> fn(train) returning a scalar to backprop (train) or the output (inference)."""
    from ovq_cl.ops.ovq import OVQParams, ovq_attention

    g = torch.Generator(device=device).manual_seed(0)
    base = {n: torch.randn(B, T, H, D, device=device, generator=g) for n in ("q", "k", "v")}
    params = OVQParams(num_slots=1024, chunk_size=64)
    ops: Dict[str, Callable[[bool], torch.Tensor]] = {}

    def leaf(dtype, names=("q", "k", "v"), train=False):
        return [base[n].to(dtype).detach().requires_grad_(train) for n in names]

    def ovq(backend, **how):
        def run(train):
            q, k, v = leaf(torch.float32, train=train)
            beta = torch.full((H,), 8.0, device=device, requires_grad=train)
            o, _ = ovq_attention(q, k, v, beta, params, backend=backend, **how)
            return o.float().square().mean() if train else o
        return run

    ops["ovq"] = ovq("triton")
    ops["ovq-torch"] = ovq("chunk")
    ops["ovq-static"] = ovq("triton", static=True)                           # same shapes every chunk
    ops["ovq-graph"] = ovq("triton", static=True, block_chunks=16)          # + CUDA graph per 16 chunks (inference)

    def ovq_tf32(train):                        # static + graphs on the kernels with TF32 dots
        from ovq_cl.ops.ovq.chunk import ovq_chunk_loop
        from ovq_cl.ops.ovq.triton import make_triton_primitives

        q, k, v = leaf(torch.float32, train=train)
        beta = torch.full((H,), 8.0, device=device, requires_grad=train)
        o, _ = ovq_chunk_loop(q, k, v, beta, params, prims=make_triton_primitives(precision="tf32"), static=True,
                              block_chunks=16)
        return o.float().square().mean() if train else o

    ops["ovq-tf32"] = ovq_tf32

    def sdpa(dtype, flash):
        def run(train):
            q, k, v = (t.transpose(1, 2) for t in leaf(dtype, train=train))
            if flash:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return o.float().square().mean() if train else o
        return run

    ops["sdpa-flash"] = sdpa(torch.bfloat16, True)
    ops["sdpa-fp32"] = sdpa(torch.float32, False)

    def fla_linear(train):
        from fla.ops.linear_attn import chunk_linear_attn

        q, k, v = leaf(torch.bfloat16, train=train)
        o, _ = chunk_linear_attn(F.elu(q) + 1, F.elu(k) + 1, v, normalize=True)
        return o.float().square().mean() if train else o

    def fla_gdn(train):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        q, k, v = leaf(torch.bfloat16, train=train)
        gate = torch.full((B, T, H), -0.01, device=device, dtype=torch.float32)
        beta = torch.full((B, T, H), 0.5, device=device, dtype=torch.bfloat16)
        o, _ = chunk_gated_delta_rule(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, gate, beta)
        return o.float().square().mean() if train else o

    ops["fla-linear"] = fla_linear
    ops["fla-gdn"] = fla_gdn
    return ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-T", type=int, default=64 * 1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ops", default="ovq,ovq-torch,sdpa-flash,sdpa-fp32,fla-linear,fla-gdn")
    p.add_argument("--out", default=os.environ.get("OUT") or "outputs/benchmarks/gpu")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("no GPU here: this benchmark is for CUDA machines")
    device = "cuda"
    names = [n.strip() for n in args.ops.split(",") if n.strip()]
    Ts = [T for T in (1024, 4096, 16384, 32768, 65536) if T <= args.max_T]
    info = machine_info(device)
    print(f"# {info.get('gpu')}, torch {info['torch']}, batch {args.batch}, {H} heads x {D}", flush=True)
    res: Dict[str, Dict[str, Dict[int, float]]] = {"fwd": {n: {} for n in names}, "fwdbwd": {n: {} for n in names},
                                                   "mem": {n: {} for n in names}}
    for T in Ts:
        ops = make_ops(args.batch, T, device)
        for n in names:
            fn = ops[n]
            try:
                with torch.no_grad():
                    fn(False)                                                 # compile / warm up
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    start = torch.cuda.memory_allocated()
                    res["fwd"][n][T] = time_min(lambda: fn(False), device, args.repeats, 60)
                    res["mem"][n][T] = torch.cuda.max_memory_allocated() - start
                fn(True).backward()
                res["fwdbwd"][n][T] = time_min(lambda: fn(True).backward(), device, args.repeats, 60)
                print(f"  {n:11s} T={T:6d} fwd {fmt_time(res['fwd'][n][T])}, fwd+bwd {fmt_time(res['fwdbwd'][n][T])}",
                      flush=True)
            except Exception as exc:  # one op failing (missing fla, out of memory) does not stop the rest
                print(f"  {n:11s} T={T:6d} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            torch.cuda.empty_cache()
    for key, title in (("fwd", "forward (no grad)"), ("fwdbwd", "forward + backward")):
        print(f"\n## {title}: time, and ratio = op time / OVQ (Triton) time\n")
        rows = []
        for T in Ts:
            base = res[key].get("ovq", {}).get(T)
            row = [f"{T // 1024}k"]
            for n in names:
                t = res[key][n].get(T)
                row.append("-" if t is None else fmt_time(t) + ("" if base is None or n == "ovq" else f" ({t / base:.2f})"))
            rows.append(row)
        print(markdown_table(["T"] + names, rows))
    print("\n## forward peak memory added (MB)\n")
    print(markdown_table(["T"] + names, [[f"{T // 1024}k"] + [
        "-" if T not in res["mem"][n] else f"{res['mem'][n][T] / 2**20:.1f}" for n in names] for T in Ts]))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_ops.json"), "w") as f:
        json.dump({"machine": info, "batch": args.batch, "results": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
