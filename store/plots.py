"""Plots for run artifacts and study reports (matplotlib, headless Agg canvas).

Figures are drawn on an explicit Agg canvas, never through pyplot: no global
backend switch, no display needed, safe beside a user's interactive session.

    png = reward_curves({"base": [(steps, values), ...], "lr-high": [...]}, "reward.png")
    run.log_artifact(png, "plots")

Each arm is a line (the mean over its seeds) with a band (± one standard deviation,
or min–max). Seeds rarely log the same steps, so every seed is interpolated onto
the union of the arm's steps, limited to the range all seeds cover.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

History = tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]


def align_seeds(histories: Sequence[History]) -> tuple[np.ndarray, np.ndarray]:
    """(grid, values[n_seeds, len(grid)]) on the steps every seed covers."""
    hs = [(np.asarray(s, dtype=float), np.asarray(v, dtype=float)) for s, v in histories]
    hs = [(s, v) for s, v in hs if len(s)]
    if not hs:
        return np.empty(0), np.empty((0, 0))
    lo = max(s.min() for s, _ in hs)
    hi = min(s.max() for s, _ in hs)
    grid = np.unique(np.concatenate([s for s, _ in hs]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    values = np.stack([np.interp(grid, s[np.argsort(s)], v[np.argsort(s)]) for s, v in hs])
    return grid, values


def reward_curves(
    histories_by_arm: Mapping[str, Sequence[History]],
    out_path: str | os.PathLike[str] | None = None,
    *,
    title: str = "Reward",
    ylabel: str = "reward",
    xlabel: str = "step",
    band: str = "std",
) -> Path:
    """Draw mean curves with seed bands per arm; returns the PNG path.

    `band`: "std" (mean ± std over seeds) or "minmax". Without `out_path` the PNG
    goes to a new temporary file (the caller uploads and deletes it).
    """
    if band not in ("std", "minmax"):
        raise ValueError("band must be 'std' or 'minmax'")
    if out_path is None:
        fd, name = tempfile.mkstemp(prefix="roost-reward-", suffix=".png")
        os.close(fd)
        out = Path(name)
    else:
        out = Path(out_path)
        out.parent.mkdir(parents=True, exist_ok=True)

    fig = Figure(figsize=(7, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for arm, histories in histories_by_arm.items():
        grid, values = align_seeds(histories)
        if grid.size == 0:
            continue
        mean = values.mean(axis=0)
        if band == "std":
            spread = values.std(axis=0)
            low, high = mean - spread, mean + spread
        else:
            low, high = values.min(axis=0), values.max(axis=0)
        (line,) = ax.plot(grid, mean, label=f"{arm} (n={values.shape[0]})", linewidth=1.6)
        if values.shape[0] > 1:
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(out, format="png")
    return out
