"""Meta-training: the first phase of a run, before the stream (fresh state per episode).

The model learns the task family (e.g. to store and recall facts in context) on the stream's own
meta-training set, generated from its own random stream (``meta_seed``). That set is random episodes of
the task, not a held-out split of the stream: for ICR its facts are random key-value pairs over the
whole key vocabulary, so the stream's facts occur there only at the chance rate (1/n_values per
key), scattered among thousands of other pairs for the same key. It teaches the task, not the facts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch.utils.data import DataLoader

from ovq_cl.base import IGNORE, collate_episodes
from ovq_cl.base.progress import progress
from strategies.training import distributed
from strategies.evaluation.metrics import SequenceScore
from strategies.training.step import retention_weights, train_step


@dataclass(frozen=True)
class MetaStep:
    """One step done: its number (1-based) and, every ``log_every`` steps and at the last, the history row
    it logged (step, loss, the metric on the training batches since the previous row), else None."""
    step: int
    logged: Optional[Dict[str, float]] = None


class MetaTraining:
    """Meta-training as an iterator of steps: ``steps`` AdamW steps on shuffled minibatches of ``dataset``
    (items (x, y, t)), each from a fresh state. Iterating trains; the caller decides what to log and when
    to checkpoint (:meth:`progress`), so this loop calls nothing of its caller's::

        training = MetaTraining(model, dataset, steps=300, batch_size=32, lr=3e-3, metric="accuracy")
        for done in training:
            if done.logged: print(done.logged)
            if done.step % 100 == 0: save(training.progress())
        training.history            # the logged rows

    An item may be several episodes in a row (ICR's ``meta_sequence_episodes``): the state is carried
    through it, and the gradient flows through the whole item, or through segments of ``tbptt`` tokens
    (truncated BPTT, :func:`strategies.training.step.train_step`).

    ``recalled`` (a dataset whose item i is the bool mask of item i's answers to facts not presented in
    the same episode, ``StreamData.meta_recalled``): the logged rows add ``{metric}_recalled``, the metric
    on those answers alone (where the rows' batches had any), the learning curve of retention itself; with
    ``retention_loss`` > 0 the objective is the mean loss over all answers plus ``retention_loss`` times
    the mean over those (:func:`strategies.training.step.retention_weights`). ``reach`` (a dataset whose item
    i is item i's episodes back per recalled answer, ``StreamData.meta_reach``; needs ``recalled``): the
    rows also split that score by reach-back, ``{metric}_recalled_1_4``, ``_5_16``, ``_17_up``
    (:data:`REACH_BUCKETS`): the recalled answers are drawn evenly over the facts recallable, so most
    reach back a few episodes, and the overall score says little about the far ones.

    ``resume=progress`` (what :meth:`progress` returned, with the model's weights already restored)
    continues from there: the shuffled order is replayed from the seed, the steps already done are
    skipped, and the result equals an uninterrupted run's.

    Under torchrun every rank draws the same batches and trains on its block of their lanes
    (``strategies.training.distributed``); the logged loss and score are those of the whole batch.
    """

    def __init__(self, model: torch.nn.Module, dataset, *, steps: int, batch_size: int, lr: float, metric: str,
                 seed: int = 0, weight_decay: float = 0.01, grad_clip: float = 1.0, device="cpu",
                 progress: bool = False, log_every: int = 50, resume: Optional[Dict[str, Any]] = None,
                 context: Optional[dict] = None, tbptt: int = 0, recalled=None, retention_loss: float = 0.0,
                 reach=None):
        if steps < 0 or batch_size < 1:
            raise ValueError(f"meta_train: steps must be >= 0 and batch_size >= 1, got {steps}, {batch_size}")
        if steps and (dataset is None or len(dataset) == 0):
            raise ValueError("meta_train: the stream has no meta-training set, set meta_train.steps: 0")
        if retention_loss < 0:
            raise ValueError(f"meta_train.retention_loss must be >= 0, got {retention_loss}")
        if retention_loss > 0 and recalled is None:
            raise ValueError("meta_train.retention_loss > 0 needs the stream's recalled-answer masks "
                             "(StreamData.meta_recalled, one per meta-training item); this stream has none")
        if recalled is not None and dataset is not None and len(recalled) != len(dataset):
            raise ValueError(f"meta_train: {len(recalled)} recalled-answer masks for {len(dataset)} items")
        if reach is not None and (recalled is None or len(reach) != len(recalled)):
            raise ValueError("meta_train: the reach-back of recalled answers needs one item per recalled-answer mask")
        self.recalled, self.retention_loss, self.reach = recalled, retention_loss, reach
        self.score_recalled = SequenceScore(metric, context)
        self.score_reach = {name: SequenceScore(metric, context) for name, _, _ in _buckets(metric)} if reach is not None else {}
        self.model, self.dataset, self.steps, self.batch_size = model, dataset, steps, batch_size
        self.metric, self.seed, self.grad_clip, self.device = metric, seed, grad_clip, device
        self.show_progress, self.log_every, self.tbptt = progress, log_every, tbptt
        self.history: List[Dict[str, float]] = []
        self.score = SequenceScore(metric, context)
        self.done = 0
        if steps == 0:                   # nothing to train: no optimizer (a schedule of 0 steps is an error)
            return
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=lr, total_steps=steps,
                                                             pct_start=0.1)
        if resume is not None:
            self.optimizer.load_state_dict(resume["optimizer"])
            self.scheduler.load_state_dict(resume["scheduler"])
            self.history, self.score = list(resume["history"]), resume["score"]
            self.score_recalled = resume.get("score_recalled", self.score_recalled)
            self.score_reach = {**self.score_reach, **{k: v for k, v in resume.get("score_reach", {}).items()
                                                       if k in self.score_reach}}
            self.done = int(resume["step"])

    def progress(self) -> Dict[str, Any]:
        """What resuming needs besides the model's weights: step, optimizer, schedule, history, running score."""
        return {"step": self.done, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "history": list(self.history), "score": self.score, "score_recalled": self.score_recalled,
                "score_reach": dict(self.score_reach)}

    def __iter__(self) -> Iterator[MetaStep]:
        if self.steps == 0:
            return
        gen = torch.Generator().manual_seed(self.seed)
        items = self.dataset if self.recalled is None else _WithRecalled(self.dataset, self.recalled, self.reach)
        loader = DataLoader(items, batch_size=self.batch_size, shuffle=True, generator=gen,
                            collate_fn=collate_episodes if self.recalled is None else _collate_with_recalled,
                            drop_last=True)
        self.model.train()
        skip, step = self.done, 0
        bar = progress(total=self.steps, initial=skip, desc="meta-train", show=self.show_progress, unit="steps")
        while step < self.steps:
            for x, y, *rest in loader:
                if step < skip:                       # replaying the order of a resumed run: no compute
                    step += 1
                    continue
                lo, hi = _my_lanes(x.shape[0])
                weights = None
                if self.recalled is not None and self.retention_loss > 0:   # the whole batch's, then this rank's lanes
                    weights = retention_weights(y, rest[0], self.retention_loss)[lo:hi].to(self.device)
                loss, out, _ = train_step(self.model, self.optimizer, x[lo:hi].to(self.device),
                                          y[lo:hi].to(self.device), self.grad_clip,
                                          where=f"in meta-training at step {step}", tbptt=self.tbptt,
                                          answer_weights=weights)
                self.scheduler.step()
                _update_score(self.score, out, y, lo)
                if self.recalled is not None:
                    _update_score(self.score_recalled, out, y.masked_fill(~rest[0], IGNORE), lo)
                if self.reach is not None:
                    for name, low, high in _buckets(self.metric):
                        inside = (rest[1] >= low) & (rest[1] <= high)
                        _update_score(self.score_reach[name], out, y.masked_fill(~inside, IGNORE), lo)
                step += 1
                self.done = step
                bar.update()
                row = None
                if step % self.log_every == 0 or step == self.steps:
                    row = {"step": step, "loss": distributed.mean_over_ranks(float(loss.detach())),
                           self.metric: self.score.result()}
                    recalled_score = self.score_recalled.result()
                    if recalled_score == recalled_score:          # not nan: the batches had recalled answers
                        row[f"{self.metric}_recalled"] = recalled_score
                    for name, score in self.score_reach.items():
                        value = score.result()
                        if value == value:                        # not nan: the batches had such answers
                            row[name] = value
                        score.reset()
                    self.history.append(row)
                    self.score.reset()
                    self.score_recalled.reset()
                yield MetaStep(step, row)
                if step >= self.steps:
                    break
        bar.close()


def meta_train(model: torch.nn.Module, dataset, *, steps: int, batch_size: int, lr: float, metric: str,
               log: Optional[Callable[[Dict[str, float], int], None]] = None, **options) -> List[Dict[str, float]]:
    """:class:`MetaTraining` run to the end (``options``: its keyword arguments); ``log(metrics, step)``
    receives every logged row as ``meta_train/loss`` and ``meta_train/{metric}``. Returns the history."""
    training = MetaTraining(model, dataset, steps=steps, batch_size=batch_size, lr=lr, metric=metric, **options)
    for done in training:
        if done.logged is not None and log is not None:
            log(logged_metrics(done.logged, metric), done.step)
    return training.history


def logged_metrics(row: Dict[str, float], metric: str) -> Dict[str, float]:
    """A history row as the metrics logged for it (``meta_train/{metric}_recalled`` where the row has it)."""
    out = {"meta_train/loss": row["loss"], f"meta_train/{metric}": row[metric]}
    for name in (f"{metric}_recalled", *(b[0] for b in _buckets(metric))):
        if name in row:
            out[f"meta_train/{name}"] = row[name]
    return out


#: the reach-back buckets of the recalled answers (episodes since the fact was last presented): within
#: the standard 4-episode recipe's reach, within two blocks of 8, and beyond (the stream's forgetting is
#: measured 1-31 episodes back)
REACH_BUCKETS = ((1, 4), (5, 16), (17, None))


def _buckets(metric: str):
    """[(row name, lowest, highest reach)] of :data:`REACH_BUCKETS`."""
    return [(f"{metric}_recalled_{low}_{'up' if high is None else high}", low, 32767 if high is None else high)
            for low, high in REACH_BUCKETS]


class _WithRecalled(torch.utils.data.Dataset):
    """Item i: (x, y, recalled) from the meta-training item i and its recalled-answer mask, and its
    reach-back (x, y, recalled, reach) where given."""

    def __init__(self, items, recalled, reach=None) -> None:
        self.items, self.recalled, self.reach = items, recalled, reach

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        x, y, *_ = self.items[i]
        return (x, y, self.recalled[i]) + (() if self.reach is None else (self.reach[i],))


def _collate_with_recalled(batch):
    return tuple(torch.stack(parts) for parts in zip(*batch))


def _my_lanes(n: int):
    """This rank's rows of a batch of n (all of them in a single process)."""
    dp = distributed.active()
    return (0, n) if dp is None else dp.lane_range(n, n)


def _update_score(score: SequenceScore, out, y, lo: int) -> None:
    """The batch's answers into ``score``: under torchrun every rank's, gathered in lane order, so the
    score is the whole batch's on every rank."""
    if distributed.active() is None:
        score.update(out, y)
        return
    values, episode = score.answer_values(out, y[lo:lo + out.shape[0]])
    values = distributed.gather_rows(values)
    episode = distributed.gather_rows(episode + lo)
    score.update_values(values, episode, y.shape[0])
