"""Probes: measurements of the model outside the stream, one class each, called by the runner through a
registry (the protocol: :mod:`experiments.probes.base`). The built-ins, in the order they run:
:mod:`~experiments.probes.delay`, :mod:`~experiments.probes.interference`,
:mod:`~experiments.probes.capacity` (before the stream) and :mod:`~experiments.probes.position` (after it);
they draw from the global RNG, so that order is part of what a run computes. Reports table them by
``Probe.table_rank`` (delay, capacity, interference, position, then the users' probes)."""
from experiments.probes.base import (PHASES, PROBES, Measured, Probe, ProbeContext, probes_in_order,  # noqa: F401
                                     register_probe, unknown_probes)
from experiments.probes.capacity import CapacityProbe
from experiments.probes.delay import DelayProbe
from experiments.probes.interference import InterferenceProbe
from experiments.probes.position import PositionProbe

for _probe in (DelayProbe, InterferenceProbe, CapacityProbe, PositionProbe):
    register_probe(_probe)


def probe_tables(records, baseline=None):
    """(caption, table) of every registered probe that some run of ``records`` measured, by ``table_rank``
    then registration order, each given the section's ``baseline``."""
    return [t for probe in sorted(probes_in_order(), key=lambda p: p.table_rank)       # a stable sort
            for t in probe.tables(records, baseline=baseline)]
