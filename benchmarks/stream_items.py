"""Meta-training item generation of the continuous-key stream, before and after the masked key draw,
measured in one run, interleaved.

    python -m benchmarks.stream_items                          # 8,192 keys, the studies' cicr settings
    python -m benchmarks.stream_items --n-keys 2048 --items 100 --repeats 3

"Before" takes the keys outside a window with ``np.setdiff1d`` over the whole key space (the code before
2026-12-06), "after" with :func:`streams.icr._keys_outside` (a mask). Both draw the same items, which are
compared too: a speed-up that changed the data would change every meta-training set's key and numbers.
The time is what a run spends building its meta-training set's key (every item is drawn once to hash it)
and its batches. Prints ms an item (median over repeats) and the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import yaml

from benchmarks.common import machine_info
from streams import icr, stream_benchmark


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-keys", type=int, default=8192)
    p.add_argument("--items", type=int, default=200, help="items per timed block")
    p.add_argument("--repeats", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)
    with open("experiments/configs/cicr_extrapolation.yaml") as fh:
        options = dict(yaml.safe_load(fh)["stream"]["options"])
    options.update(n_keys=a.n_keys, shift_degrees=90, meta_regions="random",
                   meta_train_episodes=2 * a.items * a.repeats)
    bench = stream_benchmark("cicr", options)
    items = getattr(bench, "meta_train_episodes", bench.meta_train)
    after = icr._keys_outside
    versions = {"before (np.setdiff1d)": lambda n, taken: np.setdiff1d(np.arange(2, 2 + n), taken), "after (mask)": after}
    times = {name: [] for name in versions}
    try:
        for r in range(a.repeats):
            for v, (name, draw) in enumerate(versions.items()):
                icr._keys_outside = draw
                start = (2 * r + v) * a.items
                t = time.perf_counter()
                for i in range(start, start + a.items):
                    items[i]
                times[name].append((time.perf_counter() - t) / a.items * 1e3)
        same = True                     # the two draw the same items (a few of each block)
        for i in range(0, 2 * a.items * a.repeats, a.items // 4 or 1):
            outs = []
            for draw in versions.values():
                icr._keys_outside = draw
                outs.append(items[i][:2])
            same &= all(torch.equal(x, y) for x, y in zip(*outs))
    finally:
        icr._keys_outside = after
    print(machine_info())
    print(f"cicr meta-training items, n_keys={a.n_keys}, {a.items} items x {a.repeats} repeats, interleaved, 1 thread")
    for name, ts in times.items():
        print(f"  {name:22s} {statistics.median(ts):6.2f} ms an item  ({', '.join(f'{t:.2f}' for t in ts)})")
    b, f = (statistics.median(ts) for ts in times.values())
    print(f"  ratio before/after: {b / f:.2f}x; same items: {same}")


if __name__ == "__main__":
    main()
