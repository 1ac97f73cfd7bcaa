"""Data-parallel runs under ``torchrun``: lanes sharded across ranks, one set of weights.

    torchrun --nproc_per_node 2 -m experiments.cli run experiments/configs/icr_frozen.yaml

Every rank builds the same model, optimizer and stream from the same seeds (the weights are broadcast
from rank 0 once more, as DistributedDataParallel does) and takes a contiguous block of the lanes of
every minibatch: with ``strategy.train_mb_size = L`` and world size W, rank r carries lanes
``[r L/W, (r+1) L/W)`` and only their memory state; meta-training shards each batch the same way.

- **Gradients**: each rank's sequence loss (a mean over its scored answers) is weighted by
  ``W n_r / N`` (n_r its answers, N all ranks'), then the gradients are averaged across ranks
  (:func:`average_gradients`, one all-reduce of a flat buffer, before clipping): the step is the
  single-process step on the whole minibatch, up to the order of float sums. Terms that are means over
  a rank's tokens (VQ's commitment loss, LwF's distillation over all positions) are averaged, which
  is exact since every rank holds the same number of lanes of the same length. VQ's EMA codebook
  statistics are all-reduced in the layer (``Mixer.set_process_group``), so the replicas' codebooks agree.
- **Evaluation**: each rank reads its lanes of every eval minibatch from its carried state; the
  outputs are gathered (:func:`gather_rows`) so that every rank's metrics, hence R, are the
  single-process ones. A last partial minibatch may leave a rank nothing to compute.
- **What is replicated**: the learned gate, the delay curve, EWC's Fisher is sharded by episodes and
  summed. Tracking, checkpoints and printing are rank 0's; checkpoints hold every lane's state
  (:func:`gather_lanes`), so a run resumes with the same or another world size (:func:`local_lanes`).

Why not the ``DistributedDataParallel`` wrapper: our models return ``(out, states)`` and are called
through their own methods (``aux_loss``, ``states_from_state_dicts``), and truncated BPTT backpropagates
several times per step; averaging the gradients ourselves is the same collective (an all-reduce), with
no wrapper to unwrap and no ``no_sync`` bookkeeping. Single-process runs never touch this module's
collectives (:func:`active` is None).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist

from ovq_cl.layers.base import Mixer

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the group: rank, world size, local rank, collective backend and the
    device collectives run on (CUDA for NCCL, the CPU for gloo)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def comm_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def lane_range(self, n: int, lanes: int) -> Tuple[int, int]:
        """This rank's rows of a minibatch of ``n`` rows whose row b is lane b of ``lanes`` lanes
        (a last partial minibatch has n < lanes): ``[lo, hi)``, possibly empty."""
        per_rank = lanes // self.world_size
        return min(self.rank * per_rank, n), min((self.rank + 1) * per_rank, n)


_ACTIVE: Optional[DataParallel] = None


def active() -> Optional[DataParallel]:
    """The data-parallel group of this process, or None in a single-process run."""
    return _ACTIVE


def is_main() -> bool:
    """True in a single process and on rank 0: the process that tracks, writes and prints."""
    return _ACTIVE is None or _ACTIVE.is_main


def launched() -> bool:
    """True when this process was started by torchrun with more than one process in the group."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start(device: str) -> Optional[DataParallel]:
    """Joins the process group torchrun set up (env:// rendezvous): NCCL when the run's ``device`` is
    CUDA, gloo otherwise; each rank on GPU ``LOCAL_RANK``. None (nothing started) outside torchrun."""
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    if not launched():
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local_rank)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    _ACTIVE = DataParallel(dist.get_rank(), dist.get_world_size(), local_rank, backend)
    return _ACTIVE


def stop() -> None:
    """Leaves the process group (the end of a run under torchrun)."""
    global _ACTIVE
    if _ACTIVE is not None and dist.is_initialized():
        dist.destroy_process_group()
    _ACTIVE = None


def check_divisible(**sizes: int) -> None:
    """Every sharded batch size must split evenly across the ranks (one line, before any compute)."""
    dp = active()
    if dp is None:
        return
    for name, n in sizes.items():
        if n % dp.world_size:
            raise ValueError(f"torchrun: {name}={n} does not split across {dp.world_size} processes "
                             f"(make it a multiple of the world size)")


def check_device(device: str) -> None:
    """Under torchrun each rank takes GPU ``LOCAL_RANK``: a device naming one GPU for all is refused."""
    if active() is not None and device.startswith("cuda:"):
        raise ValueError(f"torchrun: device {device!r} puts every rank on one GPU; use device: cuda "
                         "(each rank takes GPU LOCAL_RANK)")


def check_mixer_options(model: torch.nn.Module) -> None:
    """Mixers that would make the ranks compute what one process does not (``Mixer.data_parallel_problem``,
    e.g. OVQ's ``init: random``, which draws noise per lane of a call), refused before compute."""
    if active() is None:
        return
    for m in model.modules():
        problem = m.data_parallel_problem() if isinstance(m, Mixer) else None
        if problem:
            raise ValueError(f"torchrun: {type(m).__name__}: {problem}")


# ------------------------------------------------------------------------------------ collectives


def _on_comm(t: torch.Tensor, dp: DataParallel) -> torch.Tensor:
    return t.to(dp.comm_device)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum over ranks (a new tensor on t's device); t itself without a group."""
    dp = active()
    if dp is None:
        return t
    buf = _on_comm(t.detach().clone(), dp)
    dist.all_reduce(buf)
    return buf.to(t.device)


def mean_over_ranks(value: float) -> float:
    dp = active()
    if dp is None:
        return value
    return float(all_reduce_sum(torch.tensor([value], dtype=torch.float64))[0]) / dp.world_size


def loss_weight(n_local: int) -> float:
    """``W n_local / N``: the factor that makes the average over ranks of local mean losses the mean
    over all ranks' answers (1.0 without a group, or when no rank has an answer)."""
    dp = active()
    if dp is None:
        return 1.0
    total = float(all_reduce_sum(torch.tensor([float(n_local)], dtype=torch.float64))[0])
    return dp.world_size * n_local / total if total > 0 else 1.0


def average_gradients(model: torch.nn.Module) -> None:
    """Averages every parameter's gradient across ranks (one all-reduce of a flat buffer). A parameter
    keeps ``grad = None`` only if it has none on every rank, as it would in a single process."""
    dp = active()
    if dp is None:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32)
    has = all_reduce_sum(has) > 0
    live = [p for p, h in zip(params, has.tolist()) if h]
    if not live:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(torch.float32)
                      for p in live])
    flat = all_reduce_sum(flat) / dp.world_size
    offset = 0
    for p in live:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
        offset += n


def gather_rows(t: Optional[torch.Tensor]) -> torch.Tensor:
    """Concatenates every rank's rows in rank order (dim 0); a rank may send None (no rows). Every rank
    gets the whole tensor."""
    dp = active()
    if dp is None:
        assert t is not None
        return t
    meta: List[Any] = [None] * dp.world_size
    mine = None if t is None else (int(t.shape[0]), tuple(t.shape[1:]), t.dtype, str(t.device))
    dist.all_gather_object(meta, mine)
    ref = next(m for m in meta if m is not None)
    tail, dtype = ref[1], ref[2]
    device = dp.comm_device if t is None else t.device
    rows = [0 if m is None else m[0] for m in meta]
    top = max(rows)
    pad = torch.zeros(top, *tail, dtype=dtype, device=dp.comm_device)
    if t is not None:
        pad[: t.shape[0]] = t.detach().to(dp.comm_device)
    parts = [torch.empty_like(pad) for _ in range(dp.world_size)]
    dist.all_gather(parts, pad)
    return torch.cat([p[:n] for p, n in zip(parts, rows)]).to(device)


def _with_ints(state, combine):
    """``state`` with each int field of it (and of nested states) replaced by ``combine(value, how)``,
    ``how`` from the state class's ``LANE_REDUCTIONS`` ("max", "sum", or None: the same in every lane)."""
    changes = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            changes[f.name] = combine(value, type(state).LANE_REDUCTIONS.get(f.name))
        elif dataclasses.is_dataclass(value) and hasattr(value, "LANE_REDUCTIONS"):
            changes[f.name] = _with_ints(value, combine)
    return dataclasses.replace(state, **changes)


def _reduce_int(value: int, how: Optional[str]) -> int:
    dp = active()
    if how is None:
        return value                                   # the same in every lane, so on every rank
    buf = torch.tensor([value], dtype=torch.int64, device=dp.comm_device)
    dist.all_reduce(buf, op=dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.SUM)
    return int(buf.item())


def gather_lanes(states: Optional[Sequence[Any]]) -> Optional[list]:
    """Every rank's lanes of the carried states, concatenated in rank order, with the ints summarising
    the lanes combined as the state says (``MixerState.LANE_REDUCTIONS``: OVQ's ``n_active`` is the
    longest prefix over all lanes, its merge and eviction counters are sums): the state one process
    would carry, for a checkpoint that any world size can resume and for statistics over every lane.
    Collective: every rank calls it with states of the same structure."""
    if active() is None or states is None:
        return None if states is None else list(states)
    # lanes are dim 0 of every state tensor (as strategies.memory.select_lanes slices them); 0-d ones are shared
    return [None if s is None else _with_ints(s._map(lambda x: gather_rows(x) if x.dim() else x), _reduce_int)
            for s in states]


def local_lanes(states: Optional[Sequence[Any]], lanes: int) -> Optional[list]:
    """This rank's block of the lanes of full states (as :meth:`DataParallel.lane_range`). Summed counters
    stay with rank 0 (so that gathering again counts them once); maxima and shared ints stay as they are
    (a longer prefix than a rank's lanes use is read as empty slots)."""
    dp = active()
    if dp is None or states is None:
        return None if states is None else list(states)
    lo, hi = dp.lane_range(lanes, lanes)

    def keep(value: int, how: Optional[str]) -> int:
        return 0 if how == "sum" and not dp.is_main else value

    return [None if s is None else _with_ints(s._map(lambda x: x[lo:hi] if x.dim() else x), keep) for s in states]


def _flag_collective(flag: bool, collective) -> bool:
    dp = active()
    if dp is None:
        return flag
    buf = torch.tensor([1.0 if flag else 0.0], device=dp.comm_device)
    collective(buf)
    return bool(buf.item())


def all_ranks(flag: bool) -> bool:
    """True when ``flag`` holds on every rank (e.g. a finite loss: so that all ranks raise together)."""
    return _flag_collective(flag, lambda buf: dist.all_reduce(buf, op=dist.ReduceOp.MIN))


def broadcast_flag(flag: bool) -> bool:
    """Rank 0's value of ``flag`` on every rank (a decision only rank 0 can take, e.g. from the store)."""
    return _flag_collective(flag, lambda buf: dist.broadcast(buf, 0))


def decided_by_rank0(decide: Callable[[], Optional[T]], follow: Callable[[], Optional[T]], what: str) -> Optional[T]:
    """A decision only rank 0 takes (it asks the tracking store, or finds a file), followed by every rank.

    Rank 0 calls ``decide()`` (None: nothing found); every other rank learns whether it found something
    and, if so, calls ``follow()`` to load the same thing itself. A rank that cannot is a FileNotFoundError
    naming ``what``. In a single process: ``decide()``."""
    found = decide() if is_main() else None
    if broadcast_flag(found is not None) and found is None:
        found = follow()
        if found is None:
            raise FileNotFoundError(f"torchrun: rank {_ACTIVE.rank if _ACTIVE else 0} cannot read {what} that rank 0 "
                                    "read; every rank needs the checkpoint folder (a shared path)")
    return found


def prepare_model(model: torch.nn.Module) -> torch.nn.Module:
    """Rank 0's parameters and buffers on every rank, and layers with batch statistics (VQ's EMA
    codebook) told to reduce them over the group (``Mixer.set_process_group``)."""
    dp = active()
    if dp is None:
        return model
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            buf = t.data.to(dp.comm_device)
            dist.broadcast(buf, 0)
            t.data.copy_(buf.to(t.device))
    for m in model.modules():
        if isinstance(m, Mixer):
            m.set_process_group(dist.group.WORLD)
    return model
