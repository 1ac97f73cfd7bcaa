"""The PyTorch reference of OVQ before and after the CPU speed-ups, measured in one run.

    python -m benchmarks.reference_before_after                 # before = commit 860564b
    python -m benchmarks.reference_before_after --before <rev> --max-T 16384

"Before" is ``ovq_cl/ops/ovq/naive.py`` as of a git revision (read with ``git show``, loaded as a
separate module); "after" is the working tree. Both run the OVQ layer (d_model 256 = 4 heads x 64,
N = 1024, chunk 64, batch 1) with the same weights and input, interleaved, minimum over repeats:
inference (one call over T tokens, ``torch.inference_mode``) and training (forward + backward).
Outputs of the two versions are compared too (they compute the same function).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile

import torch

from benchmarks.common import D_MODEL, HEADS, fmt_time, load_average, machine_info, markdown_table, time_min

BEFORE = "860564b"


def load_before(rev: str):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = subprocess.run(["git", "show", f"{rev}:ovq_cl/ops/ovq/naive.py"], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "ovq_naive_before.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("ovq_naive_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default=BEFORE, help="git revision of the 'before' reference")
    p.add_argument("--max-T", type=int, default=64 * 1024)
    p.add_argument("--max-T-train", type=int, default=16 * 1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import ovq_cl.layers.ovq as layer_module
    from ovq_cl.layers import build_mixer

    old = load_before(args.before)
    new_op = layer_module.ovq_attention

    def old_op(q, k, v, beta, params, initial_state=None, backend="auto"):
        return old.ovq_attention_chunked(q, k, v, beta, old.OVQParams(**{f.name: getattr(params, f.name) for f in dataclasses.fields(old.OVQParams)}), initial_state)

    torch.manual_seed(0)
    model = build_mixer("ovq", D_MODEL, HEADS, {"num_slots": 1024, "chunk_size": 64})
    info = machine_info()
    print(f"# {info['cpu']}, nproc {info['nproc']}, torch {info['torch']}, threads {torch.get_num_threads()},"
          f" load average {info['loadavg']}", flush=True)
    Ts = [T for T in (4096, 16384, 65536) if T <= args.max_T]
    x_all = torch.randn(1, max(Ts), D_MODEL)
    rows = []
    for mode in ("inference", "training"):
        for T in Ts:
            if mode == "training" and T > args.max_T_train:
                continue
            x = x_all[:, :T]
            times, outs = {}, {}
            for name, op in (("before", old_op), ("after", new_op)):
                layer_module.ovq_attention = op
                if mode == "inference":
                    model.eval()
                    with torch.inference_mode():
                        outs[name] = model(x)[0]
                        times[name] = time_min(lambda: model(x), repeats=args.repeats, max_seconds=120)
                else:
                    model.train()

                    def step():
                        model.zero_grad(set_to_none=True)
                        y, _ = model(x)
                        y.square().mean().backward()
                        return y

                    outs[name] = step().detach()
                    times[name] = time_min(step, repeats=args.repeats, max_seconds=120)
            layer_module.ovq_attention = new_op
            diff = float((outs["after"] - outs["before"]).abs().max() / outs["before"].abs().max())
            rows.append([mode, f"{T // 1024}k", fmt_time(times["before"]), fmt_time(times["after"]),
                         f"{times['before'] / times['after']:.2f}x", f"{times['after'] / T * 1e6:.1f}", f"{diff:.1e}"])
            print(f"  {mode} T={T}: before {fmt_time(times['before'])}, after {fmt_time(times['after'])}", flush=True)
    print(f"\n## OVQ layer, PyTorch reference before ({args.before}) and after (N = 1024, chunk 64, 4 heads x 64,"
          f" {torch.get_num_threads()} threads; load average {load_average()} at the end)\n")
    print(markdown_table(["mode", "T", "before", "after", "speed-up", "after, us/token", "max rel. diff of outputs"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
