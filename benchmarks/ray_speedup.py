"""A sweep on Ray against the same sweep run serially: wall time and speed-up, same trials, same machine.

    python -m benchmarks.ray_speedup [--trials 4] [--config experiments/configs/icr_frozen.yaml]
                                     [--out outputs/benchmarks/ray] [override ...]

Runs ``ovq-cl sweep CONFIG --grid seed=0;..;n-1`` twice in fresh stores under --out: ``--backend
serial``, then ``--backend ray --trial-cpus 1`` (a local Ray with one worker per core), both with one
torch thread per trial, and prints both wall times (Ray's includes starting and stopping Ray) and the
speed-up, and checks that the two sweeps' result matrices are equal. Default overrides make each
trial ~0.5-1 minute on one core (fewer meta-training steps); run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

DEFAULT_OVERRIDES = ["meta_train.steps=150", "stream.options.train_episodes=32", "stream.options.test_episodes=8"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--config", default="experiments/configs/icr_frozen.yaml")
    p.add_argument("--out", default="outputs/benchmarks/ray")
    p.add_argument("overrides", nargs="*", default=None)
    args = p.parse_args(argv)
    overrides = DEFAULT_OVERRIDES if args.overrides is None or not args.overrides else args.overrides
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    grid = "seed=" + ";".join(str(s) for s in range(args.trials))
    walls, matrices = {}, {}
    for backend in ("serial", "ray"):
        root = os.path.abspath(os.path.join(args.out, backend))
        cmd = [sys.executable, "-m", "experiments.cli", "sweep", args.config, *overrides,
               f"tracking.tracking_uri=sqlite:///{root}.db", f"checkpoint.dir={root}/ckpt", "checkpoint.share_meta=false",
               "--grid", grid, "--name", backend, "--out", root, "--backend", backend, "--quiet"]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        walls[backend] = time.perf_counter() - t0
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-3000:])
            return done.returncode
        matrices[backend] = [r["R"] for r in json.load(open(os.path.join(root, f"{backend}.json")))]
        print(f"{backend:6s}: {walls[backend]:.1f} s for {args.trials} trials", flush=True)
    print(f"speed-up of Ray over serial: {walls['serial'] / walls['ray']:.2f}x "
          f"(cores {os.cpu_count()}; the same R matrices: {matrices['serial'] == matrices['ray']})")
    with open(os.path.join(args.out, "ray_speedup.json"), "w") as fh:
        json.dump({"walls": walls, "trials": args.trials, "overrides": overrides, "same_R": matrices["serial"] == matrices["ray"]}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
