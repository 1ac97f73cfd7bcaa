"""Comparisons across runs: intervals over seeds, paired tests between configurations, never a single run.

A *configuration* is everything in a run's config except its seeds (``experiments.config.SEED_KEYS``:
the model seed ``seed`` and the data seeds ``stream.options.seed`` / ``meta_seed``); its runs over
seeds are replicates. Every row shows mean ± std [95% CI] (n) over replicates, the metric's name,
state bytes per layer and lane, and parameters.

Runs that did not learn (``strategies.evaluation.gate``: held-out skill or the stream's learning score below
threshold) have no forgetting: their forgetting and BWT cells say ``not learned`` and are left out of
the interval, never shown as small numbers beside real ones.

Runs come from three sources, all turned into :class:`RunRecord`: a sweep's RunResults, the JSON a
sweep writes (``ovq-cl sweep ... --out``), or the runs of an MLflow experiment (``ovq-cl compare``).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from experiments.config import SEED_KEYS, GateSection
from experiments.records import check_derived, migrate
from experiments.stats.intervals import mean_interval, paired_comparison
from experiments.stats import reading
from experiments.stats.learning import late_learning, stopped_summary
from experiments.stats.pairing import latest_per_replicate, pairs_against, pairs_in_one_version
from experiments.stats.power import detectable_difference, paired_sd
from strategies.evaluation import forgetting

SCORES = ("final_average", "learning_average")
FORGETTING = ("forgetting_max", "forgetting_learned", "bwt")
COLUMNS = SCORES + FORGETTING
CURRENT_COLUMNS = ("final_average", "forgetting_max", "forgetting_learned", "updated_fraction", "stale_fraction",
                   "retained_fraction")
IGNORED_PREFIXES = ("tracking.", "checkpoint.", "output_dir", "progress")
# settings that change no measured number, only how the stored gates are combined (which a report
# recomputes with the current rule, :func:`learned_from_gates`): runs differing only here are one config
REPORTING_KEYS = ("gate.delay",)
# params that newer code logs with a value meaning "absent" (runs logged before the key existed lack
# it): such a value is dropped, so that old and new runs of one config stay one config (as in
# RunConfig.identity, which drops an empty after_meta)
ABSENT_VALUES = {"after_meta.model": "{}", "gate.interference": "[]", "gate.capacity_facts": "[]",
                 "meta_train.retention_loss": "0.0", "gate.position_length": "0"}


def _params(p: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in p.items() if ABSENT_VALUES.get(k, object()) != v}


@dataclass
class RunRecord:
    """What a comparison needs of one run."""

    label: str
    params: Dict[str, str]
    metric: str
    summary: Dict[str, float]
    summary_current: Dict[str, float] = field(default_factory=dict)
    learned: Optional[bool] = None            # both gates (None: not measured)
    gate_skill: float = math.nan              # held-out skill against chance
    gate_chance: float = math.nan             # ... and its chance score (the context-free predictor's)
    gate_score: float = math.nan              # ... and its score there (the metric itself)
    stream_skill: float = math.nan            # skill of the mean learning score on the stream
    state_bytes: List[float] = field(default_factory=list)   # per layer and lane
    parameters: int = 0
    seed: Optional[int] = None
    data_seed: Optional[int] = None
    R: Optional[List[List[Optional[float]]]] = None
    tokens_after: Optional[List[int]] = None
    probes: Dict[str, Dict[str, Any]] = field(default_factory=dict)   # each probe's record (experiments.probes)
    config_id: Optional[str] = None           # the run identity: config (seeds included) ...
    code_version: Optional[str] = None        # ... and the code that ran it
    finished_at: float = 0.0                  # when it ended (MLflow), or its place in a JSON list: the latest wins
    shared_bytes: List[float] = field(default_factory=list)   # per layer: memory about the data shared by all lanes
    learned_buffers: int = 0                  # numbers in buffers learned from data (VQ's codebook, its EMA stats)
    stream_chance: float = math.nan           # the stream gate's chance score and skill threshold, which the
    stream_threshold: float = math.nan        # per-experience learning gate applies to each R[j][j]
    stream_chances: List[float] = field(default_factory=list)   # per experience (stored; [] when not)
    meta_history: List[Dict[str, float]] = field(default_factory=list)   # meta-training's logged rows (step, loss, metric)

    def probe(self, name: str) -> Dict[str, Any]:
        """The record of probe ``name`` ({} when the run did not measure it)."""
        return self.probes.get(name) or {}

    @property
    def replicate(self) -> Tuple:
        """What pairs two runs of different configurations: the model seed and the data seed."""
        return (self.seed, self.data_seed)


def stream_gate_now(d: Dict[str, Any]) -> Tuple[List[float], Optional[bool], float]:
    """(per-experience chances, learned, skill) of a record's stream gate by the current rule: each R[j][j]
    against experience j's own chance (``stream_gate.chances``;
    ``strategies.evaluation.gate.stream_gate_from_chances``). Without them the stored gate stands."""
    from strategies.evaluation.gate import stream_gate_from_chances

    stream, R = d.get("stream_gate") or {}, d.get("R")
    chances = [float(c) for c in stream.get("chances") or []]
    threshold = _num(stream.get("threshold"))
    if not chances or not R or len(chances) != len(R) or math.isnan(threshold):
        return chances, stream.get("learned"), _num(stream.get("skill"))
    gate = stream_gate_from_chances([R[j][j] for j in range(len(R))], chances, d["metric"], threshold)
    return chances, gate.learned, gate.skill


def learned_from_gates(d: Dict[str, Any], stream_learned: Any = "stored") -> Optional[bool]:
    """The combined gate of a run record, by the current rule (``experiments.runner``): the held-out gate
    and the stream gate, and the delay gate only where the run's config asked for it as a gate
    (``gate.delay: experience``). Records written under an earlier rule (e.g. ``gate.delay: auto``,
    which gated frozen runs on the delay curve) are combined the same way from the gates they stored.
    Records without stored gates keep their own ``learned``."""
    d = migrate(d)
    gate, stream = d.get("gate") or {}, d.get("stream_gate") or {}
    if "learned" not in gate and "learned" not in stream:
        return d.get("learned")
    delay = ((d.get("probes") or {}).get("delay") or {}).get("gate", {}).get("learned")
    flags = [gate.get("learned"), stream.get("learned") if stream_learned == "stored" else stream_learned]
    if (d.get("params") or {}).get("gate.delay") == "experience":
        flags.append(delay)
    measured = [f for f in flags if f is not None]
    return all(measured) if measured else None


def record_from_json(d: Dict[str, Any]) -> RunRecord:
    """A record from ``RunResult.record()`` (the sweep's JSON, MLflow's ``results.json``). Its gates are
    combined by the current rule, the stream gate with per-experience chances (:func:`stream_gate_now`).
    Any schema version (:func:`experiments.records.migrate`)."""
    d = migrate(d)
    check_derived(d)
    chances, stream_learned, stream_skill = stream_gate_now(d)
    return RunRecord(
        label=d["label"], params=_params(d["params"]), metric=d["metric"], summary=dict(d["summary"]),
        summary_current=dict(d.get("summary_current") or {}), learned=learned_from_gates(d, stream_learned),
        gate_skill=_num((d.get("gate") or {}).get("skill")),
        gate_chance=_num((d.get("gate") or {}).get("chance")), gate_score=_num((d.get("gate") or {}).get("score")),
        stream_skill=stream_skill,
        state_bytes=list(d.get("state_bytes_per_layer_lane") or []), parameters=int(d.get("parameters") or 0),
        seed=d.get("seed"), data_seed=d.get("data_seed"), R=d.get("R"), tokens_after=d.get("tokens_after"),
        probes={name: dict(p) for name, p in (d.get("probes") or {}).items() if p},
        config_id=d.get("config_id"), code_version=d.get("code_version"),
        shared_bytes=list(d["shared_bytes_per_layer"]), learned_buffers=int(d["learned_buffers"]),
        stream_chance=_num((d.get("stream_gate") or {}).get("chance")),
        stream_threshold=_num((d.get("stream_gate") or {}).get("threshold")), stream_chances=chances,
        meta_history=list(d.get("meta_history") or []),
    )


def record_from_result(result) -> RunRecord:
    return record_from_json(result.record())


def result_matrix_from_history(history: Dict[str, Dict[int, float]]) -> Optional[List[List[Optional[float]]]]:
    """R from a run's logged metric histories: R[j][i] is ``R/eval_i`` at step j (logged after experience
    j), None where nothing was logged (an unmeasured cell); None when the run logged no row."""
    steps = history.get("stream/learning_score") or {}
    evals = sorted((k for k in history if k.startswith("R/eval_")), key=lambda k: int(k[len("R/eval_"):]))
    if not steps or not evals:
        return None
    rows = max(steps) + 1
    return [[history[k].get(j) for k in evals] for j in range(rows)]


def history_keys(metrics: Dict[str, float]) -> List[str]:
    """The metrics whose per-step values :func:`record_from_mlflow` reads: R's cells and the tokens."""
    return sorted(k for k in metrics if k.startswith("R/eval_")) + ["stream/learning_score", "stream/tokens_per_lane"]


def _label_of(run_name: str, config_id: Optional[str]) -> str:
    """The run's label (as its JSON record has it) from its MLflow name, which ends in ``-`` and the config
    id's first six characters (``experiments.runner._tracker``)."""
    suffix = f"-{config_id[:6]}" if config_id else None
    return run_name[:-len(suffix)] if suffix and run_name.endswith(suffix) else run_name


def record_from_mlflow(row: Dict[str, Any], history: Optional[Dict[str, Dict[int, float]]] = None) -> RunRecord:
    """A record from :func:`experiments.tracking.runs_table`'s row (latest metric values, params, tags)
    and, where given, the run's metric histories (:func:`history_keys`): R and the tokens after each
    experience, and each experience's chance (logged one by one since 2026-12-07), so that the
    per-experience learning gate reads the same from MLflow as from the sweep's JSON (a run that did not
    log them keeps the stream gate it stored)."""
    m, p, tags = row["metrics"], row["params"], row["tags"]
    R = tokens_after = None
    chances: List[float] = []
    if history is not None:
        R = result_matrix_from_history(history)
        tokens = history.get("stream/tokens_per_lane") or {}
        tokens_after = [int(tokens[j]) for j in range(len(R))] if R and all(j in tokens for j in range(len(R))) else None
    if R:
        logged = [m.get(f"stream_gate/chance/exp_{j}") for j in range(len(R))]
        chances = [float(c) for c in logged] if all(c is not None for c in logged) else []
    flag = {"true": True, "false": False}.get(tags.get("learned_overall", ""), None)
    return RunRecord(
        label=_label_of(row.get("run_name", ""), tags.get("config_id")), params=_params(p), metric=tags.get("metric", "?"),
        summary={k[len("final/"):]: v for k, v in m.items() if k.startswith("final/")},
        summary_current={k[len("final_current/"):]: v for k, v in m.items() if k.startswith("final_current/")},
        learned=flag, gate_skill=_num(m.get("gate/skill")), gate_score=_num(m.get("gate/score")),
        stream_skill=_num(m.get("stream_gate/skill")),
        state_bytes=_per_layer(m, "state_bytes/layer"), parameters=int(m.get("model/parameters", 0)),
        seed=_int(p.get("seed")), data_seed=_int(p.get("stream.options.seed", p.get("seed"))),
        config_id=tags.get("config_id"), code_version=tags.get("code_version"),
        finished_at=float(row.get("end_time") or 0), R=R, tokens_after=tokens_after,
        stream_chance=_num(m.get("stream_gate/chance")), stream_threshold=_num(m.get("stream_gate/threshold")),
        stream_chances=chances, **_memory_from_mlflow(m, p),
    )


def _per_layer(m: Dict[str, float], prefix: str) -> List[float]:
    """The values of the metrics ``{prefix}0``, ``{prefix}1``, ... in layer order."""
    keys = sorted((k for k in m if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))
    return [m[k] for k in keys]


def _memory_from_mlflow(m: Dict[str, float], p: Dict[str, str]) -> Dict[str, Any]:
    """Shared memory bytes per layer and learned-buffer numbers as the run logged them (nothing for a run
    made before 2026-12-04 logged them: its table cells stay empty rather than guessed)."""
    return {"shared_bytes": _per_layer(m, "model/shared_bytes/layer"), "learned_buffers": int(m.get("model/learned_buffers", 0))}


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _int(v) -> Optional[int]:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------------------- grouping


def _is_seed_or_bookkeeping(key: str) -> bool:
    return key in SEED_KEYS or key in REPORTING_KEYS or key.startswith(IGNORED_PREFIXES)


def _varying(param_sets: Sequence[Dict[str, str]]) -> List[str]:
    """Config keys (not seeds, tracking, checkpoints) whose values differ between runs."""
    keys = set().union(*param_sets) if param_sets else set()
    # a key varies if the runs that have it disagree on it (a key only some runs have follows from
    # what they do differ in, e.g. the options of the mixer in model.layers); a run without a key of
    # ABSENT_VALUES has that key's absent value (e.g. no retention loss against 1.0)
    def values(k):
        return {p.get(k, ABSENT_VALUES.get(k)) for p in param_sets if k in p or k in ABSENT_VALUES}
    return sorted(k for k in keys if not _is_seed_or_bookkeeping(k) and len(values(k)) > 1)


def _mixer_of_option(key: str) -> Optional[str]:
    """The mixer an option key belongs to: ``model.mixers.<mixer>.<field>`` (or, in runs recorded
    before mixers owned their options, ``model.<mixer>.<field>``); None for other keys."""
    parts = key.split(".")
    if len(parts) >= 4 and parts[:2] == ["model", "mixers"]:
        return parts[2]
    if len(parts) >= 3 and parts[0] == "model":
        return parts[1]
    return None


def relevant_params(params: Dict[str, str]) -> Dict[str, str]:
    """The params without the options of mixers the run does not use (a mixer absent from
    ``model.layers``): two runs that differ only there ran the same model."""
    used = set(_layers(params.get("model.layers", "")))
    if not used:
        return dict(params)
    return {k: v for k, v in params.items() if _mixer_of_option(k) in (None, *used)}


def longest_budget_keys(keys: Sequence[str], groups: Dict[str, List["RunRecord"]], budget: str) -> List[str]:
    """A budget rule: of the configurations among ``keys`` that differ only in the numeric param ``budget``
    (e.g. ``meta_train.steps``: a recipe rerun longer because it was still improving), only the one with
    the largest value is kept; ``keys`` in their order. A configuration without the param counts as 0."""
    def size(key):
        return float(groups[key][0].params.get(budget, 0))

    def rest(key):
        return tuple(sorted((k, v) for k, v in relevant_params(groups[key][0].params).items()
                            if k != budget and not _is_seed_or_bookkeeping(k)))

    longest: Dict[tuple, str] = {}
    for key in keys:
        if rest(key) not in longest or size(key) > size(longest[rest(key)]):
            longest[rest(key)] = key
    return [k for k in keys if k in longest.values()]


def read_longest_budget(records: Sequence["RunRecord"], budget: str) -> List["RunRecord"]:
    """The records of :func:`longest_budget_keys`' configurations (the others left out)."""
    groups = group_records(records)
    kept = set(longest_budget_keys(list(groups), groups, budget))
    return [r for key, runs in groups.items() if key in kept for r in runs]


class GroupName(str):
    """A configuration group's name (``"layers=['ovq'], ovq.num_slots=128"``) that keeps its parts
    (``parts``: the ``name=value`` strings it joins, or ``["all runs"]``), so that readers never parse the
    name back (a value may hold ", " itself: ``layers=['swa', 'ovq']``)."""

    parts: List[str]

    def __new__(cls, parts: List[str]) -> "GroupName":
        name = super().__new__(cls, ", ".join(parts) or "all runs")
        name.parts = list(parts) or ["all runs"]
        return name


def group_by_config(items: Sequence, params_of: Callable) -> Dict[GroupName, List]:
    """Items whose configs differ only by seeds (and the options of mixers they do not use) share a
    group; the group's name lists the differing values (a :class:`GroupName`)."""
    params = [relevant_params(params_of(it)) for it in items]
    varying = _varying(params)
    groups: Dict[GroupName, List] = {}
    for it, p in zip(items, params):
        name = GroupName([f"{_short(k)}={p[k]}" for k in varying if k in p])
        groups.setdefault(name, []).append(it)
    return groups


def split_top_level(text: str) -> List[str]:
    """``text`` split at every ", " outside brackets (a list value holds ", " too)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[({":
            depth += 1
        elif ch in "])}":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0 and text.startswith(", ", i):
            parts.append(text[start:i])
            start = i + 2
    parts.append(text[start:])
    return parts


def _short(key: str) -> str:
    """``model.mixers.ovq.num_slots`` -> ``ovq.num_slots``; ``model.layers`` -> ``layers``."""
    for prefix in ("model.mixers.", "model."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def deduplicated(records: Iterable[RunRecord]) -> Tuple[List[RunRecord], List[str]]:
    """Each run once, and replicates of one code only: (records, notes saying what was done).

    1. Runs of the same identity (config with its seeds, and code version) are one run repeated (by
       ``--rerun``, two concurrent starts, a store switch): the latest finished is kept.
    2. A configuration whose runs come from different code versions is split by code version (a
       ``code_version`` entry in the params, so the tables show the versions apart), never pooled.
    Records without an identity (written before it was recorded) are kept as they are."""
    records = list(records)
    latest: Dict[Tuple[str, Optional[str]], Tuple[int, RunRecord]] = {}
    kept = []
    for i, r in enumerate(records):
        if r.config_id is None:
            kept.append((i, r))
            continue
        key = (r.config_id, r.code_version)
        if key not in latest or (r.finished_at, i) >= (latest[key][1].finished_at, latest[key][0]):
            latest[key] = (i, r)
    kept = [r for _, r in sorted(kept + list(latest.values()), key=lambda t: t[0])]
    notes = []
    dropped = len(records) - len(kept)
    if dropped:
        notes.append(f"{dropped} repeated run(s) of the same config, seeds and code left out (the latest of each kept)")
    split = set()
    for name, runs in group_records(kept).items():
        versions = sorted({r.code_version or "not recorded" for r in runs})
        if len(versions) > 1:
            counts = ", ".join(f"{v} (n={sum((r.code_version or 'not recorded') == v for r in runs)})" for v in versions)
            notes.append(f"{name}: runs of {len(versions)} code versions, shown apart: {counts}")
            split.update(id(r) for r in runs)
    out = [dataclasses.replace(r, params={**r.params, "code_version": r.code_version or "not recorded"})
           if id(r) in split else r for r in kept]
    return out, notes


def group_records(records: Iterable[RunRecord]) -> Dict[str, List[RunRecord]]:
    return group_by_config(list(records), lambda r: r.params)


def groups_with(records: Iterable[RunRecord], has: Callable[[RunRecord], Any]) -> Dict[str, List[RunRecord]]:
    """The configurations' groups (:func:`group_records`) cut to the runs for which ``has`` is truthy (e.g.
    that measured a probe); groups left empty are dropped."""
    groups = {k: [r for r in v if has(r)] for k, v in group_records(records).items()}
    return {k: v for k, v in groups.items() if v}


# ------------------------------------------------------------------------------------------- tables


def _gate_cell(runs: Sequence[RunRecord]) -> str:
    measured = [r for r in runs if r.learned is not None]
    if not measured:
        return "unmeasured"
    k = sum(bool(r.learned) for r in measured)
    skill = mean_interval([r.gate_skill for r in runs])
    text = f"{k}/{len(measured)} learned"
    return text + (f" (held-out skill {skill.mean:.2f})" if skill.n else "")


def _cell(runs: Sequence[RunRecord], column: str, current: bool = False, needs_learning: bool = False) -> str:
    source = (lambda r: r.summary_current) if current else (lambda r: r.summary)
    if needs_learning:
        kept = [r for r in runs if r.learned is not False]
        if not kept:
            return "not learned"
        text = mean_interval([source(r).get(column, math.nan) for r in kept]).format()
        return text if len(kept) == len(runs) else f"{text}; {len(runs) - len(kept)} not learned, left out"
    return mean_interval([source(r).get(column, math.nan) for r in runs]).format()


def bytes_cell(runs: Sequence[RunRecord]) -> str:
    per_layer = runs[0].state_bytes
    if not per_layer:
        return "-"
    distinct = sorted({int(round(b)) for b in per_layer})
    return " / ".join(f"{b:,}" for b in distinct)


def _shared_cell(runs: Sequence[RunRecord]) -> str:
    """Shared memory about the data per layer (VQ's codebook), '-' when a configuration has none."""
    distinct = sorted({int(b) for b in runs[0].shared_bytes if b})
    return " / ".join(f"{b:,}" for b in distinct) or "-"


def _parameters_cell(runs: Sequence[RunRecord]) -> str:
    r = runs[0]
    return f"{r.parameters:,}" + (f" + {r.learned_buffers:,} in learned buffers" if r.learned_buffers else "")


def summary_table(records: Iterable[RunRecord]) -> str:
    """One row per configuration: gate, scores, the runs that stopped learning, both forgetting
    definitions and BWT (95% CIs over seeds), state bytes per layer and lane, parameters. A second
    table against the facts in force when any run has one."""
    records = list(records)
    groups = group_records(records)
    metric = ", ".join(sorted({r.metric for r in records})) or "?"
    head = ["configuration", "metric", "n", "learned gate", *SCORES, "stopped learning", *FORGETTING,
            "state bytes/layer/lane", "shared memory bytes/layer", "parameters"]
    gate = GateSection()
    lines = [f"metric: {metric}; cells: mean ± std [95% CI] (n seeds); learned gate: the runs that passed every "
             f"gate (held-out skill >= {gate.min_skill} from a fresh state after meta-training, stream skill >= "
             f"{gate.min_stream_skill}, recall at the learning delay where measured), beside the mean held-out "
             "skill; stopped learning: runs whose learning "
             "score R[j][j] fell below the stream gate's skill bar at an experience after the first, which "
             "passed it (the earliest such experience, counted from 0); forgetting_max: Chaudhry et al. 2018, "
             "forgetting_learned: Avalanche's (R[i][i] - R[j][i])", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups):
        runs = groups[key]
        cells = [key, ", ".join(sorted({r.metric for r in runs})), str(len(runs)), _gate_cell(runs)]
        # plasticity beside stability: a memory that forgets little because it stopped taking new facts
        # shows it in the same row
        cells += [_cell(runs, c) for c in SCORES] + [stopped_summary(runs)]
        cells += [_cell(runs, c, needs_learning=True) for c in FORGETTING]
        cells += [bytes_cell(runs), _shared_cell(runs), _parameters_cell(runs)]
        lines.append("| " + " | ".join(cells) + " |")
    with_current = {k: v for k, v in groups.items() if any(r.summary_current for r in v)}
    if with_current:
        head = ["configuration", "n", *[f"{c} (facts in force)" for c in CURRENT_COLUMNS]]
        lines += ["", "Scored against the facts in force after each experience (R_current):", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for key in sorted(with_current):
            runs = with_current[key]
            cells = [key, str(len(runs))] + [_cell(runs, c, current=True, needs_learning=c.startswith("forgetting"))
                                              for c in CURRENT_COLUMNS]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def matching_groups(groups: Dict[str, List[RunRecord]], pattern: str) -> List[str]:
    """The groups a pattern names, sorted: the group called ``pattern``, or those whose mixers
    (``model.layers`` joined by '+') are ``pattern``; ``"MIXERS | KEY=VALUE, ..."`` also requires those
    params (full keys, values as logged), e.g. ``"ovq | stream.options.meta_sequence_episodes=4"``;
    MIXERS ``*`` matches any mixers (the params decide)."""
    if pattern in groups:
        return [pattern]
    return sorted(k for k, runs in groups.items() if params_match(runs[0].params, pattern))


def params_match(params: Dict[str, str], pattern: str) -> bool:
    """Whether one configuration's params (as logged) match a pattern ``"MIXERS | KEY=VALUE, ..."`` of
    :func:`matching_groups` (a bare configuration name matches nothing here)."""
    mixers, _, conditions = (part.strip() for part in pattern.partition("|"))
    wanted = dict(c.strip().split("=", 1) for c in conditions.split(",") if c.strip())
    return ((mixers == "*" or "+".join(_layers(params.get("model.layers", ""))) == mixers)
            and all(params.get(key) == value for key, value in wanted.items()))


def find_group(groups: Dict[str, List[RunRecord]], name: str) -> str:
    """The one group ``name`` matches (:func:`matching_groups`); ValueError when none or several do."""
    matches = matching_groups(groups, name)
    if len(matches) != 1:
        raise ValueError(f"baseline {name!r} matches {len(matches)} configurations; known: {sorted(groups)}"
                         + ("; name one whole (its row), or narrow the runs (compare --sweep NAME, --filter)"
                            if len(matches) > 1 else ""))
    return matches[0]


def _layers(text: str) -> List[str]:
    return [t.strip(" '\"") for t in text.strip("[]").split(",") if t.strip()]


PAIRED_COLUMNS = ("final_average", "learning_average", "forgetting_max", "forgetting_learned")
# on streams whose facts change, the same table also pairs the scores against the facts in force
PAIRED_CURRENT_COLUMNS = ("current:final_average", "current:updated_fraction", "current:stale_fraction")


def _column_value(r: RunRecord, column: str) -> float:
    """A paired table's column of one run: a summary name (scored by R), or ``current:NAME`` (scored
    against the facts in force, ``summary_current``); NaN where the run lacks it."""
    if column.startswith("current:"):
        return r.summary_current.get(column.split(":", 1)[1], math.nan)
    return r.summary.get(column, math.nan)


def _column_label(column: str) -> str:
    return f"{column.split(':', 1)[1]} (facts in force)" if column.startswith("current:") else column


def paired_table(records: Iterable[RunRecord], baseline: str, columns: Optional[Sequence[str]] = None) -> str:
    """Every configuration against ``baseline`` on the replicates (model seed, data seed) both ran:
    difference (other - baseline) with its 95% CI, paired t p, that p Holm-adjusted over the table's
    rows of the same metric (the table's tests of one endpoint are one family; the verdict table adjusts
    over whole stream families), exact Wilcoxon signed-rank p, Cohen's d_z. Forgetting pairs where
    either run did not learn are dropped. ``columns`` (default: :data:`PAIRED_COLUMNS`, plus
    :data:`PAIRED_CURRENT_COLUMNS` when some run was scored against the facts in force) are summary names or
    ``current:NAME``."""
    from experiments.stats.multiple import holm

    records = list(records)
    if columns is None:
        columns = PAIRED_COLUMNS + (PAIRED_CURRENT_COLUMNS if any(r.summary_current for r in records) else ())
    groups = group_records(records)
    base_key = find_group(groups, baseline)
    head = ["configuration - baseline", "metric", "n pairs", "difference [95% CI]", "paired t p", "p Holm (metric)",
            "Wilcoxon p", "d_z"]
    rows = []                                      # (key, column, comparison or None, shares replicates)
    for key, all_pairs in pairs_against(groups, base_key):
        for column in columns:
            pairs = all_pairs
            if column.split(":", 1)[-1] in FORGETTING:
                pairs = [(a, b) for a, b in pairs if a.learned is not False and b.learned is not False]
            c = paired_comparison([_column_value(a, column) for a, _ in pairs],
                                  [_column_value(b, column) for _, b in pairs]) if pairs else None
            rows.append((key, column, c, bool(all_pairs)))
    adjusted = {}
    for column in columns:
        family = [(i, c) for i, (_, col, c, _) in enumerate(rows) if col == column and c is not None]
        for (i, _), a in zip(family, holm([c.p_t for _, c in family])):
            adjusted[i] = a
    lines = [f"baseline: {base_key}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, (key, column, c, shared) in enumerate(rows):
        if c is None or c.n == 0:
            # no pair: forgetting keeps only learned pairs; a score missing on either side is not measured
            why = "not learned" if column.split(":", 1)[-1] in FORGETTING and shared else "not measured"
            lines.append(f"| {key} | {_column_label(column)} | 0 | {why} | | | | |")
            continue
        interval = f"[{c.low:+.3f}, {c.high:+.3f}]" if c.n >= 2 else "(one pair: no interval)"
        lines.append(f"| {key} | {_column_label(column)} | {c.n} | {c.mean_difference:+.3f} {interval} | "
                     f"{_p(c.p_t)} | {_p(adjusted.get(i, math.nan))} | {_p(c.p_wilcoxon)} | {_f(c.effect_size_dz)} |")
    return "\n".join(lines)


@dataclass
class VerdictRow:
    """One cell of the verdict: a configuration against the OVQ baseline on the replicates both ran."""

    other: str
    n_pairs: int                        # replicates where both learned (forgetting is compared on these)
    n_not_learned: int                  # replicates where either did not learn
    forgetting: Any                     # PairedComparison of forgetting_max, other - baseline
    learning: Any                       # PairedComparison of learning_average, baseline - other (all pairs)
    higher_is_better: bool
    current: bool                       # scored against the facts in force (streams whose facts change)
    state_bytes: Tuple[float, float]    # baseline, other (mean per layer and lane)
    parameters: Tuple[float, float]
    shared_bytes: Tuple[float, float] = (0.0, 0.0)     # baseline, other: shared memory per layer (VQ's codebook)
    learned_buffers: Tuple[int, int] = (0, 0)
    learned_by: Tuple[int, int] = (0, 0)   # replicates (of the shared ones) where OVQ, the other passed the gates
    # the primary endpoint: the final average score (against the facts in force where the stream has
    # them), OVQ - other, over every shared replicate (learned or not: what each memory holds at the end)
    primary: Any = None
    late_learning: Any = None           # PairedComparison of the mean R[j][j] over j >= 1, OVQ - other
    stopped: Tuple[str, str] = ("", "")  # runs that stopped learning (OVQ, other): stopped_summary
    run_ids: frozenset = frozenset()    # the run identities (config_id) behind this row, both sides
    code_versions: frozenset = frozenset()   # the code versions of its records ("not recorded" for none)
    results: frozenset = frozenset()    # the result matrices behind it: runs repeated under settings that
                                        # change no number (e.g. the delay probe's size) are the same evidence
    # Holm-adjusted p within the row's family (stream family x endpoint), set by the report; in a
    # declared (confirmatory) family, tests still to come are counted at p = 1 (these) and at p = 0 (the
    # _low ones), and a word is read only where both agree
    p_primary_adjusted: float = math.nan
    p_forgetting_adjusted: float = math.nan
    p_primary_low: float = math.nan
    p_forgetting_low: float = math.nan
    declared_seeds: int = 0             # the pairs its study declared (confirmatory); 0: none declared
    final_means: Tuple[float, float] = (math.nan, math.nan)   # OVQ's, the other's mean final average over the
                                        # pairs of ``primary`` (what each held, beside their difference)
    primary_sd: float = math.nan        # the standard deviation of the primary's paired differences
    learned_primary: Tuple[int, int] = (-1, -1)   # OVQ's, the other's runs that passed their gates (learned is
                                        # True), of the primary's pairs; -1: not counted (rows made by hand)

    @property
    def pending(self) -> bool:
        """Fewer pairs than its study declared: its numbers are shown, no word is read from them."""
        return bool(self.declared_seeds) and (self.primary is None or self.primary.n < self.declared_seeds)

    @staticmethod
    def _moved(p_high: float, p_low: float) -> bool:
        """Whether tests of its family still to come could move its word (one side of 0.05 each)."""
        return not math.isnan(p_low) and (p_low < 0.05) != (p_high < 0.05)

    def _better(self, difference: float) -> bool:
        """Whether an OVQ - other difference of the score favours OVQ."""
        return difference > 0 if self.higher_is_better else difference < 0

    @property
    def primary_verdict(self) -> str:
        """The verdict on the primary endpoint, by the family-adjusted p when the report set it."""
        c = self.primary
        if c is not None and c.n >= 2 and math.isnan(c.p_t):
            return NO_T_TEST
        if self.pending:
            return f"pending ({c.n if c is not None else 0} of {self.declared_seeds} declared seeds)"
        if c is None or c.n < 2:
            return "too few pairs" if c is not None and c.n else "no shared seeds"
        p = c.p_t if math.isnan(self.p_primary_adjusted) else self.p_primary_adjusted
        if self._moved(p, self.p_primary_low):
            return "pending (tests of its declared family still to come could move its Holm p)"
        few = "" if c.n >= 5 else f" ({c.n} seeds, fewer than 5)"
        # who learned, over the primary's own pairs (runs whose gates passed: learned is True)
        counts = self.learned_primary if min(self.learned_primary) >= 0 else self.learned_by
        # who learned decides what the test may be read as (experiments.stats.reading, as the claims table)
        said = reading.read_difference(p < 0.05, self._better(c.mean_difference),
                                       *(reading.learned_on_most(k, c.n) for k in counts))
        if said == reading.NEITHER_LEARNED:
            return f"neither learned ({counts[0]}/{c.n} and {counts[1]}/{c.n})" + few
        if said == reading.LEAD_OVER_NON_LEARNER:
            return f"OVQ holds more, against a non-learner ({counts[1]}/{c.n} learned)" + few
        if said == reading.LEAD_NOT_LEARNED:
            return f"OVQ holds more, but did not learn ({counts[0]}/{c.n} learned)" + few
        if said == reading.LEAD:
            stopped = self.stopped[0]
            # a memory that holds more because it stopped taking new facts is named as one
            named = "" if not stopped or stopped.startswith(("0/", "unmeasured")) else f"; stopped learning {stopped}"
            return "OVQ holds more" + named + few
        if said == reading.LOSS:
            return "**OVQ holds less**" + few
        if said == reading.NOT_READ_NON_LEARNER:
            return f"not read: against a non-learner ({counts[1]}/{c.n} learned)" + few
        if said == reading.NOT_READ_NOT_LEARNED:
            return f"not read: OVQ did not learn ({counts[0]}/{c.n} learned)" + few
        # what the test could have seen: 80% power at 5% for the observed spread of the differences
        could = detectable_difference(self.primary_sd, c.n)
        return "no difference detected" + few + (
            "" if math.isnan(could) else f" (a difference of {could:.2f} found with 80% power at 5%, before Holm)")

    @property
    def verdict(self) -> str:
        """The verdict on forgetting (a secondary endpoint), by the family-adjusted p when set."""
        f = self.forgetting
        if self.n_pairs == 0:
            ovq, other = self.learned_by
            n = self.n_not_learned
            if ovq == 0 and other > 0:         # a place OVQ loses, in learning: said, not hidden as "not comparable"
                return f"not comparable: **OVQ did not learn** (0/{n}), {self.other.split(' ')[0]} did ({other}/{n})"
            if other == 0 and ovq > 0:
                return f"not comparable: {self.other.split(' ')[0]} did not learn (0/{n}; OVQ {ovq}/{n})"
            return "not comparable: neither learned" if n else "not comparable: no shared seeds"
        if self.pending:
            return f"pending ({self.primary.n if self.primary is not None else 0} of {self.declared_seeds} declared seeds)"
        if self.n_pairs < 2 or f.n < 2:          # pairs where both learned, but too few with the endpoint
            return "too few pairs"
        if math.isnan(f.p_t):
            return NO_T_TEST
        few = "" if f.n >= 5 else f" ({f.n} seeds, fewer than 5)"       # the pairs the test was made on
        p = f.p_t if math.isnan(self.p_forgetting_adjusted) else self.p_forgetting_adjusted
        if self._moved(p, self.p_forgetting_low):
            return "pending (tests of its declared family still to come could move its Holm p)"
        if p < 0.05:
            return ("OVQ forgets less" if f.mean_difference > 0 else "**OVQ forgets more**") + few
        return "no difference detected" + few


#: the verdict where the pairs exist but the t-test is not made: every pair differs by the same amount
#: (zero variance; ``intervals.paired_comparison``), which the test would call certain
NO_T_TEST = "no t-test (every pair differs by the same amount)"


def _learned_of_measured(pairs, value: Callable) -> Tuple[int, int]:
    """(OVQ's, the other's) runs that passed their gates (learned is True) among the pairs (other, OVQ)
    where both measured the endpoint (``value`` finite): the pairs the primary comparison is made on."""
    kept = [(a, b) for a, b in pairs if all(v is not None and math.isfinite(v) for v in (value(a), value(b)))]
    return sum(b.learned is True for _, b in kept), sum(a.learned is True for a, _ in kept)


def _pair_means(a: Sequence[float], b: Sequence[float]) -> Tuple[float, float]:
    """The means of ``a`` and of ``b`` over the pairs where both are finite, as ``paired_comparison``
    keeps them (NaN for none)."""
    kept = [(x, y) for x, y in zip(a, b) if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    if not kept:
        return math.nan, math.nan
    return sum(x for x, _ in kept) / len(kept), sum(y for _, y in kept) / len(kept)


def verdict_rows(records: Iterable[RunRecord], baseline: str) -> List[VerdictRow]:
    """Every configuration against ``baseline`` (an OVQ configuration): the paired forgetting_max
    difference (other - baseline; positive: the other forgets more) over replicates where both learned,
    the learning-score difference (baseline - other) over all shared replicates, and their costs. Streams
    whose facts change are compared against the facts in force (``summary_current``) when both have it."""
    from strategies.evaluation.metrics import higher_is_better

    groups = group_records(records)
    base_key = find_group(groups, baseline)
    base = latest_per_replicate(groups[base_key])
    rows = []
    for key in sorted(groups):
        if key == base_key or "ovq" in _layers(groups[key][0].params.get("model.layers", "")):
            continue                    # other OVQ configurations are the study's business, not the verdict's
        others = latest_per_replicate(groups[key])
        shared = sorted(set(base) & set(others), key=str)
        # every shared seed paired within one code version where one version covers them all (a seed run
        # again by a later version then pairs with the version its partner has, whatever the files'
        # order); else each seed's latest runs, and pairs across versions are the report's to refuse
        version, within, _, _ = pairs_in_one_version(groups[key], groups[base_key])
        pairs = within if version is not None and len(within) == len(shared) else [(others[s], base[s]) for s in shared]
        learned = [(a, b) for a, b in pairs if a.learned is not False and b.learned is not False]
        current = bool(pairs) and all(a.summary_current and b.summary_current for a, b in pairs)

        def col(r, name):
            return (r.summary_current if current else r.summary).get(name, math.nan)

        forgetting = paired_comparison([col(a, "forgetting_max") for a, _ in learned],
                                       [col(b, "forgetting_max") for _, b in learned])
        learning = paired_comparison([b.summary.get("learning_average", math.nan) for _, b in pairs],
                                     [a.summary.get("learning_average", math.nan) for a, _ in pairs])
        metric = groups[base_key][0].metric
        primary = paired_comparison([col(b, "final_average") for _, b in pairs], [col(a, "final_average") for a, _ in pairs])
        late = paired_comparison([late_learning(b) for _, b in pairs], [late_learning(a) for a, _ in pairs])
        rows.append(VerdictRow(_describe(groups[key][0], groups[base_key][0]), len(learned), len(pairs) - len(learned),
                               forgetting, learning,
                               higher_is_better(metric), current,
                               (_mean_bytes(groups[base_key]), _mean_bytes(groups[key])),
                               (_mean_parameters(groups[base_key]), _mean_parameters(groups[key])),
                               learned_by=(sum(b.learned is not False for _, b in pairs),
                                           sum(a.learned is not False for a, _ in pairs)),
                               primary=primary, late_learning=late,
                               final_means=_pair_means([col(b, "final_average") for _, b in pairs],
                                                       [col(a, "final_average") for a, _ in pairs]),
                               primary_sd=paired_sd([col(b, "final_average") for _, b in pairs],
                                                         [col(a, "final_average") for a, _ in pairs]),
                               learned_primary=_learned_of_measured(pairs, lambda r: col(r, "final_average")),
                               shared_bytes=(_mean_shared(groups[base_key]), _mean_shared(groups[key])),
                               learned_buffers=(groups[base_key][0].learned_buffers, groups[key][0].learned_buffers),
                               stopped=(stopped_summary([b for _, b in pairs]), stopped_summary([a for a, _ in pairs])),
                               run_ids=frozenset(r.config_id or r.label + str(r.replicate)
                                                 for a, b in pairs for r in (a, b)),
                               code_versions=frozenset(r.code_version or NOT_RECORDED for a, b in pairs for r in (a, b)),
                               results=frozenset(repr((side, r.replicate, r.R)) for a, b in pairs
                                                 for side, r in (("other", a), ("ovq", b)) if r.R)))
    return rows


def _mean_bytes(runs: Sequence[RunRecord]) -> float:
    return statistics.fmean([statistics.fmean(r.state_bytes) for r in runs if r.state_bytes] or [math.nan])


def _mean_shared(runs: Sequence[RunRecord]) -> float:
    return statistics.fmean([statistics.fmean(r.shared_bytes) for r in runs if r.shared_bytes] or [0.0])


def _mean_parameters(runs: Sequence[RunRecord]) -> float:
    return statistics.fmean([r.parameters for r in runs] or [math.nan])


SIZING_KEYS = ("model.state_budget", "model.layers")
NOT_RECORDED = "not recorded"           # the code version of a record written before records carried one


def _describe(run: RunRecord, baseline: RunRecord) -> str:
    """A configuration by its mixers and the params (short names) where it differs from the baseline's,
    sizing and bookkeeping aside: ``delta``, ``full``, ``ssm (chunk_size=8)``."""
    mixers = "+".join(_layers(run.params.get("model.layers", "")))
    differ = [k for k in sorted(set(run.params) | set(baseline.params))
              if run.params.get(k, ABSENT_VALUES.get(k)) != baseline.params.get(k, ABSENT_VALUES.get(k))
              and k not in SIZING_KEYS
              and not _is_seed_or_bookkeeping(k) and not k.startswith("model.mixers.") and not k.startswith("model.resolved")]
    # a param the run does not list has its absent value (no retention loss: 0.0), else "-"
    extra = ", ".join(f"{k.rsplit('.', 1)[-1]}={run.params.get(k, ABSENT_VALUES.get(k, '-'))}" for k in differ)
    return f"{mixers} ({extra})" if extra else mixers


def _p(p: float) -> str:
    return "-" if math.isnan(p) else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


def format_p(p: float) -> str:
    """A p-value in two significant digits, "-" where no test was made."""
    return "-" if math.isnan(p) else f"{p:.2g}"


def _f(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:+.2f}"


def unknown_metric_notes(records: Sequence[RunRecord]) -> List[str]:
    """One note per metric the records use that this process has not registered (a plugin's, without
    ``--plugin``): their runs are compared as stored, and what needs the metric's definition (each
    experience's skill, hence "stopped learning") is unmeasured for them."""
    from strategies.evaluation.metrics import METRICS

    unknown = sorted({r.metric for r in records if r.metric not in METRICS})
    return [f"metric {m!r} is not registered here ({sum(r.metric == m for r in records)} runs): compared as "
            f"stored, 'stopped learning' unmeasured for them; pass --plugin MODULE to load it" for m in unknown]


def mlflow_records(experiment: str, tracking_uri: str = None, filter_string: str = "",
                   sweep: Optional[str] = None) -> List[RunRecord]:
    """The finished runs of an MLflow experiment (sweep parents skipped) as records; with ``sweep``, only
    the runs of the sweeps of that name (the children of every parent run so named: a sweep started again
    reuses the runs an earlier start finished, which stay that start's children)."""
    import os

    from experiments.tracking import default_tracking_uri, runs_table

    uri = default_tracking_uri(tracking_uri)
    if uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///"):]):
        raise FileNotFoundError(f"no tracking store at {uri} (reading never creates one)")
    from experiments.tracking.runs import tracking_client

    client = tracking_client(uri)
    if client.get_experiment_by_name(experiment) is None:
        known = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"no experiment {experiment!r} in {uri}; known: {known}")
    from experiments.tracking.query import metric_histories

    rows = runs_table(experiment, tracking_uri, filter_string)
    if sweep is not None:
        parents = {r["run_id"] for r in rows if r["tags"].get("kind") == "sweep" and r["run_name"] == sweep}
        if not parents:
            names = sorted({r["run_name"] for r in rows if r["tags"].get("kind") == "sweep"})
            raise ValueError(f"no sweep {sweep!r} in experiment {experiment!r}; its sweeps: {names}")
        rows = [r for r in rows if r["parent_run_id"] in parents]
    rows = [r for r in rows if r["status"] == "FINISHED" and r["tags"].get("kind") != "sweep"]
    return [record_from_mlflow(r, metric_histories(client, r["run_id"], history_keys(r["metrics"]))) for r in rows]


def table(results: Iterable) -> str:
    """The summary table of a sweep's RunResults."""
    return summary_table(record_from_result(r) for r in results)


def curves_plot(records: Iterable[RunRecord], path: str, title: str = "") -> str:
    """Mean forgetting curve per configuration: score on experience i against experiences since i,
    averaged over i and seeds, with the spread over seeds as a band. Configurations with a run that did
    not learn are drawn dashed and labelled so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    metric = "score"
    for key, runs in sorted(group_records(records).items()):
        runs = [r for r in runs if r.R is not None]
        if not runs:
            continue
        metric = runs[0].metric
        K = len(runs[0].R)
        per_seed = []
        for r in runs:
            rows = forgetting.forgetting_curve(r.R, r.tokens_after or list(range(K)))
            per_seed.append([statistics.fmean(x["score"] for x in rows if x["experiences_since"] == d) for d in range(K)])
        mean = [statistics.fmean(s[d] for s in per_seed) for d in range(K)]
        sd = [statistics.stdev([s[d] for s in per_seed]) if len(per_seed) > 1 else 0.0 for d in range(K)]
        bad = sum(r.learned is False for r in runs)
        readable = key.replace("['", "").replace("']", "").replace("', '", "+")     # layers=['ovq'] -> layers=ovq
        label = f"{readable} (n={len(runs)})" + (f"  [NOT LEARNED: {bad}/{len(runs)}]" if bad else "")
        ax.plot(range(K), mean, marker="o", label=label, linestyle="--" if bad else "-")
        ax.fill_between(range(K), [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)], alpha=0.15)
    chances = [r.stream_chance for r in records if r.R is not None and not math.isnan(r.stream_chance)]
    if chances:                         # what answering without memory scores: the floor every curve is read against
        ax.axhline(statistics.fmean(chances), color="grey", linestyle=":", linewidth=1, label="chance")
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))           # experiences are whole
    ax.set_xlabel("experiences since the evaluated experience was learned")
    ax.set_ylabel(f"{metric} (mean over seeds; band: ±1 SD over seeds)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    # below the axes: a legend of long configuration names inside them hides the curves
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
