"""Probes: measurements of the model outside the stream, one class each, called by the runner through a
registry (the protocol: :mod:`experiments.probes.base`). The built-ins, in the order they run and are
tabled: :mod:`~experiments.probes.delay`, :mod:`~experiments.probes.capacity`,
:mod:`~experiments.probes.interference` (before the stream) and :mod:`~experiments.probes.position`
(after it)."""
from experiments.probes.base import (PHASES, PROBES, Measured, Probe, ProbeContext, probes_in_order,  # noqa: F401
                                     register_probe, unknown_probes)
from experiments.probes.capacity import CapacityProbe
from experiments.probes.delay import DelayProbe
from experiments.probes.interference import InterferenceProbe
from experiments.probes.position import PositionProbe

for _probe in (DelayProbe, CapacityProbe, InterferenceProbe, PositionProbe):
    register_probe(_probe)


def probe_tables(records, baseline=None):
    """(caption, table) of every registered probe that some run of ``records`` measured, in registration
    order (a probe whose ``tables`` takes ``baseline`` also gets the section's baseline)."""
    import inspect

    out = []
    for probe in probes_in_order():
        takes_baseline = "baseline" in inspect.signature(probe.tables).parameters
        out += probe.tables(records, baseline=baseline) if takes_baseline else probe.tables(records)
    return out
