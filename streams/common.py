"""What every stream shares: seeding, config validation, per-index episode datasets, the Avalanche glue.

A stream module (``icr``, ``icl``, ``text``) builds a :class:`StreamData`: K training datasets, K test
datasets, an optional meta-training dataset and a :class:`StreamInfo` (the metadata a runner needs).
:func:`to_benchmark` turns it into an Avalanche benchmark; it is the only function here that imports
Avalanche, and it does so lazily, so the generators stay importable (and fast to import, e.g. in a
subprocess) without it.

Item format (every dataset, every stream)::

    x: [T] int64 tokens            (continuous ICL: [T, d_in] float32 input vectors)
    y: [T] int64 labels, -100 where nothing is scored; y[t] is what the model must predict AT t
                                   (continuous ICL: [T, d_out] float32 targets, NaN where not scored)

Inside an Avalanche benchmark each item becomes ``(x, y, t)`` with ``t`` the task label (the
experience index; 0 for meta-training). All items of one dataset have the same T.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, List, Optional, Tuple

import zlib

import numpy as np
import torch
from torch.utils.data import Dataset

from ovq_cl.base import IGNORE, scored_mask, validate

# First entropy words of every random stream, so that two streams (or two purposes) with the same
# seed never share random numbers. Built-in streams keep their small tags (their data must not change);
# any other name (a user's stream, a user's purpose) is tagged by a hash of the name.
STREAM_TAGS = {"icr": 1, "icl": 2, "text": 3}
PURPOSE_TAGS = {"world": 0, "train": 1, "test": 2, "meta": 3, "split": 4}


def _tag(name: str, known: dict) -> int:
    return known[name] if name in known else 1000 + zlib.crc32(name.encode("utf-8"))


@dataclass
class EpisodeStreamConfig:
    """The options every episode stream has (each stream's config subclasses this)."""

    train_episodes: int = 32              # per experience
    test_episodes: int = 8                # per experience
    meta_train_episodes: int = 1024
    seed: int = 0                         # in a run: the run's seed unless set (experiments.config.with_data_seed)
    meta_seed: Optional[int] = None       # None -> seed (meta-training has its own random stream anyway)


def seeded_rng(stream: str, purpose: str, seed: int, *index: int) -> np.random.Generator:
    """The numpy Generator of one (stream, purpose, seed, index...) tuple, through ``SeedSequence``.

    A pure function of its arguments: the same tuple gives the same numbers in any process, in any
    order of calls, and different tuples give independent numbers.
    """
    entropy = [_tag(stream, STREAM_TAGS), _tag(purpose, PURPOSE_TAGS), int(seed), *(int(i) for i in index)]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def load_config(schema: type, user: Any, what: str):
    """``user`` (dict, DictConfig, dataclass or None) merged onto ``schema``; ``meta_seed`` None -> ``seed``.

    Unknown keys and wrong types raise ValueError naming the key (omegaconf's message). Each stream
    then checks the sizes and raises ValueError for configs that are well typed but impossible.
    """
    cfg = validate(schema, user, what)
    if getattr(cfg, "meta_seed", 0) is None:
        cfg = replace(cfg, meta_seed=cfg.seed)
    return cfg


def require(ok: bool, what: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{what}: {message}")


@dataclass(frozen=True)
class StreamInfo:
    """Metadata of a stream, the same for all streams (each stream subclasses it with its own facts).

    metric: "accuracy" (ICR), "mse" (ICL), "bits_per_byte" (text).
    seq_len / test_seq_len: T of the training (and meta-training) items / of the test items.
    vocab_size: size of the token vocabulary; None for the continuous ICL encoding.
    """

    name: str
    metric: str
    n_experiences: int
    seq_len: int
    test_seq_len: int
    vocab_size: Optional[int]
    config: Any

    @property
    def facts_change(self) -> bool:
        """True for streams where a later experience changes the right answer to an earlier one's test
        items (then the runner also scores against :meth:`labels_in_force`). False here."""
        return False

    def labels_in_force(self, exp: int, after: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Labels of experience ``exp``'s test items (x, y) under the facts in force after experience
        ``after``. Streams whose facts never change return y."""
        return y

    @property
    def metric_context(self) -> dict:
        """Keyword arguments a metric that needs them (``needs_context``) gets from the stream."""
        return {}


@dataclass
class StreamData:
    """Everything a stream generates, before Avalanche: ``train[j]``/``test[j]`` are experience j's datasets.

    ``meta_train``: an :class:`EpisodeDataset` or None (no meta-training). It must be one because the
    learned gate measures the model on episodes meta-training never saw, drawn past its end
    (:func:`held_out`); a plain Dataset is refused here, before anything runs, not after meta-training.

    ``delay_probe(filler_episodes, n)``, where the stream has one (ICR): a dataset of ``n`` items whose
    scored answers were bound ``filler_episodes`` training episodes earlier (``filler_episodes *
    info.seq_len`` tokens): what the delay-recall curve (``strategies.evaluation.delay``) measures.

    ``interference_probe(kind, items, n)``, where the stream has one (ICR): ``n`` items whose scored
    facts were presented once, ``items`` bindings of ``kind`` earlier (e.g. ``neutral``: no binding,
    ``other_region``: another experience's keys): what the interference curves
    (``strategies.evaluation.interference``) measure; ``capacity_probe(facts, n)``: ``n`` items of
    ``facts`` facts bound once and then queried (the capacity curve).

    ``meta_recalled``, where the stream has it (ICR): item i is a bool tensor shaped like meta-training
    item i's labels, True at the answers to facts that item did not present in the same episode (recalled
    from earlier episodes): what the auxiliary retention loss (``meta_train.retention_loss``) weighs;
    ``meta_reach``: item i is an int16 tensor shaped like it, at those answers the episodes since the
    asked fact was last presented (0 elsewhere): meta-training's score on them by reach-back.

    ``position_probe(domain, length, n)``, where the stream has it (text with ``long_bytes``): ``n``
    held-out documents of ``length`` tokens of experience ``domain``'s domain, for the position curve
    (``strategies.evaluation.position``).
    """

    train: List[Dataset]
    test: List[Dataset]
    meta_train: Optional["EpisodeDataset"]
    info: StreamInfo
    delay_probe: Optional[Callable[[int, int], Dataset]] = None
    interference_probe: Optional[Callable[[str, int, int], Dataset]] = None
    capacity_probe: Optional[Callable[[int, int], Dataset]] = None
    meta_recalled: Optional["EpisodeDataset"] = None
    meta_reach: Optional["EpisodeDataset"] = None
    position_probe: Optional[Callable[[int, int, int], Dataset]] = None

    def __post_init__(self) -> None:
        if self.meta_train is not None and not isinstance(self.meta_train, EpisodeDataset):
            raise TypeError(f"stream {self.info.name!r}: meta_train must be a streams.common.EpisodeDataset (the "
                            "learned gate draws held-out episodes past its end) or None, got "
                            f"{type(self.meta_train).__name__}")


class EpisodeDataset(Dataset):
    """``n`` episodes, item i = ``fn(*args, i)``, computed on demand.

    Every item is a pure function of its index, so the dataset holds no tensors, any access order
    (shuffled, by lanes, in workers) gives the same items, and it pickles if ``fn`` is a module-level
    function and ``args`` pickle.
    """

    def __init__(self, fn: Callable[..., Tuple[torch.Tensor, torch.Tensor]], args: tuple, n: int, offset: int = 0):
        self.fn, self.args, self.n, self.offset = fn, args, n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if not -self.n <= i < self.n:
            raise IndexError(f"episode {i} of {self.n}")
        return self.fn(*self.args, self.offset + i % self.n)


def held_out(dataset: EpisodeDataset, n: int) -> EpisodeDataset:
    """``n`` episodes of the same generator that ``dataset`` never yields: indices ``len(dataset) ..
    len(dataset) + n - 1`` of its random stream (every episode is a pure function of its index)."""
    if not isinstance(dataset, EpisodeDataset):
        raise TypeError(f"held_out needs an EpisodeDataset, got {type(dataset).__name__}")
    return EpisodeDataset(dataset.fn, dataset.args, n, offset=dataset.offset + dataset.n)


def stack_items(dataset: Dataset) -> Tuple[torch.Tensor, torch.Tensor]:
    """All items of a dataset, stacked in order: x [N, T, ...], y [N, T, ...] (task labels dropped)."""
    items = [dataset[i] for i in range(len(dataset))]
    return torch.stack([it[0] for it in items]), torch.stack([it[1] for it in items])


def to_benchmark(data: StreamData):
    """An Avalanche benchmark (CLScenario) of ``data``: ``train_stream`` and ``test_stream`` of K experiences.

    Experience j carries task label j (``experience.task_label``) and its dataset yields ``(x, y, j)``.
    The benchmark also gets eight attributes: ``info`` (``data.info``), ``meta_train`` (an
    AvalancheDataset with task label 0, or None), ``meta_train_episodes`` (the plain
    :class:`EpisodeDataset`, or None), ``delay_probe``, ``interference_probe``, ``capacity_probe``, ``meta_recalled``, ``meta_reach`` and ``position_probe`` (or None).
    """
    import ovq_cl.base.avalanche_compat  # noqa: F401  (before any avalanche import)
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.scenarios.task_aware import with_task_labels
    from avalanche.benchmarks.utils import ConstantSequence, TaskLabels, make_avalanche_dataset

    def labelled(dataset: Dataset, task: int):
        return make_avalanche_dataset(dataset, data_attributes=[TaskLabels(ConstantSequence(task, len(dataset)))])

    bench = with_task_labels(
        benchmark_from_datasets(
            train=[labelled(d, j) for j, d in enumerate(data.train)],
            test=[labelled(d, j) for j, d in enumerate(data.test)],
        )
    )
    bench.info = data.info
    bench.meta_train = None if data.meta_train is None else labelled(data.meta_train, 0)
    bench.meta_train_episodes = data.meta_train          # the plain EpisodeDataset (for held_out)
    bench.delay_probe = data.delay_probe
    bench.interference_probe = data.interference_probe
    bench.capacity_probe = data.capacity_probe
    bench.meta_recalled = data.meta_recalled
    bench.meta_reach = data.meta_reach
    bench.position_probe = data.position_probe
    return bench


__all__ = [
    "EpisodeDataset", "IGNORE", "StreamData", "StreamInfo", "held_out", "load_config", "require",
    "scored_mask", "seeded_rng", "stack_items", "to_benchmark",
]
