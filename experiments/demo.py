"""The demo: train the small LM with each mixer on multi-query associative recall, print a table.

Same data, same seed, same training budget and the same state budget for every mixer (``state_budget``
bytes per layer and lane size OVQ's slots, VQ's codes, the window and the dense mixers' head width;
full attention's cache is not sized); accuracy on answer tokens of held-out episodes; state bytes per
layer and lane at the episode length; parameters (the head width changes them).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from experiments.messages import say
from ovq_cl import DecoderLM, model_config
from ovq_cl.base.progress import progress as show_progress
from strategies.evaluation.metrics import SequenceScore
from strategies.training.step import train_step
from streams.recall import RecallSpec, recall_batch

DEFAULT_MIXERS = ["ovq", "vq", "full", "swa", "linear", "delta", "deltanet", "ssm", "swa+ovq"]


@dataclass
class DemoResult:
    mixer: str
    params: int
    final_loss: float
    accuracy: float
    state_bytes: List[int]
    tokens_per_s: float


@dataclass
class DemoConfig:
    mixers: List[str] = field(default_factory=lambda: list(DEFAULT_MIXERS))
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0
    eval_episodes: int = 512
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    task: RecallSpec = field(default_factory=RecallSpec)
    # bytes per layer and lane; 16,960 gives OVQ 32 slots (None: each mixer's own options decide)
    state_budget: Optional[int] = 16960
    mixer_options: Dict[str, dict] = field(default_factory=lambda: {
        "ovq": {"chunk_size": 8},
        "vq": {"chunk_size": 8},
        "delta": {"chunk_size": 16},
        "deltanet": {"chunk_size": 16},
        "ssm": {"chunk_size": 16},
    })


def layer_pattern(kind: str) -> List[str]:
    """"swa+ovq" -> ["swa", "ovq"] (a hybrid pattern repeated over the layers); "ovq" -> ["ovq"]."""
    return [part.strip() for part in kind.split("+") if part.strip()]


def train_one(kind: str, cfg: DemoConfig, progress: bool = True) -> DemoResult:
    torch.manual_seed(cfg.seed)
    pattern = layer_pattern(kind)
    mcfg = {
        "vocab_size": cfg.task.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads, "layers": pattern, "state_budget": cfg.state_budget,
        "mixers": {name: opts for name, opts in cfg.mixer_options.items() if name in pattern},
    }
    model = DecoderLM(model_config(mcfg))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    data_gen = torch.Generator().manual_seed(cfg.seed)
    loss_value, tokens, start = float("nan"), 0, time.perf_counter()
    for _ in show_progress(range(cfg.steps), desc=f"{kind:>8}", show=progress, unit="steps"):
        x, y = recall_batch(cfg.task, cfg.batch_size, data_gen)
        loss, _, _ = train_step(model, opt, x, y, grad_clip=1.0, where=f"in the demo for mixer {kind!r}")
        sched.step()
        loss_value, tokens = loss.item(), tokens + x.numel()
    elapsed = time.perf_counter() - start
    eval_gen = torch.Generator().manual_seed(10_000 + cfg.seed)
    model.eval()
    with torch.no_grad():
        x, y = recall_batch(cfg.task, cfg.eval_episodes, eval_gen)
        logits, states = model(x)
        score = SequenceScore("accuracy")
        score.update(logits, y)
    return DemoResult(
        mixer=kind, params=sum(p.numel() for p in model.parameters()), final_loss=loss_value,
        accuracy=score.result(), state_bytes=[s.nbytes // x.shape[0] for s in states], tokens_per_s=tokens / elapsed,
    )


def format_table(results: List[DemoResult], seq_len: int) -> str:
    head = f"{'mixer':>8} {'params':>8} {'train loss':>10} {'recall acc':>10} {'state B/layer/lane @T=' + str(seq_len):>26} {'train tok/s':>11}"
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(
            f"{r.mixer:>8.8} {r.params:>8d} {r.final_loss:>10.3f} {r.accuracy:>10.3f} "
            f"{'/'.join(str(b) for b in r.state_bytes):>26} {r.tokens_per_s:>11.0f}"
        )
    return "\n".join(rows)


def run_demo(cfg: Optional[DemoConfig] = None, progress: bool = True) -> List[DemoResult]:
    cfg = cfg or DemoConfig()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from experiments.threads import install_loop_threads

    install_loop_threads()          # OVQ's loop threads: the process's policy, as a run's
    results, started = [], time.perf_counter()
    for i, kind in enumerate(cfg.mixers, 1):
        results.append(train_one(kind, cfg, progress))
        if progress:                   # where the demo stands, and what is left at its pace so far
            spent = time.perf_counter() - started
            say(f"demo: {i}/{len(cfg.mixers)} mixers trained ({kind}, recall {results[-1].accuracy:.3f}); "
                f"{spent:.0f} s so far, about {spent / i * (len(cfg.mixers) - i):.0f} s left")
    budget = "each mixer's own size" if cfg.state_budget is None else f"state budget {cfg.state_budget:,} B per layer and lane"
    print(f"associative recall: {cfg.task.n_pairs} pairs, {cfg.task.n_queries} queries, T={cfg.task.seq_len}, "
          f"{cfg.steps} steps x {cfg.batch_size} episodes, seed {cfg.seed}, {budget}; accuracy on "
          f"{cfg.eval_episodes} held-out episodes")
    print(format_table(results, cfg.task.seq_len))
    return results
