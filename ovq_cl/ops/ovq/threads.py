"""How many CPU threads the OVQ chunk loop uses: what its caller gives it.

The chunk loop runs ~20-50 small torch ops per chunk. Each multi-threaded op ends in an OpenMP barrier
where the threads spin-wait for each other; when another process holds a core, one of our threads is
descheduled and the rest spin until it returns, a scheduler time slice per op instead of microseconds
(measured here: one OVQ layer at 16k tokens 0.28 s idle, 55 s beside two training processes on the 2
cores, where SDPA went from 0.67 s to 1.55 s). How many threads to use is a policy of the caller (the
runner and the CLI install one that counts the cores other processes leave free,
:mod:`experiments.threads`); the op only applies what it is given (``set_loop_threads``):

- ``"inherit"`` (default): torch's thread setting as it is;
- an integer n >= 1: n threads inside the loop;
- a callable ``choose(current) -> n``: asked at each call with torch's current setting.

The setting changes only how many threads compute each op, never what is computed; the tests check
that the outputs agree across thread counts. The torch setting is restored after the loop; it is
process-wide, so other Python threads running torch ops meanwhile share it.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Union

import torch

Policy = Union[str, int, Callable[[int], int]]
_POLICY: Policy = "inherit"


def _parse(policy: Policy) -> Policy:
    if callable(policy):
        return policy
    if isinstance(policy, str) and policy != "inherit":
        try:
            policy = int(policy)
        except ValueError:
            raise ValueError(f"OVQ loop threads: 'inherit', an integer >= 1 or a callable, got {policy!r}") from None
    if isinstance(policy, int) and policy < 1:
        raise ValueError(f"OVQ loop threads: an integer must be >= 1, got {policy}")
    return policy


def set_loop_threads(policy: Policy) -> None:
    """Sets what every later call uses: 'inherit', n >= 1, or a callable ``choose(current) -> n``."""
    global _POLICY
    _POLICY = _parse(policy)


def loop_threads_policy() -> Policy:
    """The setting in force (default 'inherit')."""
    return _POLICY


@contextlib.contextmanager
def loop_threads(device: torch.device) -> Iterator[int]:
    """Runs the block with the setting's thread count (CPU tensors only); yields the count used."""
    current = torch.get_num_threads()
    policy = _POLICY
    if device.type != "cpu" or policy == "inherit":
        yield current
        return
    n = policy if isinstance(policy, int) else max(1, int(policy(current)))
    if n == current:
        yield current
        return
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(current)
