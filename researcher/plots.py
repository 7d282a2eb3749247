"""The figures of a round's analysis in a study's report: each arm's scores with its interval, and the
reward curves. Files written; the numbers they draw come from `researcher.analysis`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def metric_plot(result: Mapping[str, Any], out: Path, ylabel: str) -> Path:
    """Each arm: its trials' scores (dots) and the mean with its 95 % t-interval (bar)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is slow to import
    from matplotlib.figure import Figure

    arms = result["arms"]
    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, a in enumerate(arms.values()):
        xs = np.full(len(a["values"]), i) + np.linspace(-0.08, 0.08, max(1, len(a["values"])))
        ax.scatter(xs, a["values"], s=18, alpha=0.6, color="gray")
        if a["mean"] is not None and a["ci_low"] is not None:
            lo, hi = a["ci_low"], a["ci_high"]
            ax.errorbar(
                [i],
                [a["mean"]],
                yerr=[[a["mean"] - lo], [hi - a["mean"]]],
                fmt="o",
                capsize=6,
                markersize=8,
                linewidth=2,
            )
        elif a["mean"] is not None:
            ax.plot([i], [a["mean"]], "o", markersize=8)
    ax.set_xticks(range(len(arms)), list(arms), rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_title("Per-arm mean with 95 % t-interval (dots: seeds)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def curves_plot(histories: Mapping[str, list[tuple[list[float], list[float]]]], out: Path) -> Path:
    """Reward per step, mean over seeds with a ± SD band per arm (store's plot helper)."""
    from store.plots import reward_curves  # lazy: store.plots imports matplotlib

    return Path(reward_curves(histories, out, title="Reward per step (mean ± SD over seeds)", ylabel="reward_mean"))
