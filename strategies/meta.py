"""Meta-training: the first phase of a run, before the stream (fresh state per episode).

The model learns the task family (e.g. to store and recall facts in context) on the stream's own
meta-training set, generated from its own random stream (``meta_seed``). That set is random episodes of
the task, not a held-out split of the stream: for ICR its facts are random key-value pairs over the
whole key vocabulary, so the stream's facts occur there only at the chance rate (1/n_values per
key), scattered among thousands of other pairs for the same key. It teaches the task, not the facts.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from ovq_cl.base import collate_episodes
from strategies import distributed
from strategies.scores import SequenceScore
from strategies.step import train_step


def meta_train(model: torch.nn.Module, dataset, *, steps: int, batch_size: int, lr: float,
               metric: str, seed: int = 0, weight_decay: float = 0.01, grad_clip: float = 1.0,
               device="cpu", progress: bool = False, log: Optional[Callable[[Dict[str, float], int], None]] = None,
               log_every: int = 50, checkpoint_every: int = 0,
               save: Optional[Callable[[Dict[str, Any]], None]] = None,
               resume: Optional[Dict[str, Any]] = None, context: Optional[dict] = None,
               tbptt: int = 0) -> List[Dict[str, float]]:
    """``steps`` AdamW steps on shuffled minibatches of ``dataset`` (items (x, y, t)), each from a
    fresh state. Returns the logged history: step, loss, and the metric on the training batches.

    An item may be several episodes in a row (ICR's ``meta_sequence_episodes``): the state is carried
    through it, and the gradient flows through the whole item, or through segments of ``tbptt`` tokens
    (truncated BPTT, :func:`strategies.step.train_step`).

    Every ``checkpoint_every`` steps ``save(progress)`` receives what resuming needs besides the model's
    weights (step, optimizer, schedule, history, running score); ``resume=progress`` (with the weights
    already restored) continues from there: the shuffled order is replayed from the seed, the steps
    already done are skipped, and the result equals an uninterrupted run's.

    Under torchrun every rank draws the same batches and trains on its block of their lanes
    (``strategies.distributed``); the logged loss and score are those of the whole batch.
    """
    if steps < 0 or batch_size < 1:
        raise ValueError(f"meta_train: steps must be >= 0 and batch_size >= 1, got {steps}, {batch_size}")
    if steps == 0:
        return []
    if dataset is None or len(dataset) == 0:
        raise ValueError("meta_train: the stream has no meta-training set, set meta_train.steps: 0")
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=gen, collate_fn=collate_episodes, drop_last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    history, score, step = [], SequenceScore(metric, context), 0
    if resume is not None:
        opt.load_state_dict(resume["optimizer"])
        sched.load_state_dict(resume["scheduler"])
        history, score = list(resume["history"]), resume["score"]
    done = 0 if resume is None else int(resume["step"])
    bar = tqdm(total=steps, initial=done, desc="meta-train", disable=not progress, leave=False)
    while step < steps:
        for x, y, *_ in loader:
            if step < done:                       # replaying the order of a resumed run: no compute
                step += 1
                continue
            lo, hi = _my_lanes(x.shape[0])
            loss, out, _ = train_step(model, opt, x[lo:hi].to(device), y[lo:hi].to(device), grad_clip,
                                      where=f"in meta-training at step {step}", tbptt=tbptt)
            sched.step()
            _update_score(score, out, y, lo)
            step += 1
            bar.update()
            if step % log_every == 0 or step == steps:
                row = {"step": step, "loss": distributed.mean_over_ranks(float(loss.detach())), metric: score.result()}
                history.append(row)
                score.reset()
                if log is not None:
                    log({"meta_train/loss": row["loss"], f"meta_train/{metric}": row[metric]}, step)
            if save is not None and checkpoint_every and step % checkpoint_every == 0 and step < steps:
                save({"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                      "history": list(history), "score": score})
            if step >= steps:
                break
    bar.close()
    return history


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
