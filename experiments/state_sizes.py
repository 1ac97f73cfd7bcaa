"""State bytes per layer and lane for every registered mixer at given sequence lengths, and the sizing of
every mixer to a state budget.

The numbers come from each mixer's ``state_nbytes`` (tested equal to the bytes of a real state), with
each mixer's default options (its ``Options`` dataclass: OVQ N = 256 slots, chunk 32; VQ 256 codes,
chunk 32; SWA window 64), for every registered mixer, user mixers included. With a budget, each mixer
is sized by ``ovq_cl.layers.budget`` (its knob as large as the budget allows) and the table also shows
the knob and the layer's parameters, which the sizing can change (head width).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from ovq_cl.layers import MIXERS, build_mixer, mixer_options


def state_size_table(lengths: List[int], d_model: int = 256, n_heads: int = 4, budget: Optional[int] = None,
                     options: Optional[Dict[str, dict]] = None) -> str:
    """The table; ``options``: per mixer, options other than its defaults (``{"vq": {"chunk_size": 8}}``,
    as the demo has them), applied before sizing. A mixer whose smallest state is above the budget is a
    row that says so (the others are still sized)."""
    from ovq_cl.layers.budget import size_to_budget

    options = options or {}
    unknown = sorted(set(options) - set(MIXERS))
    if unknown:
        raise ValueError(f"state-sizes --option: unknown mixer(s) {unknown}; known: {sorted(MIXERS)}")
    head = f"{'mixer':>8} " + " ".join(f"{'T=' + str(t):>14}" for t in lengths)
    title = (f"state bytes per layer and lane (the mixer's; a block with token shift carries {4 * d_model:,} B "
             f"more), float32, d_model={d_model}, {n_heads} heads")
    if budget is not None:
        head += f" {'sized':>22} {'parameters':>12}"
        title += f", sized to a budget of {budget:,} B (mixers without a knob grow with T: not matched)"
    if options:
        title += "; options " + ", ".join(f"{m}.{k}={v}" for m, opts in sorted(options.items()) for k, v in opts.items())
    rows = [title, head, "-" * len(head)]
    for name in sorted(MIXERS):
        chosen = mixer_options(name, options.get(name))
        if budget is not None:
            try:
                chosen = size_to_budget(name, d_model, n_heads, budget, chosen)
            except ValueError as err:                  # this mixer does not fit: said in its row
                rows.append(f"{name:>8} does not fit: {str(err).split('is below ', 1)[-1]}")
                continue
        mixer = build_mixer(name, d_model, n_heads, chosen)
        row = f"{name:>8} " + " ".join(f"{mixer.state_nbytes(t):>14,d}" for t in lengths)
        if budget is not None:
            knob = MIXERS.get(name).cls.budget_knob
            sized = "-" if knob is None else f"{knob}={getattr(mixer.options, knob) if knob != 'head_dim' else mixer.head_dim}"
            row += f" {sized:>22} {sum(p.numel() for p in mixer.parameters()):>12,d}"
        rows.append(row)
    return "\n".join(rows)


def parse_mixer_options(items: List[str]) -> Dict[str, dict]:
    """``["vq.chunk_size=8", "ovq.chunk_size=8"]`` -> ``{"vq": {"chunk_size": 8}, "ovq": {"chunk_size": 8}}``
    (values read as YAML)."""
    import yaml

    out: Dict[str, dict] = {}
    for item in items:
        key, equals, value = item.partition("=")
        mixer, dot, option = key.partition(".")
        if not (equals and dot and mixer and option):
            raise ValueError(f"state-sizes --option {item!r}: expected MIXER.OPTION=VALUE, e.g. vq.chunk_size=8")
        out.setdefault(mixer, {})[option] = yaml.safe_load(value)
    return out
