"""The layer-choice search's own section: its record's rows as a table (the search itself is ``search.py``
beside this file, run as ``python -m experiments.studies.baseline_choices.search``)."""
from __future__ import annotations

import json
import os
from typing import List


def search_table(path: str) -> str:
    """The rows of a layer-choice search: mixer, options (changes from the layer's defaults of the time),
    steps, recall per seed, mean and minimum."""
    if not os.path.exists(path):
        return "(no search record yet: run the command above)"
    with open(path) as fh:
        rows = json.load(fh)
    lines = ["| mixer | options | steps | recall per seed | mean | min |", "|---|---|---|---|---|---|"]
    for r in rows:
        options = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "(none)"
        lines.append(f"| {r['mixer']} | {options} | {r['steps']} | {', '.join(f'{a:.3f}' for a in r['recall'])} "
                     f"| {r['mean']:.3f} | {min(r['recall']):.3f} |")
    return "\n".join(lines)


def render(ctx, path: str) -> List[str]:
    """The search's table, from its record at ``path`` (relative to the project)."""
    from experiments.sections import PROJECT_DIR

    return [search_table(os.path.join(PROJECT_DIR, path)), ""]


SECTIONS = {"search_table": render}
