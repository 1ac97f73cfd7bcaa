"""A small documented search for two baseline layer choices, on the demo's associative recall.

    python -m experiments.searches.baseline_choices [--seeds 3] [--steps 300] --out results/baseline_choices.json

Each candidate trains the demo's model (2 layers, d_model 64, 4 heads: head dim 16) for ``--steps``
steps on multi-query associative recall and reports recall on 512 held-out episodes, for several
seeds. Candidates: Gated DeltaNet with and without its output gate (``output_gate``), linear attention
with the 1/sqrt(d) scale inside the feature map or none (``query_scale``). The defaults of the layers
follow the better mean recall; the JSON and the printed table are the record.
"""
from __future__ import annotations

import argparse
import json
import statistics

from experiments.demo import DemoConfig, train_one

CANDIDATES = {
    "delta": [{"output_gate": True}, {"output_gate": False}],
    "linear": [{"query_scale": "inside"}, {"query_scale": "none"}],
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = []
    for mixer, candidates in CANDIDATES.items():
        for options in candidates:
            accs = []
            for seed in range(args.seeds):
                cfg = DemoConfig(seed=seed, steps=args.steps, mixers=[mixer])
                cfg.mixer_options = {**cfg.mixer_options, mixer: {**cfg.mixer_options.get(mixer, {}), **options}}
                accs.append(train_one(mixer, cfg, progress=False).accuracy)
            rows.append({"mixer": mixer, "options": options, "steps": args.steps, "recall": accs,
                         "mean": statistics.fmean(accs)})
            print(f"{mixer:>7} {json.dumps(options):<28} recall {statistics.fmean(accs):.3f}  "
                  f"(seeds: {', '.join(f'{a:.3f}' for a in accs)})", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
