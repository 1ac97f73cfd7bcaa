"""ICR shift: in-context recall of key -> value facts, one fact table per experience.

Vocabulary (``vocab_size = 2 + n_keys + n_values``, the layout of ``streams.recall``)::

    0 PAD, 1 SEP, key tokens 2 .. n_keys + 1, value tokens n_keys + 2 .. n_keys + n_values + 1

**Fact tables.** Experience j owns a table of ``facts_per_experience`` facts whose keys are drawn from
its key region, a window of the key tokens (``info.regions[j]``): the K windows are disjoint by
default; ``key_overlap`` > 0 makes consecutive windows share that fraction of their keys (variant
``basic`` only). In ``basic``, every key has one value for the whole stream, so a key shared by two
tables is the same fact.

**Training episode** of experience j: ``facts_per_episode`` facts of table j, in random order, then
SEP, then ``queries_per_episode`` distinct presented keys, each followed by its answer (teacher forced).
``labels[t]`` is the token to predict at t: the answer at the position of its query, -100 elsewhere::

    tokens: k1 v1 k2 v2 ... kP vP SEP q1 a1 ... qQ aQ [PAD ...]       x: [T] int64
    labels:  -  -  -  - ...  -  -   -  a1  - ... aQ  - [ -  ...]       y: [T] int64

**Test episode** of experience i: no presentation, ``test_queries`` distinct keys of table i::

    tokens: SEP q1 a1 ... qM aM [PAD ...]
    labels:  -  a1  - ... aM  - [ -  ...]

**Variant ``positional``** (the answer is the LATEST binding):

- within an episode, ``rebind_within`` of the presented keys are presented twice, first with a stale
  random value, later with the table's value; every such key is queried, and its answer is the
  table's value (the binding closest before SEP);
**Facts that change across experiences** (either variant): table j (j >= 1) rebinds ``rebind_across``
keys that table j-1 introduced to new values (or ``rebind_fraction`` of a table's size;
``info.rebound[j]``: key -> (old value, new value)); from then on the new value is right.

Test labels are fixed when a test episode is made (the value in table i). By default a test label
must stay right whatever comes later, so **the test episodes of experience i query only keys that no
later table rebinds** (``info.test_keys[i]``); a rebound key is tested by the experience that rebinds
it, with its new value. With ``test_rebound_keys: true`` they query every key of table i, and the
runner scores the same answers twice: ``R[j][i]`` against the value when learned, ``R_current[j][i]``
against the value in force after experience j (``info.labels_in_force``), with the share of changed
facts answered with the new value (updated) or the old one (stale). ``info.bindings_after(j)`` gives
the latest value of every key after experience j.

**Meta-training** (``meta_train``): episodes of the training layout with fresh random facts every
episode (its own random stream, ``meta_seed``), keys drawn from the whole key vocabulary and values at
random, with the same within-episode rebinding as the variant. It therefore shares key tokens and,
at the chance rate of 1/n_values per key, key-value pairs with the stream's tables: it teaches the
task, not the facts (a pair seen in meta-training is one of thousands of random pairs for that key).

**Meta-training for long memory** (``meta_sequence_episodes`` E > 1): an item is E episodes in a row
(E * T tokens, one sequence: the state is carried through, and meta-training backpropagates through
all of it or in truncated segments, ``meta_train.tbptt``). Episode e presents ``facts_per_episode``
facts; ``meta_rebind_fraction`` of them rebind a key that episodes e-D .. e-1 bound (D =
``meta_reach_back``) to a new value, the others use keys no episode of that window bound. Its
``queries_per_episode`` queries ask distinct keys bound in episodes e-D .. e (every rebound key of
the episode among them), and the answer is always the key's newest binding: a query can reach back
D episodes (up to (D + 1) * T tokens), and rebinding asks for the latest value, not the first::

    [k v k v ... SEP q a q a]  [k v ... k' v' ... SEP q a ...]  ...    E episodes, x: [E * T]
       episode 0                 episode 1 (k' rebound, q from 0..1)

**Long-horizon meta-training in blocks** (``meta_block_episodes`` B > 0): an item is E episodes in
blocks of B, the structure of the stream itself with fresh random facts: block b draws a table of
F = ``meta_block_facts`` facts (default ``facts_per_experience``), ``meta_rebind_fraction`` of them
rebinding keys of the previous block's table to new values, the others over keys outside that table,
those bound longest ago first (never-bound keys before any), with random values; so a block's facts stay
valid until the key space runs out (64 keys, F = 16, a quarter rebinding: 16 fresh keys, then 12 a
block, so four blocks use 52 keys and the fifth the last 12). The recalled queries are drawn evenly over
the facts recallable, so their reach-back is mostly short (B = 8, D = 31: median 4 episodes, about 9%
beyond 16). Each episode presents P facts of its
block's table and asks Q distinct keys: ``meta_recall_fraction`` of them facts it did *not* present,
presented in episodes e-D .. e-1 (D = ``meta_reach_back``, any block, their newest value; the stream's
test queries), the others facts it presented. With B = 8, F = 16 and D >= 24 the queries reach back as
far as the stream's forgetting is measured (three experiences of 8 episodes a lane). The answers to
facts not presented in the episode are what the auxiliary retention loss (``meta_train.retention_loss``)
weighs: ``StreamData.meta_recalled`` gives their positions (for E > 1 without blocks too), and
``StreamData.meta_reach`` how many episodes back each asked fact was last presented::

    block 0 (table 0)                      block 1 (table 1, a quarter rebinding table 0's keys)
    [k v ... SEP q a q a] x B  ...         [k v ... SEP q a (q0 a0) ...] x B    q0: a fact of an earlier episode

**Delay probe** (``delay_probe(filler, n)``, for the delay-recall curve): a fresh set of
``facts_per_episode`` facts, then ``filler`` complete meta-training episodes over other keys, then SEP
and ``queries_per_episode`` queries of the first facts; only those are scored. The delay is the
filler's length in tokens (0: the meta-training task itself, without its queries in between)::

    k1 v1 ... kP vP  [filler: k v ... SEP q a ...] x filler  SEP q1 a1 ... qQ aQ

**Interference probe** (``interference_probe(kind, items, n)``, for the interference curves): a fresh
set of ``facts_per_episode`` facts over the key region of experience ``i mod K`` (item i), presented
once, then ``items`` intervening bindings of one ``kind``, then SEP and ``queries_per_episode`` queries
of the first facts (only those scored)::

    k1 v1 ... kP vP  [f1 g1 f2 g2 ... f_items g_items]  SEP q1 a1 ... qQ aQ

- ``neutral``: SEP SEP per item, the tokens of a binding and no binding (time only);
- ``same_region``: new bindings of the region's other keys (drawn with replacement, values random);
- ``other_region``: new bindings of the next experience's region (what a shifted experience does);
- ``repeat``: the same facts again (keys drawn from them, their own values).

Every kind puts 2 * ``items`` tokens between the facts and the queries, so the curves differ by what
those tokens are, not by how many.

**Capacity probe** (``capacity_probe(facts, n)``, for the capacity curve): ``facts`` distinct keys drawn
from all ``n_keys`` (any region), each bound once to a random value, then SEP and
``queries_per_episode`` queries of keys drawn from all of them (only those scored): how many facts
a fresh memory holds at once, with nothing but the facts themselves in between.

Default sizes: T = 2 * 8 + 1 + 2 * 4 = 25 (train, meta-train), 1 + 2 * 4 = 9 (test).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from streams.common import EpisodeDataset, EpisodeStreamConfig, StreamData, StreamInfo, load_config, require, seeded_rng, to_benchmark
from ovq_cl.base import IGNORE, PAD, SEP, scored_mask

VARIANTS = ("basic", "positional")
_POSITIONAL_DEFAULTS = {"rebind_within": 2, "rebind_across": 4}


@dataclass
class ICRConfig(EpisodeStreamConfig):
    variant: str = "basic"                # basic | positional
    n_experiences: int = 4                # K
    n_keys: int = 64
    n_values: int = 32
    key_overlap: float = 0.0              # fraction of a key region shared with the next one (basic)
    facts_per_experience: int = 12        # size of each fact table
    facts_per_episode: int = 8            # distinct facts a training episode presents
    queries_per_episode: int = 4          # distinct presented keys a training episode queries
    rebind_within: Optional[int] = None   # positional: keys presented twice per episode; None -> 2 (basic: 0)
    rebind_across: Optional[int] = None   # keys of table j-1 rebound by table j; None -> 4 (positional), 0 (basic)
    rebind_fraction: Optional[float] = None   # alternative to rebind_across: round(this * facts_per_experience)
    test_rebound_keys: bool = False       # test episodes also query keys a later table rebinds (score with R_current)
    test_queries: int = 4                 # distinct keys a test episode queries
    seq_len: Optional[int] = None         # pad train and test episodes to this T; None -> their exact length
    meta_sequence_episodes: int = 1       # E: episodes per meta-training sequence, the state carried through
    meta_reach_back: int = 0              # D: queries of episode e ask keys bound in episodes e-D .. e
    meta_rebind_fraction: float = 0.0     # share of an episode's facts that rebind a key of episodes e-D .. e-1
    #                                       (blocks: share of a block's table rebinding the previous block's keys)
    meta_block_episodes: int = 0          # B > 0: long-horizon items in blocks of B episodes over one table (docstring)
    meta_block_facts: Optional[int] = None    # F: a block's table size; None -> facts_per_experience
    meta_recall_fraction: float = 0.5     # blocks: share of an episode's queries asking facts it did not present


@dataclass(frozen=True)
class ICRInfo(StreamInfo):
    """StreamInfo plus the facts. Tokens are vocabulary ids (keys and values as they appear in x)."""

    variant: str
    regions: List[Tuple[int, int]]                # key tokens [lo, hi) of each experience
    tables: List[Dict[int, int]]                  # table j: key token -> value token
    test_keys: List[List[int]]                    # the keys the test episodes of experience i query
    rebound: List[Dict[int, Tuple[int, int]]]     # table j's rebindings: key -> (old value, new value)

    def bindings_after(self, j: int) -> Dict[int, int]:
        """The latest value of every key of tables 0..j (key token -> value token)."""
        latest: Dict[int, int] = {}
        for table in self.tables[: j + 1]:
            latest.update(table)
        return latest

    @property
    def facts_change(self) -> bool:
        """True when some table rebinds a key of an earlier table (then R_current can differ from R)."""
        return any(self.rebound)

    def labels_in_force(self, exp: int, after: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Labels of experience ``exp``'s test items (x, y [B, T]) scored against the bindings in force after
        experience ``after``: at every scored position the query key is ``x`` at that position (the
        layout ``... q a ...`` with the label on q), its answer the key's latest value. Unscored stay -100."""
        lut = torch.full((self.vocab_size,), IGNORE, dtype=torch.int64)
        for key, value in self.bindings_after(max(exp, after)).items():
            lut[key] = value
        scored = scored_mask(y)
        out = y.clone()
        out[scored] = lut[x[scored]]
        return out

    def token_name(self, token: int) -> str:
        n_keys = self.config.n_keys
        if token == PAD:
            return "PAD"
        if token == SEP:
            return "SEP"
        return f"k{token - 2}" if token < 2 + n_keys else f"v{token - 2 - n_keys}"


def icr_config(user: Any = None) -> ICRConfig:
    """The validated ICR config: ``user`` (dict, DictConfig, ICRConfig or None) merged onto the defaults,
    variant defaults filled in. Raises ValueError for unknown keys, bad types and impossible sizes."""
    cfg = load_config(ICRConfig, user, "icr config")
    if cfg.rebind_fraction is not None:
        require(cfg.rebind_across is None, "icr config", "set rebind_across or rebind_fraction, not both")
        require(0 <= cfg.rebind_fraction <= 0.5, "icr config",
                f"rebind_fraction must be in [0, 0.5] (table j rebinds keys table j-1 introduced), got {cfg.rebind_fraction}")
        cfg = replace(cfg, rebind_across=int(round(cfg.rebind_fraction * cfg.facts_per_experience)))
    fill = _POSITIONAL_DEFAULTS if cfg.variant == "positional" else {"rebind_within": 0, "rebind_across": 0}
    cfg = replace(cfg, **{k: v for k, v in fill.items() if getattr(cfg, k) is None})
    _check(cfg)
    return cfg


def key_regions(cfg: ICRConfig) -> List[Tuple[int, int]]:
    """Key tokens [lo, hi) of each experience: K windows of width w, evenly spaced over the key tokens."""
    K, n = cfg.n_experiences, cfg.n_keys
    if K == 1:
        return [(2, 2 + n)]
    if cfg.key_overlap == 0:
        width = n // K
    else:
        width = int(n / (1 + (K - 1) * (1 - cfg.key_overlap)))
    # integer floor division: starts differ by >= width when the windows must not overlap
    return [(2 + j * (n - width) // (K - 1), 2 + j * (n - width) // (K - 1) + width) for j in range(K)]


def train_len(cfg: ICRConfig) -> int:
    return 2 * (cfg.facts_per_episode + cfg.rebind_within) + 1 + 2 * cfg.queries_per_episode


def test_len(cfg: ICRConfig) -> int:
    return 1 + 2 * cfg.test_queries


def _check(cfg: ICRConfig) -> None:
    what = "icr config"
    require(cfg.variant in VARIANTS, what, f"variant must be one of {VARIANTS}, got {cfg.variant!r}")
    for key in ("n_experiences", "n_keys", "n_values", "facts_per_experience", "facts_per_episode",
                "queries_per_episode", "train_episodes", "test_episodes", "test_queries", "meta_train_episodes"):
        require(getattr(cfg, key) >= 1, what, f"{key} must be >= 1, got {getattr(cfg, key)}")
    for key in ("seed", "meta_seed", "rebind_within", "rebind_across"):
        require(getattr(cfg, key) >= 0, what, f"{key} must be >= 0, got {getattr(cfg, key)}")
    require(0 <= cfg.key_overlap < 1, what, f"key_overlap must be in [0, 1), got {cfg.key_overlap}")
    if cfg.variant == "basic":
        require(cfg.rebind_within == 0, what, "rebind_within applies to variant 'positional' only")
    else:
        require(cfg.key_overlap == 0, what, "key_overlap applies to variant 'basic' only "
                "(positional revises facts explicitly, with rebind_across)")
    require(cfg.key_overlap == 0 or cfg.rebind_across == 0, what,
            "key_overlap and rebind_across cannot be combined (a shared key would have two values)")
    require(cfg.n_values >= 2 or cfg.rebind_within + cfg.rebind_across == 0, what,
            "rebinding a key to a different value needs n_values >= 2")
    width = key_regions(cfg)[0][1] - key_regions(cfg)[0][0]
    require(cfg.facts_per_experience <= width, what,
            f"more facts than keys: facts_per_experience={cfg.facts_per_experience} but each experience's key "
            f"region has {width} keys (n_keys={cfg.n_keys}, n_experiences={cfg.n_experiences}, "
            f"key_overlap={cfg.key_overlap})")
    require(cfg.facts_per_episode <= cfg.facts_per_experience, what,
            f"facts_per_episode={cfg.facts_per_episode} exceeds the table size facts_per_experience="
            f"{cfg.facts_per_experience}")
    require(cfg.facts_per_episode <= cfg.n_keys, what,
            f"more facts than keys: facts_per_episode={cfg.facts_per_episode} > n_keys={cfg.n_keys}")
    require(cfg.queries_per_episode <= cfg.facts_per_episode, what,
            f"queries_per_episode={cfg.queries_per_episode} exceeds facts_per_episode={cfg.facts_per_episode} "
            "(queries are distinct presented keys)")
    require(cfg.rebind_within <= cfg.queries_per_episode, what,
            f"rebind_within={cfg.rebind_within} exceeds queries_per_episode={cfg.queries_per_episode} "
            "(every rebound key is queried)")
    require(2 * cfg.rebind_across <= cfg.facts_per_experience, what,
            f"rebind_across={cfg.rebind_across}: table j rebinds keys that table j-1 introduced, so "
            f"2 * rebind_across must be <= facts_per_experience={cfg.facts_per_experience}")
    later_rebound = cfg.rebind_across if cfg.n_experiences > 1 and not cfg.test_rebound_keys else 0
    testable = cfg.facts_per_experience - later_rebound
    require(cfg.test_queries <= testable, what,
            f"test_queries={cfg.test_queries} exceeds the {testable} keys of a table that no later table rebinds")
    E, D = cfg.meta_sequence_episodes, cfg.meta_reach_back
    require(E >= 1, what, f"meta_sequence_episodes must be >= 1, got {E}")
    require(0 <= D < E, what, f"meta_reach_back must be in [0, meta_sequence_episodes - 1] = [0, {E - 1}], got {D}")
    require(0 <= cfg.meta_rebind_fraction <= 1, what, f"meta_rebind_fraction must be in [0, 1], got {cfg.meta_rebind_fraction}")
    require(cfg.meta_rebind_fraction == 0 or D >= 1, what,
            "meta_rebind_fraction > 0 needs meta_reach_back >= 1 (a rebound key is one an earlier episode bound)")
    require(cfg.meta_rebind_fraction == 0 or cfg.n_values >= 2, what, "meta_rebind_fraction > 0 needs n_values >= 2")
    B = cfg.meta_block_episodes
    require(B >= 0, what, f"meta_block_episodes must be >= 0 (0 = episodes with their own facts), got {B}")
    if B == 0:
        for key, default in (("meta_block_facts", None), ("meta_recall_fraction", 0.5)):
            require(getattr(cfg, key) == default, what, f"{key} applies to meta_block_episodes > 0 only")
        require((D + 1) * cfg.facts_per_episode <= cfg.n_keys, what,
                f"meta_reach_back={D}: {D + 1} episodes of {cfg.facts_per_episode} facts with distinct keys need "
                f"{(D + 1) * cfg.facts_per_episode} keys, but n_keys={cfg.n_keys}")
    else:
        F = block_facts(cfg)
        require(cfg.facts_per_episode <= F <= cfg.n_keys, what,
                f"meta_block_facts={F} must be in [facts_per_episode={cfg.facts_per_episode}, n_keys={cfg.n_keys}] "
                "(an episode presents facts of its block's table)")
        again = int(round(cfg.meta_rebind_fraction * F))
        require(2 * F - again <= cfg.n_keys, what,
                f"meta_block_facts={F}: a block takes {F - again} keys outside the previous block's {F}, "
                f"so n_keys={cfg.n_keys} must be >= {2 * F - again}")
        require(0 <= cfg.meta_recall_fraction <= 1, what,
                f"meta_recall_fraction must be in [0, 1], got {cfg.meta_recall_fraction}")
        require(cfg.meta_recall_fraction == 0 or D >= 1, what,
                "meta_recall_fraction > 0 needs meta_reach_back >= 1 (recalled facts were presented in earlier episodes)")
    require(2 * cfg.facts_per_episode <= cfg.n_keys, what,
            f"the delay probe's filler needs keys other than its {cfg.facts_per_episode} facts: "
            f"n_keys={cfg.n_keys} must be >= 2 * facts_per_episode")
    if cfg.seq_len is not None:
        need = max(train_len(cfg), test_len(cfg))
        require(cfg.seq_len >= need, what,
                f"episode too short for its facts: seq_len={cfg.seq_len}, but {cfg.facts_per_episode} facts "
                f"(+{cfg.rebind_within} rebound), SEP and {cfg.queries_per_episode} queries need {train_len(cfg)} "
                f"tokens, and {cfg.test_queries} test queries need {test_len(cfg)}")


@dataclass(frozen=True)
class _World:
    keys: List[np.ndarray]       # table j's key tokens
    values: List[np.ndarray]     # table j's value tokens (aligned with keys)
    test_keys: List[np.ndarray]
    rebound: List[Dict[int, Tuple[int, int]]]


def _world(cfg: ICRConfig) -> _World:
    """The K fact tables: a pure function of (cfg, seed)."""
    rng = seeded_rng("icr", "world", cfg.seed)
    v0 = 2 + cfg.n_keys
    base = rng.integers(0, cfg.n_values, cfg.n_keys) + v0    # basic: the one value of every key token k at base[k - 2]
    keys, values, rebound, fresh_prev = [], [], [], None
    for j, (lo, hi) in enumerate(key_regions(cfg)):
        r = cfg.rebind_across if j > 0 else 0
        fresh = rng.choice(np.arange(lo, hi), cfg.facts_per_experience - r, replace=False)
        old_keys = rng.choice(fresh_prev, r, replace=False) if r else np.zeros(0, np.int64)
        old_vals = dict(zip(keys[-1].tolist(), values[-1].tolist())) if r else {}
        old = np.array([old_vals[k] for k in old_keys.tolist()], np.int64)
        new = (old - v0 + 1 + rng.integers(0, max(cfg.n_values - 1, 1), r)) % cfg.n_values + v0
        keys.append(np.concatenate([fresh, old_keys]).astype(np.int64))
        values.append(np.concatenate([base[fresh - 2], new]).astype(np.int64))
        rebound.append({int(k): (int(a), int(b)) for k, a, b in zip(old_keys, old, new)})
        fresh_prev = fresh
    test_keys = []
    for i in range(cfg.n_experiences):
        later = set(rebound[i + 1]) if i + 1 < cfg.n_experiences and not cfg.test_rebound_keys else set()
        test_keys.append(np.array([k for k in keys[i].tolist() if k not in later], np.int64))
    return _World(keys, values, test_keys, rebound)


def _layout(pairs_k: np.ndarray, pairs_v: np.ndarray, ask_k: np.ndarray, ask_v: np.ndarray,
            length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """tokens, labels [length] int64 of ``k v ... SEP q a ... PAD...`` (no pairs: ``SEP q a ...``)."""
    tokens = np.full(length, PAD, np.int64)
    labels = np.full(length, IGNORE, np.int64)
    _layout_into(tokens, labels, 0, pairs_k, pairs_v, ask_k, ask_v)
    return torch.from_numpy(tokens), torch.from_numpy(labels)


def _layout_into(tokens: np.ndarray, labels: np.ndarray, at: int, pairs_k: np.ndarray, pairs_v: np.ndarray,
                 ask_k: np.ndarray, ask_v: np.ndarray) -> int:
    """Writes :func:`_layout`'s tokens and labels of one episode into ``tokens``/``labels`` from position
    ``at`` (the rest of the episode's span is left as it is: PAD / IGNORE when filled so). Returns the
    position of SEP."""
    n, q = 2 * len(pairs_k), 2 * len(ask_k)
    tokens[at:at + n:2] = pairs_k
    tokens[at + 1:at + n:2] = pairs_v
    sep = at + n
    tokens[sep] = SEP
    tokens[sep + 1:sep + 1 + q:2] = ask_k
    tokens[sep + 2:sep + 1 + q:2] = ask_v
    labels[sep + 1:sep + 1 + q:2] = ask_v
    return sep


def _presentation(keys: np.ndarray, values: np.ndarray, cfg: ICRConfig, rng: np.random.Generator):
    """The pairs presenting the facts (keys[i] -> values[i]) in random order; positional: ``rebind_within``
    of them twice, first with a stale value. Returns pairs_k, pairs_v and the indices of the twice-presented."""
    n, r, v0 = len(keys), cfg.rebind_within, 2 + cfg.n_keys
    twice = rng.choice(n, r, replace=False)
    stale = (values[twice] - v0 + 1 + rng.integers(0, max(cfg.n_values - 1, 1), r)) % cfg.n_values + v0
    # sort by priority; a stale binding gets a priority below its key's true one, so it comes first
    p_true = rng.random(n)
    p_stale = rng.random(r) * p_true[twice]
    if r == 0:                  # the basic variant: a shuffle of the facts (the same order, fewer copies)
        order = np.argsort(p_true, kind="stable")
        return keys[order], values[order], twice
    order = np.argsort(np.concatenate([p_true, p_stale]), kind="stable")
    pairs_k = np.concatenate([keys, keys[twice]])[order]
    pairs_v = np.concatenate([values, stale])[order]
    return pairs_k, pairs_v, twice


def _present_and_query(keys: np.ndarray, values: np.ndarray, cfg: ICRConfig, rng: np.random.Generator,
                       length: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """A training episode over the facts (keys[i] -> values[i]); positional: rebind_within keys twice."""
    n, r = len(keys), cfg.rebind_within
    pairs_k, pairs_v, twice = _presentation(keys, values, cfg, rng)
    others = rng.permutation(np.setdiff1d(np.arange(n), twice))[: cfg.queries_per_episode - r]
    asked = rng.permutation(np.concatenate([twice, others]))
    return _layout(pairs_k, pairs_v, keys[asked], values[asked], length)


def _train_episode(cfg: ICRConfig, keys: np.ndarray, values: np.ndarray, length: int, exp: int, i: int):
    rng = seeded_rng("icr", "train", cfg.seed, exp, i)
    pick = rng.choice(len(keys), cfg.facts_per_episode, replace=False)
    return _present_and_query(keys[pick], values[pick], cfg, rng, length)


def _test_episode(cfg: ICRConfig, keys: np.ndarray, table: Dict[int, int], length: int, exp: int, i: int):
    rng = seeded_rng("icr", "test", cfg.seed, exp, i)
    ask = rng.choice(keys, cfg.test_queries, replace=False)
    answers = np.array([table[k] for k in ask.tolist()], np.int64)
    empty = np.zeros(0, np.int64)
    return _layout(empty, empty, ask, answers, length)


def _meta_episode(cfg: ICRConfig, length: int, i: int):
    rng = seeded_rng("icr", "meta", cfg.meta_seed, i)
    keys = rng.choice(cfg.n_keys, cfg.facts_per_episode, replace=False).astype(np.int64) + 2
    values = rng.integers(0, cfg.n_values, cfg.facts_per_episode) + 2 + cfg.n_keys
    return _present_and_query(keys, values, cfg, rng, length)


def _new_values(old: np.ndarray, cfg: ICRConfig, rng: np.random.Generator) -> np.ndarray:
    """A value token other than ``old`` for every entry, uniformly among the n_values - 1 others."""
    v0 = 2 + cfg.n_keys
    return (old - v0 + 1 + rng.integers(0, cfg.n_values - 1, len(old))) % cfg.n_values + v0


def _meta_sequence(cfg: ICRConfig, length: int, i: int):
    """Meta-training item i: one episode (E = 1, the original layout and random numbers) or E episodes
    in a row whose queries reach back ``meta_reach_back`` episodes (module docstring). x, y: [E * length]."""
    if cfg.meta_sequence_episodes == 1:
        return _meta_episode(cfg, length, i)
    x, y, _ = _meta_sequence_items(cfg, length, i)
    return x, y


def _meta_sequence_items(cfg: ICRConfig, length: int, i: int):
    """:func:`_meta_sequence`'s item i (E > 1) with its recalled mask: x, y [E * length] int64, recalled
    [E * length] bool; kept for the next call like :func:`_meta_block_items`'s."""
    return _last_item(_draw_meta_sequence_items, cfg, length, i)


def _draw_meta_sequence_items(cfg: ICRConfig, length: int, i: int):
    x, y = _draw_meta_sequence(cfg, length, i)
    return x, y, _recalled_from_tokens(x, y, length)


def _keys_outside(n_keys: int, taken) -> np.ndarray:
    """The key tokens 2 .. n_keys + 1 not in ``taken`` (tokens), ascending, int64: the array
    ``np.setdiff1d(np.arange(2, 2 + n_keys), taken)`` is, element for element (a known-answer test keeps
    the draws that take from it unchanged), by a mask instead of sorting the whole key space on each call
    (most of a meta-training item's time with 8,192 keys)."""
    keep = np.ones(n_keys, np.bool_)
    keep[np.asarray(taken, np.int64) - 2] = False
    return (np.flatnonzero(keep) + 2).astype(np.int64)


def _draw_meta_sequence(cfg: ICRConfig, length: int, i: int):
    E, D = cfg.meta_sequence_episodes, cfg.meta_reach_back
    rng = seeded_rng("icr", "meta_sequence", cfg.meta_seed, i)
    latest: Dict[int, int] = {}                  # key -> its newest value
    bound_in: List[List[int]] = []               # keys each episode bound
    xs, ys = [], []
    P, Q = cfg.facts_per_episode, cfg.queries_per_episode
    for e in range(E):
        window = sorted({k for keys in bound_in[max(0, e - D):] for k in keys})
        n_rebind = min(int(round(cfg.meta_rebind_fraction * P)), len(window))
        again = rng.choice(window, n_rebind, replace=False).astype(np.int64) if n_rebind else np.zeros(0, np.int64)
        fresh = rng.choice(_keys_outside(cfg.n_keys, window), P - n_rebind, replace=False).astype(np.int64)
        keys = np.concatenate([fresh, again])
        values = np.concatenate([
            rng.integers(0, cfg.n_values, len(fresh)) + 2 + cfg.n_keys,
            _new_values(np.array([latest[k] for k in again.tolist()], np.int64), cfg, rng),
        ]).astype(np.int64)
        pairs_k, pairs_v, twice = _presentation(keys, values, cfg, rng)
        latest.update(zip(keys.tolist(), values.tolist()))
        bound_in.append(keys.tolist())
        # every key rebound in this episode (across or within) is queried; the rest from the whole window
        must = np.union1d(again, keys[twice])
        reachable = sorted({k for ks in bound_in[max(0, e - D):] for k in ks} - set(must.tolist()))
        others = rng.choice(reachable, Q - len(must), replace=False) if Q > len(must) else np.zeros(0, np.int64)
        asked = rng.permutation(np.concatenate([must, others]).astype(np.int64))[:Q]
        answers = np.array([latest[k] for k in asked.tolist()], np.int64)
        x, y = _layout(pairs_k, pairs_v, asked, answers, length)
        xs.append(x)
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)


def block_facts(cfg: ICRConfig) -> int:
    """F: the table size of a long-horizon meta-training block."""
    return cfg.meta_block_facts if cfg.meta_block_facts is not None else cfg.facts_per_experience


# Meta-training reads item i three times in a row (its x, y, its recalled mask, its reach-back:
# strategies/training/meta.py), and a long-horizon item costs milliseconds to draw: the last item drawn is
# kept, keyed by the drawing function, the config object itself (held here, so its id cannot be reused),
# the length and the index. Items are pure functions of these, so the memo changes no value.
_LAST_ITEM: list = [None]


def _last_item(draw, cfg: ICRConfig, length: int, i: int):
    """``draw(cfg, length, i)``, or the item the previous call returned for the same four. The tensors are
    shared with the next call for the same item: read them, do not write to them."""
    last = _LAST_ITEM[0]
    if last is not None and last[0] is draw and last[1] is cfg and last[2] == length and last[3] == i:
        return last[4]
    item = draw(cfg, length, i)
    _LAST_ITEM[0] = (draw, cfg, length, i, item)
    return item


def _meta_block_items(cfg: ICRConfig, length: int, i: int):
    """Long-horizon meta-training item i (``meta_block_episodes`` B > 0, module docstring): E episodes in
    blocks of B over one table each. Returns x, y [E * length] int64 and recalled [E * length] bool (the
    answers to facts the episode did not present). Kept for the next call (:func:`_last_item`)."""
    return _last_item(_draw_meta_block_items, cfg, length, i)


def _draw_meta_block_items(cfg: ICRConfig, length: int, i: int):
    E, D, B, F = cfg.meta_sequence_episodes, cfg.meta_reach_back, cfg.meta_block_episodes, block_facts(cfg)
    P, Q = cfg.facts_per_episode, cfg.queries_per_episode
    rng = seeded_rng("icr", "meta_blocks", cfg.meta_seed, i)
    bound_in_block = np.full(cfg.n_keys, -1, np.int64)   # the block that last put key k in its table (-1: never)
    latest: Dict[int, int] = {}                           # key -> its newest *presented* value
    last_seen: Dict[int, int] = {}                        # key -> the episode that last presented it
    table_k = np.zeros(0, np.int64)
    table_v = np.zeros(0, np.int64)
    pending: set = set()                                  # keys of this block's table not presented yet
    # the item is written in place (E episodes of ``length``): building and concatenating E small tensors
    # per item cost as much as drawing it. Every random number is drawn as before, in the same order.
    xs = np.full(E * length, PAD, np.int64)
    ys = np.full(E * length, IGNORE, np.int64)
    ms = np.zeros(E * length, np.bool_)
    n_recall_wanted = int(round(cfg.meta_recall_fraction * Q))
    for e in range(E):
        if e % B == 0:                                    # a new block: a new table
            block = e // B
            n_again = min(int(round(cfg.meta_rebind_fraction * F)), len(table_k))
            again = rng.choice(table_k, n_again, replace=False) if n_again else np.zeros(0, np.int64)
            outside = _keys_outside(cfg.n_keys, table_k)
            # the keys bound longest ago first (never bound before any), ties at random: old facts stay
            # valid as long as the key space allows, so queries can reach back across blocks
            order = np.lexsort((rng.random(len(outside)), bound_in_block[outside - 2]))
            fresh = outside[order[:F - n_again]]
            in_table = dict(zip(table_k.tolist(), table_v.tolist()))
            old_of_again = np.array([in_table[k] for k in again.tolist()], np.int64)
            table_k = np.concatenate([fresh, again]).astype(np.int64)
            table_v = np.concatenate([rng.integers(0, cfg.n_values, len(fresh)) + 2 + cfg.n_keys,
                                      _new_values(old_of_again, cfg, rng)]).astype(np.int64)
            bound_in_block[table_k - 2] = block
            pending = set(table_k.tolist())
        pick = rng.choice(F, P, replace=False)
        keys, values = table_k[pick], table_v[pick]
        pairs_k, pairs_v, twice = _presentation(keys, values, cfg, rng)
        shown = keys.tolist()
        shown_set = set(shown)
        # recallable: facts presented in episodes e-D .. e-1, not in this episode, whose newest binding the
        # model has seen (a key of this block's table still pending would be answered with a value to come)
        recallable = sorted(k for k, at in last_seen.items()
                            if at >= e - D and k not in pending and k not in shown_set)
        latest.update(zip(shown, values.tolist()))
        last_seen.update(dict.fromkeys(shown, e))
        pending -= shown_set
        n_recall = min(n_recall_wanted, Q - len(twice), len(recallable))
        once = np.ones(P, np.bool_)
        once[twice] = False                               # np.flatnonzero(once) == setdiff1d(arange(P), twice)
        others = rng.permutation(np.flatnonzero(once))[: Q - n_recall - len(twice)]
        current = keys[np.concatenate([twice, others]).astype(np.int64)]
        recalled = rng.choice(np.array(recallable, np.int64), n_recall, replace=False) if n_recall else np.zeros(0, np.int64)
        asked = rng.permutation(np.concatenate([current, recalled]).astype(np.int64))
        asked_list = asked.tolist()
        answers = np.array([latest[k] for k in asked_list], np.int64)
        sep = _layout_into(xs, ys, e * length, pairs_k, pairs_v, asked, answers)
        recalled_set = set(recalled.tolist())
        for j, k in enumerate(asked_list):                # _layout: k v ... SEP q a ...
            if k in recalled_set:
                ms[sep + 1 + 2 * j] = True
    return torch.from_numpy(xs), torch.from_numpy(ys), torch.from_numpy(ms)


def _meta_block_sequence(cfg: ICRConfig, length: int, i: int):
    x, y, _ = _meta_block_items(cfg, length, i)
    return x, y


def _meta_recalled(cfg: ICRConfig, length: int, i: int) -> torch.Tensor:
    """bool [E * length]: the positions of meta-training item i's answers to facts it did not present in
    the same episode (the auxiliary retention loss, ``meta_train.retention_loss``, weighs them)."""
    if cfg.meta_block_episodes > 0:
        return _meta_block_items(cfg, length, i)[2]
    if cfg.meta_sequence_episodes == 1:      # one episode recalls nothing: no need to draw it again
        return torch.zeros(length, dtype=torch.bool)
    return _meta_sequence_items(cfg, length, i)[2]


def _recalled_from_tokens(x: torch.Tensor, y: torch.Tensor, length: int) -> torch.Tensor:
    """bool [E * length]: the scored answers whose asked key the episode did not present (an episode's
    presented keys are its tokens before SEP)."""
    mask = torch.zeros_like(y, dtype=torch.bool)
    for e in range(len(y) // length):
        xe, ye = x[e * length:(e + 1) * length], y[e * length:(e + 1) * length]
        sep = int((xe == SEP).nonzero()[0])
        presented = set(xe[:sep:2].tolist())
        for t in scored_mask(ye).nonzero().flatten().tolist():
            mask[e * length + t] = int(xe[t]) not in presented
    return mask


def _meta_reach(cfg: ICRConfig, length: int, i: int) -> torch.Tensor:
    """int16 [E * length]: at each of meta-training item i's recalled answers (:func:`_meta_recalled`), the
    episodes since the asked fact was last in the input (1: the episode before), presented or asked: an
    asked key is followed by its answer, the newest binding (teacher forcing), so a fact asked in an
    earlier episode is in front of the model again; 0 elsewhere. Read from the item's own tokens, so it
    holds for either layout: what the meta-training score by reach-back (``strategies.training.meta``)
    splits the recalled answers by."""
    if cfg.meta_block_episodes > 0:
        x, _, recalled = _meta_block_items(cfg, length, i)
    elif cfg.meta_sequence_episodes == 1:
        return torch.zeros(length, dtype=torch.int16)
    else:
        x, _, recalled = _meta_sequence_items(cfg, length, i)
    reach = torch.zeros(recalled.shape, dtype=torch.int16)
    last_seen: dict = {}
    for e in range(len(x) // length):
        xe = x[e * length:(e + 1) * length]
        for t in recalled[e * length:(e + 1) * length].nonzero().flatten().tolist():
            reach[e * length + t] = e - last_seen[int(xe[t])]
        sep = int((xe == SEP).nonzero()[0])
        last_seen.update((k, e) for k in xe[:sep:2].tolist())
        # an asked key is followed by its answer in the input (teacher forcing), its newest binding: the
        # fact is in front of the model again, so the next recall of it reaches back from here
        asked = xe[sep + 1::2]
        last_seen.update((k, e) for k in asked[(asked >= 2) & (asked < 2 + cfg.n_keys)].tolist())
    return reach


def _delay_episode(cfg: ICRConfig, length: int, filler: int, i: int):
    """Delay-probe item i: P fresh facts, ``filler`` meta-training episodes over other keys, then SEP and
    Q scored queries of the first facts (module docstring). x, y: [2 * (P + rebind_within) + filler * length + 1 + 2 Q]."""
    rng = seeded_rng("icr", "delay", cfg.meta_seed, filler, i)
    P = cfg.facts_per_episode
    keys = rng.choice(cfg.n_keys, P, replace=False).astype(np.int64) + 2
    values = rng.integers(0, cfg.n_values, P) + 2 + cfg.n_keys
    pairs_k, pairs_v, twice = _presentation(keys, values, cfg, rng)
    others = _keys_outside(cfg.n_keys, keys)
    parts_x, parts_y = [], []
    for _ in range(filler):
        fk = rng.choice(others, P, replace=False).astype(np.int64)
        fv = rng.integers(0, cfg.n_values, P) + 2 + cfg.n_keys
        fx, _ = _present_and_query(fk, fv, cfg, rng, length)
        parts_x.append(fx)
        parts_y.append(torch.full_like(fx, IGNORE))     # the filler's own queries are not scored
    asked_idx = np.concatenate([twice, rng.permutation(np.setdiff1d(np.arange(P), twice))])[: cfg.queries_per_episode]
    asked = keys[rng.permutation(asked_idx)]
    value_of = dict(zip(keys.tolist(), values.tolist()))
    answers = np.array([value_of[k] for k in asked.tolist()], np.int64)
    context = np.stack([pairs_k, pairs_v], -1).reshape(-1)
    head = torch.from_numpy(context.astype(np.int64))
    tail_x, tail_y = _layout(np.zeros(0, np.int64), np.zeros(0, np.int64), asked, answers, 1 + 2 * len(asked))
    x = torch.cat([head, *parts_x, tail_x])
    y = torch.cat([torch.full_like(head, IGNORE), *parts_y, tail_y])
    return x, y


def delay_probe(cfg: Any, filler_episodes: int, n: int) -> EpisodeDataset:
    """``n`` delay-probe items with ``filler_episodes`` episodes (``filler_episodes * train_len`` tokens)
    between the facts and their queries; from the meta-training seed's own random stream."""
    cfg = cfg if isinstance(cfg, ICRConfig) else icr_config(cfg)       # an ICRConfig is already resolved
    if filler_episodes < 0 or n < 1:
        raise ValueError(f"icr delay probe: filler_episodes must be >= 0 and n >= 1, got {filler_episodes}, {n}")
    return EpisodeDataset(_delay_episode, (cfg, cfg.seq_len or train_len(cfg), filler_episodes), n)


#: what stands between the facts and their queries in an interference probe (module docstring)
INTERFERENCE_KINDS = ("neutral", "same_region", "other_region", "repeat")


def _interference_episode(cfg: ICRConfig, kind: str, items: int, i: int):
    """Interference-probe item i: P fresh facts over region i mod K, ``items`` intervening bindings of
    ``kind``, SEP and Q scored queries of the facts. x, y: [2 * (P + rebind_within) + 2 * items + 1 + 2 Q]."""
    rng = seeded_rng("icr", "interference", cfg.meta_seed, INTERFERENCE_KINDS.index(kind), items, i)
    regions = key_regions(cfg)
    r = i % len(regions)
    P = cfg.facts_per_episode
    region = np.arange(*regions[r])
    keys = rng.choice(region, P, replace=False).astype(np.int64)
    values = rng.integers(0, cfg.n_values, P) + 2 + cfg.n_keys
    pairs_k, pairs_v, _ = _presentation(keys, values, cfg, rng)
    if kind == "neutral":
        filler = np.full(2 * items, SEP, np.int64)
    else:
        if kind == "repeat":
            idx = rng.integers(0, P, items)
            fk, fv = keys[idx], values[idx]
        else:
            pool = np.setdiff1d(region if kind == "same_region" else np.arange(*regions[(r + 1) % len(regions)]), keys)
            fk = rng.choice(pool, items, replace=True).astype(np.int64)
            fv = rng.integers(0, cfg.n_values, items) + 2 + cfg.n_keys
        filler = np.stack([fk, fv], -1).reshape(-1).astype(np.int64)
    asked = keys[rng.permutation(P)[: cfg.queries_per_episode]]
    value_of = dict(zip(keys.tolist(), values.tolist()))
    answers = np.array([value_of[k] for k in asked.tolist()], np.int64)
    head = torch.from_numpy(np.stack([pairs_k, pairs_v], -1).reshape(-1).astype(np.int64))
    middle = torch.from_numpy(filler)
    tail_x, tail_y = _layout(np.zeros(0, np.int64), np.zeros(0, np.int64), asked, answers, 1 + 2 * len(asked))
    x = torch.cat([head, middle, tail_x])
    y = torch.cat([torch.full_like(head, IGNORE), torch.full_like(middle, IGNORE), tail_y])
    return x, y


def interference_probe(cfg: Any, kind: str, items: int, n: int) -> EpisodeDataset:
    """``n`` interference-probe items with ``items`` intervening bindings of ``kind`` (module docstring)
    between the facts and their queries; from the meta-training seed's own random stream."""
    cfg = cfg if isinstance(cfg, ICRConfig) else icr_config(cfg)
    what = "icr interference probe"
    require(kind in INTERFERENCE_KINDS, what, f"kind must be one of {INTERFERENCE_KINDS}, got {kind!r}")
    require(items >= 0 and n >= 1, what, f"items must be >= 0 and n >= 1, got {items}, {n}")
    widths = [hi - lo for lo, hi in key_regions(cfg)]
    require(kind != "same_region" or min(widths) > cfg.facts_per_episode, what,
            f"same_region needs a key region wider than facts_per_episode={cfg.facts_per_episode} (the "
            f"narrowest has {min(widths)} keys)")
    require(kind != "other_region" or len(widths) > 1, what, "other_region needs n_experiences >= 2")
    return EpisodeDataset(_interference_episode, (cfg, kind, items), n)


def _capacity_episode(cfg: ICRConfig, facts: int, i: int):
    """Capacity-probe item i: ``facts`` distinct keys bound once, SEP, Q queries drawn from all of them.
    x, y: [2 * facts + 1 + 2 Q]."""
    rng = seeded_rng("icr", "capacity", cfg.meta_seed, facts, i)
    keys = rng.choice(cfg.n_keys, facts, replace=False).astype(np.int64) + 2
    values = rng.integers(0, cfg.n_values, facts) + 2 + cfg.n_keys
    asked_idx = rng.choice(facts, cfg.queries_per_episode, replace=facts < cfg.queries_per_episode)
    return _layout(keys, values, keys[asked_idx], values[asked_idx], 2 * facts + 1 + 2 * cfg.queries_per_episode)


def capacity_probe(cfg: Any, facts: int, n: int) -> EpisodeDataset:
    """``n`` capacity-probe items of ``facts`` facts each (module docstring)."""
    cfg = cfg if isinstance(cfg, ICRConfig) else icr_config(cfg)
    require(1 <= facts <= cfg.n_keys and n >= 1, "icr capacity probe",
            f"facts must be in [1, n_keys={cfg.n_keys}] (distinct keys) and n >= 1, got {facts}, {n}")
    return EpisodeDataset(_capacity_episode, (cfg, facts), n)


def icr_data(cfg: Any = None) -> StreamData:
    """The ICR stream without Avalanche: K train/test EpisodeDatasets, meta-training, ICRInfo."""
    cfg = icr_config(cfg)
    world = _world(cfg)
    T_train = cfg.seq_len or train_len(cfg)
    T_test = cfg.seq_len or test_len(cfg)
    tables = [dict(zip(k.tolist(), v.tolist())) for k, v in zip(world.keys, world.values)]
    train, test = [], []
    for j in range(cfg.n_experiences):
        train.append(EpisodeDataset(_train_episode, (cfg, world.keys[j], world.values[j], T_train, j),
                                    cfg.train_episodes))
        test.append(EpisodeDataset(_test_episode, (cfg, world.test_keys[j], tables[j], T_test, j), cfg.test_episodes))
    make = _meta_block_sequence if cfg.meta_block_episodes > 0 else _meta_sequence
    meta = EpisodeDataset(make, (cfg, T_train), cfg.meta_train_episodes)
    recalled = EpisodeDataset(_meta_recalled, (cfg, T_train), cfg.meta_train_episodes)
    reach = EpisodeDataset(_meta_reach, (cfg, T_train), cfg.meta_train_episodes)
    info = ICRInfo(
        name="icr", metric="accuracy", n_experiences=cfg.n_experiences, seq_len=T_train, test_seq_len=T_test,
        vocab_size=2 + cfg.n_keys + cfg.n_values, config=cfg, variant=cfg.variant, regions=key_regions(cfg),
        tables=tables, test_keys=[k.tolist() for k in world.test_keys], rebound=world.rebound,
    )
    return StreamData(train, test, meta, info, delay_probe=partial(delay_probe, cfg),
                      interference_probe=partial(interference_probe, cfg), capacity_probe=partial(capacity_probe, cfg),
                      meta_recalled=recalled, meta_reach=reach)


def icr_benchmark(cfg: Any = None):
    """The ICR stream as an Avalanche benchmark, with ``.info`` (ICRInfo) and ``.meta_train``."""
    return to_benchmark(icr_data(cfg))
