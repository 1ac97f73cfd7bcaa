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
    the mean over those (:func:`strategies.training.step.retention_weights`).

    ``resume=progress`` (what :meth:`progress` returned, with the model's weights already restored)
    continues from there: the shuffled order is replayed from the seed, the steps already done are
    skipped, and the result equals an uninterrupted run's.

    Under torchrun every rank draws the same batches and trains on its block of their lanes
    (``strategies.training.distributed``); the logged loss and score are those of the whole batch.
    """

    def __init__(self, model: torch.nn.Module, dataset, *, steps: int, batch_size: int, lr: float, metric: str,
                 seed: int = 0, weight_decay: float = 0.01, grad_clip: float = 1.0, device="cpu",
                 progress: bool = False, log_every: int = 50, resume: Optional[Dict[str, Any]] = None,
                 context: Optional[dict] = None, tbptt: int = 0, recalled=None, retention_loss: float = 0.0):
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
        self.recalled, self.retention_loss = recalled, retention_loss
        self.score_recalled = SequenceScore(metric, context)
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
            self.done = int(resume["step"])

    def progress(self) -> Dict[str, Any]:
        """What resuming needs besides the model's weights: step, optimizer, schedule, history, running score."""
        return {"step": self.done, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "history": list(self.history), "score": self.score, "score_recalled": self.score_recalled}

    def __iter__(self) -> Iterator[MetaStep]:
        if self.steps == 0:
            return
        gen = torch.Generator().manual_seed(self.seed)
        items = self.dataset if self.recalled is None else _WithRecalled(self.dataset, self.recalled)
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
    if f"{metric}_recalled" in row:
        out[f"meta_train/{metric}_recalled"] = row[f"{metric}_recalled"]
    return out


class _WithRecalled(torch.utils.data.Dataset):
    """Item i: (x, y, recalled) from the meta-training item i and its recalled-answer mask."""

    def __init__(self, items, recalled) -> None:
        self.items, self.recalled = items, recalled

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        x, y, *_ = self.items[i]
        return x, y, self.recalled[i]


def _collate_with_recalled(batch):
    x, y, recalled = zip(*batch)
    return torch.stack(x), torch.stack(y), torch.stack(recalled)


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
