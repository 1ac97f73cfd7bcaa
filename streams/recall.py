"""Multi-query associative recall episodes: a seeded pure function, no Avalanche, no model.

Token layout (vocabulary ``[PAD, SEP] + keys + values``)::

    k1 v1 k2 v2 ... kn vn SEP q1 a1 q2 a2 ... qm am

``labels[t]`` is the token the model must predict at position t: the answer ``a_j`` at the position of
the query ``q_j``, -100 everywhere else. Keys within an episode are distinct; queries are drawn from
the episode's keys. Example (n_pairs=2, n_queries=2, keys 2..5, values 6..9)::

    tokens: 3 8 5 6 1 5 6 3 8
    labels: - - - - - 6 - 8 -
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from ovq_cl.base.tokens import IGNORE, PAD, SEP  # noqa: F401  (re-exported for the demo)


@dataclass(frozen=True)
class RecallSpec:
    n_pairs: int = 12
    n_queries: int = 12
    n_keys: int = 32
    n_values: int = 32

    def __post_init__(self) -> None:
        if min(self.n_pairs, self.n_queries, self.n_keys, self.n_values) < 1:
            raise ValueError(f"recall: every size must be >= 1, got {self}")
        if self.n_pairs > self.n_keys:
            raise ValueError(f"recall: {self.n_pairs} pairs need as many distinct keys, but n_keys={self.n_keys}")

    @property
    def vocab_size(self) -> int:
        return 2 + self.n_keys + self.n_values

    @property
    def seq_len(self) -> int:
        return 2 * self.n_pairs + 1 + 2 * self.n_queries


def recall_batch(spec: RecallSpec, batch_size: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns tokens, labels: both [batch_size, spec.seq_len] int64."""
    keys = torch.rand(batch_size, spec.n_keys, generator=generator).argsort(-1)[:, : spec.n_pairs] + 2
    values = torch.randint(0, spec.n_values, (batch_size, spec.n_pairs), generator=generator) + 2 + spec.n_keys
    which = torch.randint(0, spec.n_pairs, (batch_size, spec.n_queries), generator=generator)
    q_keys, q_values = keys.gather(1, which), values.gather(1, which)
    context = torch.stack([keys, values], -1).flatten(1)
    queries = torch.stack([q_keys, q_values], -1).flatten(1)
    tokens = torch.cat([context, torch.full((batch_size, 1), SEP), queries], 1)
    labels = torch.full_like(tokens, IGNORE)
    first_query = 2 * spec.n_pairs + 1
    labels[:, first_query::2] = q_values
    return tokens, labels
