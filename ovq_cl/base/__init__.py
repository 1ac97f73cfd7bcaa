"""What every part of ovq-cl shares, with no dependency beyond torch and omegaconf.

Streams, strategies and experiments import this; it imports nothing of the model, the streams or
the strategies, so ``import ovq_cl.base`` is cheap (``ovq_cl``'s own names load lazily).

- :mod:`ovq_cl.base.tokens`: the special tokens every token stream uses, and the scored-position mask;
- :mod:`ovq_cl.base.batches`: collating ``(x, y, task)`` items into a minibatch;
- :mod:`ovq_cl.base.validation`: structured configs validated by omegaconf, errors naming the key;
- :mod:`ovq_cl.base.registry`: named registries (mixers, streams, strategies, metrics) and plugin loading;
- :mod:`ovq_cl.base.avalanche_compat`: the workarounds avalanche-lib 0.6.0 needs, imported explicitly by
  code that imports Avalanche (never by this package).
"""
from ovq_cl.base.batches import collate_episodes
from ovq_cl.base.registry import Registry, load_plugins
from ovq_cl.base.tokens import IGNORE, PAD, SEP, scored_mask
from ovq_cl.base.validation import validate

__all__ = ["IGNORE", "PAD", "Registry", "SEP", "collate_episodes", "load_plugins", "scored_mask", "validate"]
