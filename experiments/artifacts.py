"""The files a run writes beside its metrics: the result matrix as CSV and the forgetting-curve plot."""
from __future__ import annotations

import csv
import io
from typing import List, Optional, Sequence


def matrix_csv(R: Sequence[Sequence[Optional[float]]]) -> str:
    """``trained_on,eval_0,eval_1,...``, one row per experience trained on; empty where not measured."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["trained_on"] + [f"eval_{i}" for i in range(len(R))])
    for j, row in enumerate(R):
        writer.writerow([j] + ["" if v is None else f"{v:.6g}" for v in row])
    return buf.getvalue()


def forgetting_plot(R: Sequence[Sequence[Optional[float]]], tokens_after: List[int], metric: str, title: str):
    """R[j][i] of every experience i against experiences since and tokens since (a matplotlib figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for row in range(len(R)):
        js = [j for j in range(row, len(R)) if R[j][row] is not None]
        axes[0].plot(js, [R[j][row] for j in js], marker="o", label=f"exp {row}")
        axes[1].plot([tokens_after[j] - tokens_after[row] for j in js], [R[j][row] for j in js], marker="o")
    from matplotlib.ticker import MaxNLocator

    axes[0].set_xlabel("after training experience j")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))       # experiences are whole numbers
    axes[1].set_xlabel("tokens streamed per lane since the experience ended")
    values = [v for row in R for v in row if v is not None]
    for ax in axes:
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        # from 0, not auto-zoomed: 0.81-1.0 made eight points of a stable memory look like a collapse; a score
        # within [0, 1] (accuracy) is drawn on all of it
        ax.set_ylim(0, 1.02 if values and max(values) <= 1 else None)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
