"""Speed and memory of OVQ attention against every baseline, measured in one run.

    python -m benchmarks.speed_memory                 # CPU: T = 1k .. 64k (~7-10 min on 2 idle cores)
    python -m benchmarks.speed_memory --quick         # T = 1k .. 8k, fewer repeats (~2 min)
    python -m benchmarks.speed_memory --device cuda   # the same on a GPU (OVQ on its Triton kernels)

Every mixer is the layer of ``ovq_cl.layers`` at d_model 256 = 4 heads x 64, batch 1, float32
(options in ``benchmarks.common.MIXER_OPTIONS``: OVQ N = 1024, chunk 64; VQ 1024 codes; SWA window
1024; linear and Gated DeltaNet chunk 64). Sections, each printed as a markdown table with the
ratios against OVQ measured in the same run:

- prefill: inference (``torch.inference_mode``), one call over the whole sequence of T tokens;
- train: forward + backward of ``y.square().mean()`` over T tokens;
- stream: inference memory, the sequence streamed through the layer in fixed segments (default
  1024 tokens) with the state carried, the way a long sequence is served: the peak is the state
  plus one segment's activations for a constant-memory mixer, and grows with T for full attention
  (its KV cache). Each point runs in a fresh subprocess (see ``benchmarks.common.PeakMemory``);
- slots: OVQ across N at a fixed T (whole layer), and per chunk with a saturated dictionary the
  read, the assignment (argmax over the N slots) and the write (growth + k-means merge, a
  gather/scatter-add of L rows): the write does not grow with N;
- flops: achieved FLOP/s of the OVQ read next to the machine's matmul peak, both measured here;
- recompute (only when asked for): OVQ and VQ training time and peak memory with ``recompute_chunks`` = S.

Then the issue's targets (OVQ N = 1024, chunk 64, d = 64, 4 heads): T = 16k >= 3x faster than full
attention, 64k >= 10x; time per token at 64k within 1.2x of 4k; streaming peak memory at 64k within
10% of 4k. Results go to ``--out`` (default outputs/benchmarks/, git-ignored): results.json and
speed_memory.png (time and memory against T).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional

import torch

from benchmarks.common import (
    D_MODEL, HEADS, MIXER_OPTIONS, PeakMemory, fmt_mb, fmt_time, load_average, machine_info, markdown_table,
    matmul_peak, sync, time_min,
)

K = 1024


def build(name: str, device: str, options: Optional[dict] = None, seed: int = 0):
    from ovq_cl.layers import build_mixer

    torch.manual_seed(seed)
    opts = dict(MIXER_OPTIONS[name]) if options is None else options
    return build_mixer(name, D_MODEL, HEADS, opts).to(device)


def tk(T: int) -> str:
    return f"{T // K}k" if T % K == 0 else str(T)


# ----------------------------------------------------------------------------------------- timing

#: largest T of one call, per mixer, on CPU (none: sliding-window attention runs in blocks of W queries)
ONE_CALL_MAX_T: Dict[str, int] = {}


def run_prefill(mixers, Ts, device, repeats, max_seconds) -> Dict[str, Dict[int, float]]:
    """Inference, one call over T tokens; mixers interleaved per T so ratios compare close runs."""
    models = {m: build(m, device).eval() for m in mixers}
    x_all = torch.randn(1, max(Ts), D_MODEL, device=device, generator=None)
    out: Dict[str, Dict[int, float]] = {m: {} for m in mixers}
    stopped: Dict[str, bool] = {m: False for m in mixers}
    with torch.inference_mode():
        for m in mixers:
            models[m](x_all[:, :min(1024, max(Ts))])               # warm-up (allocator, kernels, caches)
        for T in Ts:
            x = x_all[:, :T]
            for m in mixers:
                if stopped[m] or (device == "cpu" and T > ONE_CALL_MAX_T.get(m, T)):
                    continue
                t = time_min(lambda: models[m](x), device, repeats, max_seconds)
                out[m][T] = t
                grow = 4.0 if m == "full" else 2.2                         # next T doubles: quadratic or linear
                if t * grow > max_seconds * 3:
                    stopped[m] = True
                print(f"  prefill {m:6s} T={tk(T):>4s} {fmt_time(t):>10s}  ({t / T * 1e6:.1f} us/token)", flush=True)
    return out


def train_mode(model, name: str):
    """Training mode for every mixer (VQ's EMA codebook update included)."""
    return model.train()


def run_train(mixers, Ts, device, repeats, max_seconds) -> Dict[str, Dict[int, float]]:
    models = {m: train_mode(build(m, device), m) for m in mixers}
    x_all = torch.randn(1, max(Ts), D_MODEL, device=device)
    out: Dict[str, Dict[int, float]] = {m: {} for m in mixers}
    stopped = {m: False for m in mixers}

    def step(model, x):
        y, _ = model(x)
        y.square().mean().backward()

    for m in mixers:
        step(models[m], x_all[:, :256])
    for T in Ts:
        x = x_all[:, :T]
        for m in mixers:
            if stopped[m] or (device == "cpu" and T > ONE_CALL_MAX_T.get(m, T)):
                continue
            t = time_min(lambda: step(models[m], x), device, repeats, max_seconds)
            out[m][T] = t
            if t * (4.0 if m == "full" else 2.2) > max_seconds * 3:
                stopped[m] = True
            print(f"  train   {m:6s} T={tk(T):>4s} {fmt_time(t):>10s}", flush=True)
    return out


# ----------------------------------------------------------------------------- memory (subprocess)

def worker(spec: dict) -> dict:
    """One memory measurement in this (fresh) process; returns a JSON-able dict."""
    torch.set_num_threads(spec["threads"])
    device, T, mode = spec["device"], spec["T"], spec["mode"]
    model = build(spec["mixer"], device, spec.get("options"))
    gen = torch.Generator(device=device).manual_seed(1)
    seg = spec["segment"]
    if mode == "stream":
        model.eval()

        seg_times = []

        def stream(n_tokens):
            state, acc = None, 0.0
            for start in range(0, n_tokens, seg):
                x = torch.randn(1, min(seg, n_tokens - start), D_MODEL, device=device, generator=gen)
                t = time.perf_counter()
                y, state = model(x, state)
                acc += float(y[0, -1, 0])
                seg_times.append((time.perf_counter() - t, x.shape[1]))
            return state, acc

        with torch.inference_mode():
            # no warm-up: a warm-up would leave its freed blocks in the heap and hide the run's own peak;
            # the first segment's one-off costs (BLAS buffers, thread pool) are the same at every T
            t0 = time.perf_counter()
            with PeakMemory(device) as mem:
                state, _ = stream(T)
                sync(device)
            dt = time.perf_counter() - t0
        k4 = max(1, 4096 // seg)                                               # segments in 4k tokens
        first, last = seg_times[:k4], seg_times[-k4:]
        per_token = lambda part: sum(t for t, _ in part) / sum(n for _, n in part)  # noqa: E731
        return {"peak": mem.peak, "absolute": mem.absolute, "state": state.nbytes, "seconds": dt,
                "first4k_s_per_token": per_token(first), "last4k_s_per_token": per_token(last)}
    train_mode(model, spec["mixer"])
    x = torch.randn(1, T, D_MODEL, device=device, generator=gen)
    t0 = time.perf_counter()
    with PeakMemory(device) as mem:
        y, state = model(x)
        y.square().mean().backward()
        sync(device)
    return {"peak": mem.peak, "absolute": mem.absolute, "state": state.nbytes, "seconds": time.perf_counter() - t0}


def worker_env(malloc: str) -> Dict[str, str]:
    """``malloc="mmap"``: glibc serves every block >= 64 KiB with its own mapping and unmaps it when
    freed, so the resident set follows the live tensors. With the default allocator freed blocks stay
    in the heap, and a run whose temporaries change size (OVQ's [L, n_active] scores while the
    dictionary grows) fragments it: RSS then grows with T although the live memory does not
    (OVQ streamed, 1 thread: 28.2 MB at 4k and 41.6 MB at 64k with the default allocator, 27.6 and
    28.7 MB with mmap). The price: allocations are slower, so the streaming times printed from these
    runs are pessimistic (use the prefill section for speed)."""
    env = dict(os.environ)
    if malloc == "mmap":
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    return env


def measure_memory(mode, mixers, Ts, args) -> Dict[str, Dict[int, dict]]:
    out: Dict[str, Dict[int, dict]] = {m: {} for m in mixers}
    for T in Ts:
        for m in mixers:
            r = measure_one({"mode": mode, "mixer": m, "T": T}, args, label=f"{mode:6s} {m:6s}")
            if r is not None:
                out[m][T] = r
    return out


def measure_one(spec: dict, args, label: str) -> Optional[dict]:
    """One point of :func:`worker`: in a fresh process on CPU, in this one on CUDA (exact allocator
    statistics there). None (and a printed reason) when it fails, e.g. out of memory."""
    spec = dict(spec, segment=args.segment, device=args.device, threads=args.threads)
    T = spec["T"]
    if args.device == "cuda":
        try:
            r = worker(spec)
        except Exception as exc:  # e.g. out of memory at 64k
            print(f"  {label} T={tk(T)} failed: {type(exc).__name__}: {exc}", flush=True)
            return None
        finally:
            torch.cuda.empty_cache()
        print(f"  {label} T={tk(T):>4s} peak +{fmt_mb(r['peak'])} MB, state {fmt_mb(r['state'])} MB,"
              f" {fmt_time(r['seconds'])}", flush=True)
        return r
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed_memory", "--worker", json.dumps(spec)],
        capture_output=True, text=True, timeout=args.worker_timeout, env=worker_env(args.malloc),
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"  {label} T={tk(T)} failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    r = json.loads(lines[-1])
    print(f"  {label} T={tk(T):>4s} peak +{fmt_mb(r['peak'])} MB (absolute {fmt_mb(r['absolute'])} MB),"
          f" state {fmt_mb(r['state'])} MB, {fmt_time(r['seconds'])}", flush=True)
    return r


def run_recompute(mixers: List[str], groups: List[int], Ts: List[int], args) -> Dict[str, Dict[int, Dict[int, dict]]]:
    """OVQ / VQ training (forward + backward) with ``recompute_chunks`` = S: time and peak memory
    added, one fresh process per point (S = 0: the plain graph). Returns {mixer: {S: {T: point}}}."""
    out: Dict[str, Dict[int, Dict[int, dict]]] = {}
    for m in mixers:
        if args.device == "cuda":          # in process there: compile the kernels before the first point
            worker({"mode": "train", "mixer": m, "T": 1024, "segment": args.segment, "device": "cuda",
                    "threads": args.threads})
        out[m] = {}
        for S in groups:
            opts = dict(MIXER_OPTIONS[m], recompute_chunks=S)
            out[m][S] = {}
            for T in Ts:
                r = measure_one({"mode": "train", "mixer": m, "options": opts, "T": T}, args,
                                label=f"recompute {m} S={S:<3d}")
                if r is not None:
                    out[m][S][T] = r
    return out


# --------------------------------------------------------------------------------- OVQ across N

def saturated_state(N: int, device: str, L: int = 64, d: int = 64):
    from ovq_cl.ops.common import l2norm
    from ovq_cl.ops.ovq.common import OVQState

    g = torch.Generator(device=device).manual_seed(N)
    return OVQState(
        keys=l2norm(torch.randn(1, HEADS, N, d, device=device, generator=g)),
        values=torch.randn(1, HEADS, N, d, device=device, generator=g),
        counts=torch.randint(1, 50, (1, HEADS, N), device=device, generator=g).float(),
        pending_keys=torch.zeros(1, HEADS, 0, d, device=device),
        pending_values=torch.zeros(1, HEADS, 0, d, device=device),
        seen=10**12, n_active=N,
    )


def run_slots(Ns, T, args) -> Dict[int, dict]:
    """OVQ across N: the whole layer over T tokens, and the per-chunk parts with a saturated dictionary."""
    from ovq_cl.ops.common import l2norm
    from ovq_cl.ops.ovq import OVQParams
    from ovq_cl.ops.ovq.primitives import REFERENCE
    from ovq_cl.ops.ovq.update import absorb as absorb_update

    prims = REFERENCE
    if args.device == "cuda":
        from ovq_cl.ops.ovq.triton import TRITON as prims
    device, L, d = args.device, 64, 64
    out: Dict[int, dict] = {}
    x = torch.randn(1, T, D_MODEL, device=device)
    for N in Ns:
        model = build("ovq", device, {"num_slots": N, "chunk_size": L}).eval()
        with torch.inference_mode():
            model(x[:, :1024])
            layer = time_min(lambda: model(x), device, args.repeats, args.max_seconds)
        params = OVQParams(num_slots=N, chunk_size=L)
        g = torch.Generator(device=device).manual_seed(0)
        q = l2norm(torch.randn(1, HEADS, L, d, device=device, generator=g))
        k = l2norm(torch.randn(1, HEADS, L, d, device=device, generator=g))
        v = torch.randn(1, HEADS, L, d, device=device, generator=g)
        beta = torch.full((HEADS,), 8.0, device=device)
        state = saturated_state(N, device)
        reps = 50
        with torch.inference_mode():
            lc = state.counts.log()

            def loop(fn):
                return lambda: [fn() for _ in range(reps)]

            read = time_min(loop(lambda: prims.read(q, k, v, state.keys, state.values, lc, beta, q_offset=0)),
                            device, args.repeats) / reps
            assign = time_min(loop(lambda: prims.max_similarity(k, state.keys)), device, args.repeats) / reps
            slot = prims.max_similarity(k, state.keys)[1]
            write = time_min(loop(lambda: prims.merge(state.keys, state.values, state.counts, slot, k, v, True)),
                             device, args.repeats) / reps
            write_fn = time_min(loop(lambda: prims.merge(state.keys, state.values, state.counts, slot, k, v, False)),
                                device, args.repeats) / reps
            absorb = time_min(loop(lambda: absorb_update(state, k, v, params, prims, True)), device, args.repeats) / reps
        out[N] = {"layer": layer, "read": read, "assign": assign, "write": write, "write_functional": write_fn,
                  "absorb": absorb}
        print(f"  slots N={N:5d}: layer {fmt_time(layer)}, per chunk: read {read * 1e6:.0f} us, assign "
              f"{assign * 1e6:.0f} us, write {write * 1e6:.0f} us (functional {write_fn * 1e6:.0f} us)", flush=True)
    return out


def run_flops(args) -> dict:
    """Achieved FLOP/s of the OVQ read (N = 1024 saturated, L = 64, d = 64, 4 heads) vs the matmul peak."""
    from ovq_cl.ops.ovq.primitives import REFERENCE

    prims = REFERENCE
    if args.device == "cuda":
        from ovq_cl.ops.ovq.triton import TRITON as prims
    device, L, d, N = args.device, 64, 64, 1024
    B = 1 if device == "cpu" else 16                       # a GPU needs more lanes to fill
    state = saturated_state(N, device)
    keys, values = state.keys.expand(B, -1, -1, -1).contiguous(), state.values.expand(B, -1, -1, -1).contiguous()
    lc = state.counts.log().expand(B, -1, -1).contiguous()
    q = torch.nn.functional.normalize(torch.randn(B, HEADS, L, d, device=device), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, HEADS, L, d, device=device), dim=-1)
    v = torch.randn(B, HEADS, L, d, device=device)
    beta = torch.full((HEADS,), 8.0, device=device)
    reps = 50
    flops = 2 * B * HEADS * L * (N + L) * (d + d)          # scores and values, dictionary and local block
    with torch.inference_mode():
        t = time_min(lambda: [prims.read(q, k, v, keys, values, lc, beta, q_offset=0) for _ in range(reps)],
                     device, args.repeats) / reps
        a = torch.randn(B * HEADS, L, d, device=device)
        bm = keys.reshape(B * HEADS, N, d)
        t_bmm = time_min(lambda: [torch.bmm(a, bm.transpose(1, 2)) for _ in range(reps)], device, args.repeats) / reps
        peak = matmul_peak(device)
    res = {"read_seconds": t, "read_gflops": flops / t / 1e9, "bmm_same_shape_gflops": 2 * B * HEADS * L * N * d / t_bmm / 1e9,
           "matmul_peak_gflops": peak, "lanes": B}
    print(f"  flops: read {res['read_gflops']:.1f} GFLOP/s, bmm of one read matmul {res['bmm_same_shape_gflops']:.1f},"
          f" matmul peak {peak:.1f}", flush=True)
    return res


# ------------------------------------------------------------------------------------ reporting

def ratio_rows(times: Dict[str, Dict[int, float]], Ts: List[int], mixers: List[str]) -> List[List[str]]:
    rows = []
    for T in Ts:
        row = [tk(T)] + [fmt_time(times[m].get(T)) for m in mixers]
        base = times.get("ovq", {}).get(T)
        for m in mixers:
            if m == "ovq":
                continue
            t = times[m].get(T)
            row.append("-" if (t is None or base is None) else f"{t / base:.2f}")
        rows.append(row)
    return rows


def check_targets(prefill, stream) -> List[List[str]]:
    o, f = prefill.get("ovq", {}), prefill.get("full", {})
    rows = []

    def add(name, value, goal, ok):
        rows.append([name, value, goal, "-" if ok is None else ("met" if ok else "MISSED")])

    for T, goal in ((16 * K, 3.0), (64 * K, 10.0)):
        r = f[T] / o[T] if T in o and T in f else None
        add(f"prefill: full / OVQ at {tk(T)}", "not measured" if r is None else f"{r:.2f}x", f">= {goal:.0f}x",
            None if r is None else r >= goal)
    if 4 * K in o and 64 * K in o:
        r = (o[64 * K] / (64 * K)) / (o[4 * K] / (4 * K))
        add("prefill: OVQ time/token 64k vs 4k", f"{r:.2f}x", "<= 1.2x", r <= 1.2)
    else:
        add("prefill: OVQ time/token 64k vs 4k", "not measured", "<= 1.2x", None)
    s = stream.get("ovq", {})
    if 4 * K in s and 64 * K in s:
        a, b = s[4 * K], s[64 * K]
        r = b["peak"] / max(a["peak"], 1)
        add("stream: OVQ peak memory 64k vs 4k (added by the run)", f"{r:.3f}x ({fmt_mb(b['peak'])} vs {fmt_mb(a['peak'])} MB)",
            "<= 1.10x", r <= 1.10)
        r2 = b["absolute"] / a["absolute"]
        add("stream: OVQ peak RSS 64k vs 4k (whole process)", f"{r2:.3f}x", "<= 1.10x", r2 <= 1.10)
    else:
        add("stream: OVQ peak memory 64k vs 4k", "not measured", "<= 1.10x", None)
    return rows


def plot(results: dict, path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # matplotlib missing
        print(f"  (no plot: {exc})")
        return None
    panels = [("prefill", "inference, one call: time (s)"), ("train", "forward + backward: time (s)"),
              ("stream", "streamed inference: peak memory added (MB)")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, (key, title) in zip(axes, panels):
        data = results.get(key) or {}
        for m, series in data.items():
            pts = sorted((int(T), v) for T, v in series.items())
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [(p[1]["peak"] / 2**20) if key == "stream" else p[1] for p in pts]
            ax.plot(xs, ys, marker="o", label=m, linewidth=2.5 if m == "ovq" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    info = results.get("machine", {})
    fig.suptitle(f"OVQ vs baselines, d_model 256 = 4 x 64, batch 1 - {info.get('cpu', '')} x {info.get('threads', '')} threads,"
                 f" torch {info.get('torch', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="T up to 8k, one repeat, a few N (a smoke run)")
    p.add_argument("--max-T", type=int, default=64 * K, help="largest T for prefill and streaming")
    p.add_argument("--max-T-train", type=int, default=16 * K, help="largest T for forward + backward")
    p.add_argument("--mixers", default="ovq,vq,linear,delta,full,swa")
    p.add_argument("--sections", default="prefill,train,stream,slots,flops",
                   help="any of prefill,train,stream,slots,flops,recompute (recompute: not by default)")
    p.add_argument("--recompute-chunks", default="0,32", help="S values of the recompute section")
    p.add_argument("--slots", default="256,512,1024,2048,4096,8192", help="N values of the OVQ sweep")
    p.add_argument("--slots-T", type=int, default=16 * K, help="T of the OVQ sweep across N")
    p.add_argument("--segment", type=int, default=1024, help="tokens per call when streaming")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=60.0, help="stop growing T for a mixer past this per call")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--worker-timeout", type=float, default=1800.0)
    p.add_argument("--malloc", default="mmap", choices=["mmap", "default"],
                   help="glibc malloc mode of the memory subprocesses (see worker_env)")
    p.add_argument("--out", default=os.environ.get("OUT") or "outputs/benchmarks")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no GPU here")
    if args.quick:
        args.max_T, args.max_T_train, args.repeats = min(args.max_T, 8 * K), min(args.max_T_train, 4 * K), 1
        args.slots, args.slots_T = "256,1024,4096", min(args.slots_T, 4 * K)
    mixers = [m.strip() for m in args.mixers.split(",") if m.strip()]
    sections = set(args.sections.split(","))
    Ts = [T for T in (1 * K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K, 64 * K) if T <= args.max_T]
    Ts_train = [T for T in Ts if T <= args.max_T_train]
    Ts_mem = [T for T in (1 * K, 4 * K, 16 * K, 64 * K) if T <= args.max_T]
    os.makedirs(args.out, exist_ok=True)
    results: dict = {"machine": machine_info(args.device), "args": vars(args)}
    info = results["machine"]
    print(f"# machine: {info['cpu']}, nproc {info['nproc']}, torch {info['torch']}, threads {args.threads},"
          f" OMP_WAIT_POLICY {info['omp_wait_policy']}, load average {info['loadavg']}"
          + (f", GPU {info.get('gpu')}" if "gpu" in info else ""), flush=True)
    t_start = time.time()
    if "prefill" in sections:
        results["prefill"] = run_prefill(mixers, Ts, args.device, args.repeats, args.max_seconds)
    if "train" in sections:
        results["train"] = run_train(mixers, Ts_train, args.device, args.repeats, args.max_seconds)
    if "stream" in sections:
        results["stream"] = measure_memory("stream", mixers, Ts_mem, args)
    if "train" in sections and "stream" in sections:
        results["train_memory"] = measure_memory("train", mixers, [T for T in Ts_mem if T <= args.max_T_train], args)
    if "slots" in sections and "ovq" in mixers:
        results["slots"] = run_slots([int(n) for n in args.slots.split(",")], args.slots_T, args)
    if "flops" in sections:
        results["flops"] = run_flops(args)
    if "recompute" in sections:
        results["recompute"] = run_recompute([m for m in ("ovq", "vq") if m in mixers],
                                             [int(x) for x in args.recompute_chunks.split(",")], Ts_mem, args)
    results["machine"]["loadavg_end"] = load_average()
    results["seconds"] = time.time() - t_start

    others = [m for m in mixers if m != "ovq"]
    head_ratio = [f"{m}/ovq" for m in others] if "ovq" in mixers else []
    print()
    print(f"## machine\n\n{info['cpu']}, nproc {info['nproc']}, torch {info['torch']}, {args.threads} threads,"
          f" OMP_WAIT_POLICY {info['omp_wait_policy']},"
          f" device {args.device}; load average {info['loadavg']} at start, {results['machine']['loadavg_end']} at end;"
          f" {results['seconds'] / 60:.1f} min")
    if "prefill" in results:
        print("\n## inference, one call over T tokens (time; ratios = baseline time / OVQ time)\n")
        print(markdown_table(["T"] + mixers + head_ratio, ratio_rows(results["prefill"], Ts, mixers)))
        o = results["prefill"].get("ovq", {})
        if o:
            print("\nOVQ time per token: " + ", ".join(f"{tk(T)} {o[T] / T * 1e6:.1f} us" for T in sorted(o)))
    if "train" in results:
        print("\n## training, forward + backward over T tokens (time; ratios = baseline / OVQ)\n")
        print(markdown_table(["T"] + mixers + head_ratio, ratio_rows(results["train"], Ts_train, mixers)))
    for key, title in (("stream", f"streamed inference in segments of {args.segment} tokens, state carried"),
                       ("train_memory", "forward + backward over T tokens")):
        if key not in results:
            continue
        print(f"\n## peak memory added, MB: {title} (fresh process per point, malloc mode {args.malloc};"
              " state size in brackets)\n")
        rows = []
        for T in sorted({T for m in mixers for T in results[key].get(m, {})}):
            row = [tk(T)]
            for m in mixers:
                r = results[key].get(m, {}).get(T)
                row.append("-" if r is None else f"{fmt_mb(r['peak'])} ({fmt_mb(r['state'])})")
            rows.append(row)
        print(markdown_table(["T"] + mixers, rows))
        if key == "stream":
            rows = []
            for T in sorted({T for m in mixers for T in results[key].get(m, {})}):
                rows.append([tk(T)] + [fmt_time(results[key].get(m, {}).get(T, {}).get("seconds")) for m in mixers])
            print(f"\nstreaming time (same runs; malloc mode {args.malloc}, slower than the default allocator):\n")
            print(markdown_table(["T"] + mixers, rows))
            rows = []
            for m in mixers:
                for T, r in sorted(results[key].get(m, {}).items()):
                    if T == max(results[key][m]) and "last4k_s_per_token" in r:
                        rows.append([m, tk(T), f"{r['first4k_s_per_token'] * 1e6:.1f}", f"{r['last4k_s_per_token'] * 1e6:.1f}",
                                     f"{r['last4k_s_per_token'] / r['first4k_s_per_token']:.2f}"])
            print("\nstreaming, time per token over the first 4k tokens and over the last 4k tokens of the longest run"
                  " (us/token):\n")
            print(markdown_table(["mixer", "T", "first 4k", "last 4k", "last / first"], rows))
    if "slots" in results:
        print(f"\n## OVQ across N (chunk 64, 4 heads x 64): layer over {tk(args.slots_T)} tokens, and per chunk with a"
              " saturated dictionary (n_active = N)\n")
        s = results["slots"]
        n0 = min(s)
        rows = [[str(N), fmt_time(r["layer"]), f"{r['read'] * 1e6:.0f}", f"{r['assign'] * 1e6:.0f}", f"{r['write'] * 1e6:.0f}",
                 f"{r['write_functional'] * 1e6:.0f}", f"{r['absorb'] * 1e6:.0f}", f"{r['write'] / s[n0]['write']:.2f}"]
                for N, r in sorted(s.items())]
        print(markdown_table(["N", "layer", "read us", "assign us", "write us (in place)", "write us (autograd)",
                              "update us (assign + write)", f"write / write at N={n0}"], rows))
    if "flops" in results:
        f = results["flops"]
        print(f"\n## achieved FLOP/s of the OVQ read (N = 1024 saturated, L = 64, 4 heads x 64, {f['lanes']} lane(s))\n")
        print(markdown_table(["read GFLOP/s", "one bmm of the read's shape", "matmul peak (2048^3 sgemm)", "read / peak"],
                             [[f"{f['read_gflops']:.1f}", f"{f['bmm_same_shape_gflops']:.1f}", f"{f['matmul_peak_gflops']:.1f}",
                               f"{f['read_gflops'] / f['matmul_peak_gflops']:.2f}"]]))
    if "recompute" in results:
        for m, c in results["recompute"].items():
            print(f"\n## {m} training with recompute_chunks = S: forward + backward time, peak memory added (MB)\n")
            Ts_c = sorted({T for r in c.values() for T in r})
            print(markdown_table(["T"] + [f"S={S}" for S in c], [[tk(T)] + [
                "-" if T not in c[S] else f"{fmt_time(c[S][T]['seconds'])}, {fmt_mb(c[S][T]['peak'])} MB" for S in c]
                for T in Ts_c]))
    if "prefill" in results or "stream" in results:
        print("\n## targets (OVQ N = 1024, chunk 64, d = 64, 4 heads)\n")
        print(markdown_table(["target", "measured", "goal", "status"],
                             check_targets(results.get("prefill", {}), results.get("stream", {}))))
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    path = plot(results, os.path.join(args.out, "speed_memory.png"))
    print(f"\nresults: {os.path.join(args.out, 'results.json')}" + (f", plot: {path}" if path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
