"""The HTML report's figures, as inline SVG: reward curves with 95 % bands, a forest plot, per-seed points.

Drawn from the numbers the round's analysis already holds (`researcher.analysis.analyze`) and the
trials' reward histories; nothing here judges anything. Each figure is an `<svg>` element with an
`id` and an `aria-label`, so the HTML needs no files beside it and a browser test can find it.

Text stays text (`svg.fonttype: none`): the SVG is smaller and its labels can be searched. The
hash salt of the figure's clip paths is the figure's id, so two figures on one page never share
an element id and a re-rendered report is byte-for-byte the same.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from store.plots import History, align_seeds

CI_LEVEL = 0.95


def _t_quantile(df: float, p: float) -> float:
    from scipy import special  # lazy: scipy takes a second or two to import

    return float(special.stdtrit(df, p))


def _welch_se_df(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        return None
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    if va + vb == 0:
        return None
    df = (va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1))
    return math.sqrt(va + vb), float(df)


def holm_intervals(result: Mapping[str, Any]) -> dict[str, tuple[float, float] | None]:
    """Each comparison's interval at the level Holm tested it at, by arm.

    Holm judges the i-th smallest of m p-values at level/(m − i + 1) (`level`: α, or a
    sequential look's nominal level), so the interval that agrees with its verdict is the
    (1 − level/(m − i + 1)) interval: it excludes 0 exactly when the adjusted p is below the
    level. The standard error comes back from the 95 % interval the analysis reported (paired:
    n − 1 degrees of freedom; Welch: Welch–Satterthwaite from the arms' values). Stopped arms
    (p counted as 1) and comparisons without a test get None.
    """
    level = float(result.get("level", result.get("alpha", 0.05)))
    comps = [c for c in result.get("comparisons", []) if c.get("p_holm") is not None]
    order = sorted(comps, key=lambda c: 1.0 if c.get("stopped") or c.get("p") is None else float(c["p"]))
    m = len(order)
    arms = result.get("arms", {})
    out: dict[str, tuple[float, float] | None] = {c["arm"]: None for c in result.get("comparisons", [])}
    for rank, c in enumerate(order):
        if c.get("stopped") or c.get("diff") is None or c.get("diff_ci_low") is None:
            continue
        if c.get("method") == "paired" and c.get("paired"):
            df = float(c["paired"]["n_pairs"] - 1)
            se = (c["diff_ci_high"] - c["diff_ci_low"]) / 2 / _t_quantile(df, 0.5 + CI_LEVEL / 2)
        else:
            got = _welch_se_df(arms[c["baseline"]]["values"], arms[c["arm"]]["values"])
            if got is None:
                out[c["arm"]] = (c["diff"], c["diff"])
                continue
            se, df = got
        half = _t_quantile(df, 1 - level / (m - rank) / 2) * se
        out[c["arm"]] = (c["diff"] - half, c["diff"] + half)
    return out


def _figure(width: float, height: float) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is slow to import
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _svg(fig: Any, fig_id: str, label: str) -> str:
    """The figure as one `<svg>` element (no XML prologue), tagged with its id and label."""
    import matplotlib  # lazy: matplotlib is slow to import

    fig.tight_layout()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": fig_id}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF boilerplate: no reader needs it
    text = re.sub(r'\sid="([^"]+)"', lambda m: f' id="{fig_id}-{m.group(1)}"', text)  # unique on the page
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{fig_id}-{m.group(1)})", text)
    text = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{fig_id}-{m.group(1)}"', text)
    label = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return text.replace("<svg", f'<svg id="{fig_id}" role="img" aria-label="{label}"', 1)


def curves_svg(histories: Mapping[str, Sequence[History]], fig_id: str, ylabel: str = "reward_mean") -> str:
    """Reward per step of each arm: the mean over seeds with its 95 % t-interval band."""
    fig, ax = _figure(7, 4.2)
    for arm, hs in histories.items():
        grid, values = align_seeds(hs)
        if grid.size == 0:
            continue
        n = values.shape[0]
        mean = values.mean(axis=0)
        (line,) = ax.plot(grid, mean, label=f"{arm} (n={n})", linewidth=1.6)
        if n > 1:
            half = _t_quantile(n - 1, 0.5 + CI_LEVEL / 2) * values.std(axis=0, ddof=1) / math.sqrt(n)
            ax.fill_between(grid, mean - half, mean + half, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_title("Reward per step: mean over seeds, 95 % CI band")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    return _svg(fig, fig_id, "Reward curves per arm with 95 % confidence bands")


def forest_svg(result: Mapping[str, Any], fig_id: str) -> str:
    """Each treatment − baseline: the difference, its 95 % interval (thin) and Holm-adjusted interval (thick)."""
    comps = list(result.get("comparisons", []))
    adjusted = holm_intervals(result)
    fig, ax = _figure(7, 1.2 + 0.6 * max(1, len(comps)))
    for i, c in enumerate(comps):
        y = len(comps) - 1 - i
        if c.get("diff") is None:
            ax.text(0, y, "not enough trials", va="center", ha="center", fontsize="small")
            continue
        if c.get("diff_ci_low") is not None:
            ax.hlines(y, c["diff_ci_low"], c["diff_ci_high"], color="gray", linewidth=1.2, label="95 % CI")
        adj = adjusted.get(c["arm"])
        if adj is not None:
            ax.hlines(y, adj[0], adj[1], color="tab:blue", linewidth=4, alpha=0.6, label="Holm-adjusted CI")
        ax.plot([c["diff"]], [y], "o", color="black")
        ax.annotate(c.get("verdict", ""), (c["diff"], y), xytext=(0, 8), textcoords="offset points", ha="center")
    ax.axvline(0, color="red", linewidth=1, linestyle="--")
    ax.set_yticks(range(len(comps)), [f"{c['arm']} − {c['baseline']}" for c in reversed(comps)])
    ax.set_ylim(-0.7, max(1, len(comps)) - 0.3)
    ax.set_xlabel(f"difference in {result.get('metric', 'metric')} (treatment − baseline)")
    ax.set_title("Treatment effects")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        ax.legend(unique.values(), unique.keys(), loc="best", fontsize="small")
    ax.grid(alpha=0.3, axis="x")
    return _svg(fig, fig_id, "Forest plot of the treatment effects with Holm-adjusted intervals")


def seeds_svg(result: Mapping[str, Any], fig_id: str) -> str:
    """Each arm's per-seed scores (dots) beside its mean and 95 % t-interval."""
    arms = result.get("arms", {})
    fig, ax = _figure(6, 4)
    for i, a in enumerate(arms.values()):
        vals = a.get("values") or []
        xs = np.full(len(vals), i) + np.linspace(-0.08, 0.08, max(1, len(vals)))
        ax.scatter(xs, vals, s=20, alpha=0.7, color="gray", label="seed")
        if a.get("mean") is not None and a.get("ci_low") is not None:
            err = [[a["mean"] - a["ci_low"]], [a["ci_high"] - a["mean"]]]
            ax.errorbar([i + 0.25], [a["mean"]], yerr=err, fmt="o", capsize=6, color="tab:blue", label="mean, 95 % CI")
    ax.set_xticks(range(len(arms)), list(arms), rotation=15)
    ax.set_xlim(-0.5, len(arms) - 0.5)
    ax.set_ylabel(str(result.get("metric", "metric")).replace("_", " "))
    ax.set_title("Per-seed scores")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        ax.legend(unique.values(), unique.keys(), loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return _svg(fig, fig_id, "Per-seed scores of each arm with mean and 95 % interval")
