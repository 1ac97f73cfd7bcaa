"""The studies: one YAML file each under ``experiments/studies/`` (:class:`StudySpec`), read here.

What a study is (its prose, its commands, the JSON files they write, how to compare its runs); running
one is :mod:`experiments.study`, writing RESULTS.md from its records is :mod:`experiments.report`.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from ovq_cl.base import validate

STUDIES_DIR = os.path.join(os.path.dirname(__file__), "studies")


@dataclass
class StudySpec:
    """One study: prose, the commands that make its runs, where they write, and how to compare them."""

    title: str = ""
    order: int = 100
    setup: str = ""
    commands: List[str] = field(default_factory=list)
    results: List[str] = field(default_factory=list)     # JSON files (relative to the project)
    select: Dict[str, List[str]] = field(default_factory=dict)   # keep runs whose param KEY is one of these
    baseline: Optional[str] = None                       # configuration or mixer pattern for paired tests
    more_baselines: List[str] = field(default_factory=list)   # further baselines, one paired table each
    partition: Optional[str] = None                      # param key(s, comma-separated): paired tests within each value
    partition_default: Optional[str] = None              # the partition of runs without that param (None: every one)
    within: Optional[str] = None                         # param key: further paired tables, one per value of it
    within_baseline: Optional[str] = None                # ... each against this configuration pattern (e.g. one
                                                         # mixer's recipes against its standard recipe)
    answer: Optional[str] = None                         # a declared answer rule applied to the records
                                                         # (ANSWER_RULES), per value of ``within``: the
    answer_treatment: Optional[str] = None               # configurations matching this pattern against
                                                         # ``within_baseline`` (training_or_rule)
    answer_seeds: int = 0                                # the declared seeds (pairs) a decision needs
    plot: Optional[str] = None                           # a plot of forgetting and learning against state bytes
    plane: Optional[str] = None                          # a plot of learning score against forgetting, per partition
    frontier: Optional[str] = None                       # a plot of retained against updated facts, one line per
                                                         # mixer over its knob's settings (streams whose facts change)
    meta_curves: Optional[str] = None                    # a plot of meta-training's learning curves, one panel per
                                                         # mixer, one line per configuration, with a plateau table
    budget_rule: Optional[str] = None                    # a numeric param (e.g. meta_train.steps): of configurations
                                                         # that differ only in it, the paired tables read the largest
    budget_rerun: Optional[float] = None                 # the budget the rule reruns a still-improving configuration
                                                         # at (declared with it): the answer waits for those reruns
    code: Dict[str, str] = field(default_factory=dict)   # sweep name (or "*": every sweep) -> "code-HASH@COMMIT": the
    #                                                      code its runs must come from (ovq-cl study refuses other code)
    capacity_pairs: List[List[str]] = field(default_factory=list)   # declared (configuration, baseline) patterns:
    #                                                      paired recall at every capacity point, Holm over them all
    curves: Optional[str] = None                         # a plot of the capacity, interference and position curves,
                                                         # one line per configuration (mean and 95% band over seeds)
    search: Optional[str] = None                         # a layer-choice search's JSON (experiments/searches)
    verdict: Optional[str] = None                        # the stream's name in the verdict table (None: not in it)
    family: Optional[str] = None                         # the stream family its verdict rows are adjusted in (Holm,
                                                         # per family and endpoint); None: its own family
    endpoint: str = "final_average"                      # the declared primary endpoint (before the runs)
    comparable_code: List[str] = field(default_factory=list)   # code versions ("not recorded" for records
                                                         # without one) whose runs may be paired: declared
    comparable_because: str = ""                         # with the evidence (e.g. ovq-cl report --verify)
    confirmatory: bool = False                           # its verdict rows are confirmatory (declared before the
                                                         # runs, 10 seeds); every other row is exploratory
    changed_from: Optional[str] = None                   # another study (its file name) whose verdict rows this
                                                         # study's are read against, mixer by mixer, unpaired
                                                         # (what changed in the verdict; both with a verdict)
    meta_shared_with: Optional[str] = None               # another study (its file name) whose models this study's
                                                         # runs meta-train again or load: a table compares each
                                                         # run's meta-training history with that study's
                                                         # (experiments/meta_agreement.py)
    smoke: List[str] = field(default_factory=list)       # overrides that make every command tiny (--smoke)
    smoke_by_config: Dict[str, List[str]] = field(default_factory=dict)   # more, for the commands of one config file
    findings: str = ""


#: primary endpoints a study may declare: the final average score, against the facts in force where the
#: stream has them (what the memory holds at the end, old facts and new)
ENDPOINTS = ("final_average",)

#: declared answer rules a study may apply to its records (``answer:``): study 17's "update rule or
#: training?" (:mod:`experiments.horizon_answer`), study 11's "one dictionary rule on every stream, or
#: which where?" (:mod:`experiments.rule_answer`)
ANSWER_RULES = ("training_or_rule", "rule_on_every_stream")


def sweep_name(argv: Sequence[str]) -> Optional[str]:
    """The ``--name`` of a command's arguments (``--name X`` or ``--name=X``; None without one)."""
    argv = list(argv)
    for i, a in enumerate(argv):
        if a == "--name" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--name="):
            return a.split("=", 1)[1]
    return None


def load_study(name: str) -> StudySpec:
    path = name if name.endswith(".yaml") else os.path.join(STUDIES_DIR, f"{name}.yaml")
    if not os.path.exists(path):
        known = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(STUDIES_DIR, "*.yaml")))
        raise FileNotFoundError(f"study {name!r} not found; known: {known}")
    spec = validate(StudySpec, OmegaConf.load(path), f"study {name}")
    if spec.endpoint not in ENDPOINTS:
        raise ValueError(f"study {name}: endpoint {spec.endpoint!r} is not one of {list(ENDPOINTS)}")
    if spec.answer is not None:
        if spec.answer not in ANSWER_RULES:
            raise ValueError(f"study {name}: answer {spec.answer!r} is not one of {list(ANSWER_RULES)}")
        if spec.answer == "rule_on_every_stream" and not (spec.baseline and spec.partition and spec.answer_seeds >= 2):
            raise ValueError(f"study {name}: answer {spec.answer!r} needs baseline, partition and answer_seeds >= 2")
        if spec.answer == "training_or_rule" and not (spec.within and spec.within_baseline and spec.answer_treatment):
            raise ValueError(f"study {name}: answer {spec.answer!r} needs within, within_baseline and answer_treatment")
    if spec.budget_rerun is not None and not (spec.budget_rule and spec.budget_rerun > 0):
        raise ValueError(f"study {name}: budget_rerun needs a budget_rule and a positive budget, got {spec.budget_rerun!r}")
    bad_pins = {k: v for k, v in spec.code.items() if not re.fullmatch(r"code-[0-9a-f]{6,64}@[0-9a-f]{7,40}", str(v))}
    if bad_pins:
        raise ValueError(f"study {name}: code pins are sweep name -> 'code-HASH@COMMIT', got {bad_pins}")
    names = {sweep_name(shlex.split(c)) for c in spec.commands}
    stray = sorted(k for k in spec.code if k != "*" and k not in names)
    if stray:
        raise ValueError(f"study {name}: code pins name no sweep of its commands: {stray}")
    if spec.changed_from is not None:
        if not spec.verdict:
            raise ValueError(f"study {name}: changed_from needs verdict rows of its own (verdict:)")
        if not os.path.exists(os.path.join(STUDIES_DIR, f"{spec.changed_from}.yaml")):
            raise ValueError(f"study {name}: changed_from names no study: {spec.changed_from!r} "
                             f"(a file name under {STUDIES_DIR} without .yaml)")
    if spec.meta_shared_with is not None and not os.path.exists(os.path.join(STUDIES_DIR, f"{spec.meta_shared_with}.yaml")):
        raise ValueError(f"study {name}: meta_shared_with names no study: {spec.meta_shared_with!r} "
                         f"(a file name under {STUDIES_DIR} without .yaml)")
    bad_pairs = [pair for pair in spec.capacity_pairs if len(pair) != 2]
    if bad_pairs:
        raise ValueError(f"study {name}: capacity_pairs are [configuration, baseline] patterns, got {bad_pairs}")
    return spec


def all_studies() -> List[StudySpec]:
    specs = [load_study(p) for p in sorted(glob.glob(os.path.join(STUDIES_DIR, "*.yaml")))]
    return sorted(specs, key=lambda s: (s.order, s.title))
