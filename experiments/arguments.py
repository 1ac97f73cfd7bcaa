"""The ``ovq-cl`` command line's arguments: the parser (:func:`build_parser`) and how overrides are
collected (:func:`parse_args`). Its own module so that what reads a study's commands
(:mod:`experiments.study`) parses them as the CLI does without importing the CLI.
"""
from __future__ import annotations

import argparse
from typing import List, Optional


#: what ``ovq-cl --help`` says first
DESCRIPTION = """Command line: ovq-cl demo | run | sweep | compare | merge | migrate | pieces | study | report | state-sizes.

--plugin MODULE (run, sweep, compare, state-sizes, demo; repeatable) imports a module of yours first, so the
mixers, streams, strategies and metrics it registers can be named in configs; packages can instead
declare entry points (ovq_cl.mixers, ovq_cl.streams, ovq_cl.strategies, ovq_cl.metrics).
"""


LENGTHS_DEFAULT = "1024,16384"


def build_parser() -> argparse.ArgumentParser:
    """The ``ovq-cl`` command line (also used to read a study's commands)."""
    parser = argparse.ArgumentParser(prog="ovq-cl", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    plugin = argparse.ArgumentParser(add_help=False)
    plugin.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import this module first (it registers your mixers, streams, strategies, metrics)")
    plugin.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    demo = sub.add_parser("demo", parents=[plugin], help="train the small LM with each mixer on a toy recall task")
    demo.add_argument("--mixers", default=None, help="comma-separated mixer names (default: all demo mixers)")
    demo.add_argument("--steps", type=int, default=None)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--state-budget", default=None,
                      help="bytes of state per layer and lane every mixer is sized to (default 16960; 'none': "
                           "each mixer's own options)")
    demo.add_argument("--no-progress", action="store_true")
    run_p = sub.add_parser("run", parents=[plugin], help="one run: meta-training, then the stream, tracked in MLflow")
    run_p.add_argument("config", help="a YAML run config (see experiments/configs/)")
    run_p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.layers=[ovq] seed=1")
    run_p.add_argument("--rerun", action="store_true",
                       help="run again even if this config, with this code, already finished (default: reuse it)")
    run_p.add_argument("--quiet", action="store_true", help="no progress bars and messages, only the result")
    sweep_p = sub.add_parser("sweep", parents=[plugin], help="a grid of runs under one parent MLflow run, then a comparison table")
    sweep_p.add_argument("config", help="the base YAML run config")
    sweep_p.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    sweep_p.add_argument("--grid", action="append", default=[],
                         help="KEY=V1;V2;... (repeatable), e.g. --grid 'model.layers=[ovq];[full]' --grid 'seed=0;1;2'; keys that change together: --grid 'a&b=1&32;8&4'")
    sweep_p.add_argument("--name", default="sweep", help="name of the parent MLflow run")
    sweep_p.add_argument("--out", default="outputs/sweeps", help="folder for the table and the plot")
    sweep_p.add_argument("--rerun", action="store_true", help="run again the configs that already finished")
    sweep_p.add_argument("--backend", choices=("serial", "ray"), default="serial",
                         help="serial: one run after the other (default); ray: parallel Ray tasks (pip install 'ovq-cl[ray]')")
    sweep_p.add_argument("--ray-address", default=None,
                         help="an existing Ray cluster (e.g. auto, ray://head:10001); default: a local Ray started for the sweep")
    sweep_p.add_argument("--trial-cpus", type=float, default=1, help="CPUs per trial with --backend ray (torch threads)")
    sweep_p.add_argument("--trial-gpus", type=float, default=0, help="GPUs per trial with --backend ray")
    sweep_p.add_argument("--quiet", action="store_true", help="no progress bars and messages, only the table")
    cmp_p = sub.add_parser("compare", parents=[plugin], help="95%% intervals over seeds, and paired tests against a baseline, of "
                                           "finished runs (an MLflow experiment, or sweep JSON files)")
    cmp_p.add_argument("json", nargs="*", help="sweep JSON files (ovq-cl sweep --out); default: the MLflow experiment")
    cmp_p.add_argument("--baseline", default=None,
                       help="a configuration (its row name) or mixer pattern (e.g. ovq, swa+ovq) to pair every other with")
    cmp_p.add_argument("--experiment", default="ovq-cl")
    cmp_p.add_argument("--tracking-uri", default=None)
    cmp_p.add_argument("--filter", default="", help="an MLflow search filter, e.g. \"params.strategy.name = 'frozen'\"")
    cmp_p.add_argument("--sweep", default=None, metavar="NAME",
                       help="only the runs of the sweep of this name in the experiment (its latest parent run)")
    cmp_p.add_argument("--plot", default=None, metavar="PNG",
                       help="also draw the forgetting curves (mean and 95%% CI over seeds per configuration) to this file")
    merge_p = sub.add_parser("merge", help="merge sweep JSON files into one (each run once: its config_id and code "
                                           "version), e.g. a sweep finished in pieces back into the file its study lists")
    merge_p.add_argument("out", help="the JSON file to write (its own records are kept, first)")
    merge_p.add_argument("json", nargs="+", help="sweep JSON files (ovq-cl sweep --out) to add")
    migrate_p = sub.add_parser("migrate", help="rewrite sweep JSON files in the current record schema "
                                               "(experiments.records; reading migrates too: this makes it once)")
    migrate_p.add_argument("json", nargs="+", help="sweep JSON files (ovq-cl sweep --out)")
    pieces_p = sub.add_parser("pieces", help="a study's runs that its results lack, one sweep command each "
                                             "(COMMIT<TAB>...<TAB>command; '-' unpinned): what study --backend ray runs")
    pieces_p.add_argument("name", help="the study's name (its folder under experiments/studies/)")
    pieces_p.add_argument("--order", choices=("sweep", "seed-outer"), default="sweep",
                          help="sweep: each sweep's grid order; seed-outer: the seed axes vary slowest (pairs complete early)")
    pieces_p.add_argument("--all", action="store_true", help="every run, also those the results hold")
    pieces_p.add_argument("--check", default=None, metavar="DIR",
                          help="print nothing: run one piece of each configuration on tiny sizes (as study --smoke), "
                               "from its pinned checkout, everything written under DIR; exit 1 if any fails")
    study_p = sub.add_parser("study", help="run a study of experiments/studies/ (its sweeps), then rewrite RESULTS.md")
    study_p.add_argument("name", help="the study's name (its folder under experiments/studies/)")
    study_p.add_argument("--smoke", default=None, metavar="DIR",
                         help="every command on tiny sizes (first grid value, a few steps), everything written under "
                              "DIR (its own RESULTS.md): checks the study runs end to end, not its numbers")
    study_p.add_argument("--backend", choices=("serial", "ray"), default="serial",
                         help="serial: its commands one after the other in this process; ray: every run its files "
                              "do not hold yet (ovq-cl pieces), --lanes at a time, each from its pinned checkout, "
                              "merged as it ends (run it again after a kill: it goes on)")
    study_p.add_argument("--lanes", type=int, default=2, help="with --backend ray: runs at once (one CPU, one thread each)")
    study_p.add_argument("--ray-address", default=None, help="with --backend ray: a running cluster (as ovq-cl sweep's)")
    study_p.add_argument("--until", default=None, metavar="HH:MM|+MIN",
                         help="with --backend ray: start only runs expected to end by then (a session's end; the "
                              "estimate is the longest finished run of its configuration, ovq-cl pieces)")
    study_p.add_argument("--skip-pinned", action="store_true",
                         help="serial: skip the sweeps the study pins to other code (its 'code:'), run the others")
    report_p = sub.add_parser("report", help="rewrite RESULTS.md from the studies' result JSON (no runs)")
    report_p.add_argument("--out", default=None, help="where to write (default: RESULTS.md of the project)")
    report_p.add_argument("--verify", action="store_true",
                          help="first run one seed of every configuration behind the verdict and claims tables "
                               "again, cheapest first, and compare its R with the stored one bit for bit: each is "
                               "verified, unverified (and why: no code version recorded, made by other code, "
                               "another CPU, not expressible, not rerun) or DIFFERS (made by today's code, and "
                               "not reproduced); kept in results/verification.json; RESULTS.md is written unless "
                               "one DIFFERS (exit 1)")
    report_p.add_argument("--verify-only", default="", metavar="TEXT",
                          help="with --verify: only configurations whose run or configuration label contains TEXT")
    report_p.add_argument("--verify-limit", type=int, default=None, metavar="N",
                          help="with --verify: rerun at most N configurations (the cheapest); the others are "
                               "reported 'not rerun (beyond --verify-limit)'")
    sizes = sub.add_parser("state-sizes", parents=[plugin], help="print every mixer's state bytes per layer and lane against T")
    sizes.add_argument("--lengths", default=LENGTHS_DEFAULT, help="comma-separated sequence lengths")
    sizes.add_argument("--d-model", type=int, default=256)
    sizes.add_argument("--heads", type=int, default=4)
    sizes.add_argument("--budget", type=int, default=None,
                       help="bytes per layer and lane: size every mixer to it and show the sizing and parameters")
    sizes.add_argument("--option", action="append", default=[], metavar="MIXER.OPTION=VALUE",
                       help="a mixer option other than its default, before sizing (repeatable), e.g. vq.chunk_size=8")
    sizes.add_argument("--as-demo", action="store_true",
                       help="the demo's d_model, heads, budget, mixer options and T (what `ovq-cl demo` sizes)")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Optional[List[str]] = None) -> argparse.Namespace:
    """``argv`` read by ``parser``, key=value overrides collected wherever they stand."""
    # key=value overrides may come before, between or after options (argparse alone would refuse
    # `run CFG --plugin M key=value`): whatever argparse leaves over and looks like one is an override
    args, rest = parser.parse_known_args(argv)
    if rest:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in rest):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.overrides = list(args.overrides) + rest
    return args
