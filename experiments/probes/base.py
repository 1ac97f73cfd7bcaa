"""The probe protocol: a measurement of the model outside the stream, as Avalanche's plugin metrics are
measurements inside it.

A probe is one class (:class:`Probe`) that says

- **when** it runs (``phase``): ``"before_stream"``, on the meta-trained model before the first
  experience (after the learned gate), or ``"after_stream"``, on the final model after the last;
- **whether** a run asks for it (:meth:`Probe.wanted`, from the run's config) and whether the config
  and the stream allow it (:meth:`Probe.check`, one ``ValueError`` line before anything runs);
- **what** it records (:meth:`Probe.measure` returns a :class:`Measured`: the JSON record the run keeps
  under ``probes[name]``, the run's own table and figure, its metrics and tags);
- **how it is tabled** across runs (:meth:`Probe.tables`, for reports and ``ovq-cl compare``).

The runner calls the registry (:data:`PROBES`, in registration order), logs what each probe returns
(metrics, tags, artifacts ``<artifact>.json|.txt|.png``) and keeps the record; nothing else in the
framework names a probe. The built-in probes (delay, interference, capacity, position) are registered by
:mod:`experiments.probes`; a user's probe is one module that defines a class and calls
:func:`register_probe` (imported with ``--plugin`` or ``plugins:``), configured in a run's config under
``probes.<name>`` (its options; ``probes: {name: {}}`` asks for it with none).

The global RNG is left as it was by a user's probe (``Probe.keeps_rng``), so a probe added to a run does not
change what the stream's training draws: its R is the run's R without it. The built-in probes are the
exception (they draw from it as they always did, so that recorded runs reproduce bit for bit).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

from ovq_cl.base.registry import Registry

PHASES = ("before_stream", "after_stream")


@dataclass(frozen=True)
class ProbeContext:
    """What a probe reads: the run's (validated) config, its stream (the Avalanche benchmark with the
    stream's probe datasets), the model, the device, ``autocast()`` (the run's precision) and its own
    options (``config.probes[name]``, {} for a built-in configured under ``gate``)."""

    config: Any
    bench: Any
    model: Any
    device: str
    autocast: Callable[[], ContextManager]
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Measured:
    """What one probe measured on one run.

    ``record``: JSON-able, kept in the run's record under ``probes[name]`` (and its checkpoint);
    ``table`` / ``figure``: the run's own table (printed with progress on, logged as ``<artifact>.txt``)
    and matplotlib figure (``<artifact>.png``, then closed; None: no figure); ``series``: stepped metrics
    ``(key, value, step)``; ``metrics``: metrics at step 0; ``tags``: MLflow tags; ``heading``: the line
    printed above the table."""

    record: Dict[str, Any]
    table: str = ""
    figure: Any = None
    series: List[Tuple[str, float, int]] = field(default_factory=list)
    metrics: Dict[str, float] = field(default_factory=dict)
    tags: Dict[str, str] = field(default_factory=dict)
    heading: str = ""


class Probe:
    """One probe. Subclasses set ``name`` (the registry's name, the record's key) and implement
    :meth:`measure`; the rest has defaults."""

    name: str = ""
    phase: str = "before_stream"
    artifact: Optional[str] = None          # the artifacts' file stem (default: ``name``)
    # the runner restores the global RNG after the probe, so that it changes nothing the stream draws. The
    # four built-ins set False: they draw from the global RNG, as they did before probes were plugins, and
    # the runs already recorded must reproduce bit for bit; so turning one of them on or off changes what a
    # strategy that draws during the stream (replay's sampling) draws. Giving each its own generator is a
    # change of results, for a new code version with the studies pinned.
    keeps_rng: bool = True
    table_rank: int = 100                   # where its tables stand in a report (the built-ins: 10-40)

    def wanted(self, cfg) -> bool:
        """Whether the run asks for this probe: by default, ``probes.<name>`` is in its config."""
        return self.name in (getattr(cfg, "probes", None) or {})

    def options(self, cfg) -> Dict[str, Any]:
        return dict((getattr(cfg, "probes", None) or {}).get(self.name) or {})

    def check(self, cfg, bench) -> None:
        """Raises ValueError (one line naming the key) when the config or the stream cannot give this
        probe what it needs. Called before anything runs, only when :meth:`wanted`."""

    def measure(self, ctx: ProbeContext) -> Measured:
        raise NotImplementedError

    def tables(self, records: Sequence[Any], baseline: Optional[str] = None) -> List[Tuple[str, str]]:
        """(caption, markdown table) pairs comparing the runs of ``records``
        (:class:`experiments.compare.RunRecord`, each with ``probe(name)``) that measured this probe,
        ``baseline`` the section's baseline configuration (for paired tables; None when it has none);
        [] when none did or the probe has no cross-run table."""
        return []


PROBES: Registry = Registry("probe", "ovq_cl.probes")


def register_probe(probe: Probe) -> Probe:
    """Registers a probe instance under ``probe.name`` (a class is instantiated). Checked here: a name,
    a known phase, a ``measure``."""
    if isinstance(probe, type):
        probe = probe()
    if not isinstance(probe, Probe):
        raise ValueError(f"register_probe: {probe!r} is not an experiments.probes.Probe")
    if probe.phase not in PHASES:
        raise ValueError(f"probe {probe.name!r}: phase must be one of {PHASES}, got {probe.phase!r}")
    if type(probe).measure is Probe.measure:
        raise ValueError(f"probe {probe.name!r}: defines no measure()")
    return PROBES.register(probe.name, probe)


def probes_in_order(phase: Optional[str] = None) -> List[Probe]:
    """The registered probes in registration order (the built-ins first), of one phase or all."""
    PROBES.load_entry_points()
    return [p for p in PROBES.registered() if phase is None or p.phase == phase]


def gate_tag(flag: Optional[bool]) -> str:
    """A gate's verdict as an MLflow tag: true, false or unmeasured."""
    return "unmeasured" if flag is None else str(bool(flag)).lower()


def unknown_probes(names: Sequence[str]) -> List[str]:
    """The names of ``names`` no probe is registered under."""
    return [n for n in names if n not in PROBES]


def check_stream_probe(bench, attribute: str, key: str, stream: str, calls: List[tuple]) -> None:
    """Builds the first item of ``bench.<attribute>(*args)`` for each of ``calls``; one line naming ``key``."""
    if not calls:
        return
    probe = getattr(bench, attribute, None)
    if probe is None:
        raise ValueError(f"{key}: stream {stream!r} has no {attribute.replace('_', ' ')} (set {key}=[])")
    for args in calls:
        try:
            probe(*args)[0]
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from err
