"""The studies: one folder each under ``experiments/studies/`` (its ``study.yaml``, :class:`StudySpec`, and,
where it needs one, its own ``analysis.py`` of section renderers), read here.

What a study is (its prose, its commands, the JSON files they write, how to compare its runs); running
one is :mod:`experiments.study`, writing RESULTS.md from its records is :mod:`experiments.report`.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from ovq_cl.base import validate

STUDIES_DIR = os.path.join(os.path.dirname(__file__), "studies")


@dataclass
class StudySpec:
    """One study: prose, the commands that make its runs, where they write, and how to compare them.

    Only what more than one study uses is a field; what one study needs is an option of a section
    renderer its spec lists under ``sections:`` (:mod:`experiments.sections`, or its folder's
    ``analysis.py``)."""

    title: str = ""
    reading: str = ""                                    # one sentence: what it found (RESULTS.md's index), from findings
    order: int = 100
    setup: str = ""
    commands: List[str] = field(default_factory=list)
    results: List[str] = field(default_factory=list)     # JSON files (relative to the project)
    select: Dict[str, List[str]] = field(default_factory=dict)   # keep runs whose param KEY is one of these
    #                                                      (as a claim's ``select``: a study reading part of a file)
    baseline: Optional[str] = None                       # configuration or mixer pattern for paired tests
    more_baselines: List[str] = field(default_factory=list)   # further baselines, one paired table each
    partition: Optional[str] = None                      # param key(s, comma-separated): paired tests within each value
    partition_default: Optional[str] = None              # the partition of runs without that param (None: every one)
    plane: Optional[str] = None                          # a plot of learning score against forgetting, per partition
    frontier: Optional[str] = None                       # a plot of retained against updated facts, one line per
    #                                                      mixer over its knob's settings (streams whose facts change)
    meta_curves: Optional[str] = None                    # a plot of meta-training's learning curves, one panel per
    #                                                      mixer, one line per configuration, with a plateau table
    code: Dict[str, str] = field(default_factory=dict)   # sweep name (or "*": every sweep) -> "code-HASH@COMMIT": the
    #                                                      code its runs must come from (ovq-cl study refuses other code)
    capacity_pairs: List[List[str]] = field(default_factory=list)   # declared (configuration, baseline) patterns:
    #                                                      paired recall at every capacity point, Holm over them all
    curves: Optional[str] = None                         # a plot of the capacity, interference and position curves,
    #                                                      one line per configuration (mean and 95% band over seeds)
    verdict: Optional[str] = None                        # the stream's name in the verdict table (None: not in it)
    family: Optional[str] = None                         # the stream family its verdict rows are adjusted in (Holm,
    #                                                      per family and endpoint); None: its own family
    endpoint: str = "final_average"                      # the declared primary endpoint (before the runs)
    confirmatory: bool = False                           # its verdict rows are confirmatory (declared before the
    #                                                      runs, 10 seeds); every other row is exploratory
    smoke: List[str] = field(default_factory=list)       # overrides that make every command tiny (--smoke)
    smoke_by_config: Dict[str, List[str]] = field(default_factory=dict)   # more, for the commands of one config file
    sections: Optional[List[Any]] = None                 # the section's renderers in order, each a name or
    #                                                      {name: {option: value}}; None: sections.DEFAULT_SECTIONS
    findings: str = ""
    folder: str = ""                                     # set when loaded: the study's folder (not written in YAML)

    @property
    def name(self) -> str:
        """The study's name: its folder's."""
        return os.path.basename(self.folder)


#: primary endpoints a study may declare: the final average score, against the facts in force where the
#: stream has them (what the memory holds at the end, old facts and new)
ENDPOINTS = ("final_average",)

#: a study's spec inside its folder, and the module of its own renderers beside it (optional)
SPEC_FILE, ANALYSIS_FILE = "study.yaml", "analysis.py"


def sweep_name(argv: Sequence[str]) -> Optional[str]:
    """The ``--name`` of a command's arguments (``--name X`` or ``--name=X``; None without one)."""
    argv = list(argv)
    for i, a in enumerate(argv):
        if a == "--name" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--name="):
            return a.split("=", 1)[1]
    return None


def study_folder(name: str) -> str:
    """The folder of the study ``name`` under :data:`STUDIES_DIR` (its spec is ``study.yaml`` there)."""
    return os.path.join(STUDIES_DIR, name)


def study_names() -> List[str]:
    """Every study's name (its folder's), sorted."""
    return sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(STUDIES_DIR, "*", SPEC_FILE)))


def load_study(name: str) -> StudySpec:
    """A study by name (its folder under :data:`STUDIES_DIR`), or by the path of a spec file (its folder is
    the file's); every mistake (an unknown key, a bad pin, a section renderer that does not exist or an
    option it does not take) raises one ValueError naming it, before anything runs."""
    path = name if name.endswith(".yaml") else os.path.join(study_folder(name), SPEC_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"study {name!r} not found; known: {study_names()}")
    spec = validate(StudySpec, OmegaConf.load(path), f"study {name}")
    spec.folder = os.path.dirname(os.path.abspath(path))
    if spec.endpoint not in ENDPOINTS:
        raise ValueError(f"study {name}: endpoint {spec.endpoint!r} is not one of {list(ENDPOINTS)}")
    bad_pins = {k: v for k, v in spec.code.items() if not re.fullmatch(r"code-[0-9a-f]{6,64}@[0-9a-f]{7,40}", str(v))}
    if bad_pins:
        raise ValueError(f"study {name}: code pins are sweep name -> 'code-HASH@COMMIT', got {bad_pins}")
    names = {sweep_name(shlex.split(c)) for c in spec.commands}
    stray = sorted(k for k in spec.code if k != "*" and k not in names)
    if stray:
        raise ValueError(f"study {name}: code pins name no sweep of its commands: {stray}")
    bad_pairs = [pair for pair in spec.capacity_pairs if len(pair) != 2]
    if bad_pairs:
        raise ValueError(f"study {name}: capacity_pairs are [configuration, baseline] patterns, got {bad_pairs}")
    from experiments.sections import study_sections

    study_sections(spec)           # every renderer found and its options taken, or one line saying which not
    return spec


def all_studies() -> List[StudySpec]:
    specs = [load_study(n) for n in study_names()]
    return sorted(specs, key=lambda s: (s.order, s.title))
