"""A small documented search for the baselines' layer choices, on the demo's associative recall.

    python -m experiments.studies.baseline_choices.search [--seeds 3] [--steps 600] --out results/baseline_choices.json

Each candidate trains the demo's model at the study scale (2 layers, d_model 64, 4 heads of head dim
16: the narrowest heads the studies use, where the choices matter most) for ``--steps`` steps on
multi-query associative recall and reports recall on 512 held-out episodes, for several seeds.
Candidates are the design choices of each dense-state baseline as their authors run them and as we
first ran them: linear attention's feature map (elu+1, Based's 2nd-order Taylor), the 1/sqrt(d) scale
inside the feature map, an output norm and a short causal convolution (fla's kernel 4); Gated
DeltaNet's output gate (fla's layer) and the short convolution; DeltaNet (no decay) with and without
the convolution; the SSM's output gate (Mamba-2's) and the convolution; for the decaying mixers, decays
initialised slower (``dt_max`` 0.01 instead of Mamba's 0.1). A layer's defaults follow the candidate with
the best mean recall; the JSON and the printed table are the record. With ``--out`` an existing file's
rows (same mixer, options, steps and seeds) are kept, not rerun: a search extended by new candidates
runs only those.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Dict, List

from experiments.demo import DemoConfig, train_one

# The layers' settings before the search, pinned so that a candidate means the same change whatever the
# defaults are now (they follow this search's results).
BEFORE: Dict[str, dict] = {
    "linear": {"feature_map": "elu1", "query_scale": "none", "output_norm": False, "short_conv": 0},
    "delta": {"output_gate": False, "dt_max": 0.1, "short_conv": 0, "output_norm": True},
    "deltanet": {"short_conv": 0, "output_norm": True},
    "ssm": {"output_gate": False, "dt_max": 0.1, "short_conv": 0, "output_norm": True},
}

CANDIDATES: Dict[str, List[dict]] = {
    "linear": [
        {"query_scale": "inside"}, {}, {"short_conv": 4}, {"output_norm": True},
        {"feature_map": "taylor"}, {"feature_map": "taylor", "short_conv": 4}, {"feature_map": "taylor", "output_norm": True},
    ],
    "delta": [{"output_gate": True}, {}, {"short_conv": 4}, {"output_gate": True, "short_conv": 4},
              {"dt_max": 0.01}],
    "deltanet": [{}, {"short_conv": 4}],
    "ssm": [{"output_gate": True}, {}, {"short_conv": 4}, {"dt_max": 0.01}, {"short_conv": 4, "dt_max": 0.01}],
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--mixers", default=",".join(CANDIDATES), help="comma-separated subset of " + ",".join(CANDIDATES))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    done = []
    if args.out and os.path.exists(args.out):
        with open(args.out) as fh:
            done = json.load(fh)
    rows = []
    for mixer in args.mixers.split(","):
        for options in CANDIDATES[mixer]:
            kept = [r for r in done if (r["mixer"], r["options"], r["steps"], len(r["recall"])) ==
                    (mixer, options, args.steps, args.seeds)]
            if kept:
                rows.append(kept[0])
                continue
            accs = []
            for seed in range(args.seeds):
                cfg = DemoConfig(seed=seed, steps=args.steps, mixers=[mixer], state_budget=None)   # head dim 16
                base = cfg.mixer_options.get(mixer, {})
                cfg.mixer_options = {**cfg.mixer_options, mixer: {**base, **BEFORE[mixer], **options}}
                accs.append(train_one(mixer, cfg, progress=False).accuracy)
            rows.append({"mixer": mixer, "options": options, "steps": args.steps, "recall": accs,
                         "mean": statistics.fmean(accs), "min": min(accs)})
            print(f"{mixer:>8} {json.dumps(options):<52} recall {statistics.fmean(accs):.3f}  "
                  f"(seeds: {', '.join(f'{a:.3f}' for a in accs)})", flush=True)
            if args.out:                                   # written as it goes: a long search can be read early
                with open(args.out, "w") as fh:
                    json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
