"""Statistics of one round: per-arm means with bootstrap CIs, effect sizes, Welch tests.

Pure functions over numbers (no I/O) plus two plot helpers; deterministic (the
bootstrap uses a fixed seed), so a re-run analysis gives the same report:

    metrics = {"lr=0": [0.21, 0.20, 0.22], "lr=0.0003": [0.55, 0.61, 0.58]}
    result = analyze(metrics, baseline="lr=0", direction="greater")
    result["verdict"]            # "supported"
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

BOOTSTRAP_SEED = 20240611
N_BOOTSTRAP = 10_000
ALPHA = 0.05


def trial_metric(rewards: Sequence[float], metric: str, window: int = 5) -> float | None:
    """One trial's score from its per-step mean rewards."""
    r = [float(x) for x in rewards if x is not None and not math.isnan(float(x))]
    if not r:
        return None
    w = max(1, min(window, len(r)))
    if metric == "final_reward":
        return float(np.mean(r[-w:]))
    if metric == "reward_gain":
        return float(np.mean(r[-w:]) - np.mean(r[:w]))
    if metric == "mean_reward":
        return float(np.mean(r))
    raise ValueError(f"unknown metric {metric!r}")


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n: int = N_BOOTSTRAP,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (fixed seed: reproducible)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1:
        return (float(x[0]), float(x[0]))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return (float(lo), float(hi))


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95, n: int = N_BOOTSTRAP,
                      seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(b) − mean(a), resampling each group independently."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size == 0 or xb.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    ma = xa[rng.integers(0, xa.size, size=(n, xa.size))].mean(axis=1)
    mb = xb[rng.integers(0, xb.size, size=(n, xb.size))].mean(axis=1)
    lo, hi = np.quantile(mb - ma, [(1 - level) / 2, 1 - (1 - level) / 2])
    return (float(lo), float(hi))


def hedges_g(a: Sequence[float], b: Sequence[float]) -> float:
    """Standardised mean difference (b − a) with the small-sample correction.

    Cohen's d over the pooled SD, times J = 1 − 3 / (4(n_a + n_b) − 9). With zero
    variance in both groups the effect is ±inf when the means differ, 0 otherwise.
    """
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    na, nb = xa.size, xb.size
    if na < 2 or nb < 2:
        return math.nan
    diff = xb.mean() - xa.mean()
    pooled = math.sqrt(((na - 1) * xa.var(ddof=1) + (nb - 1) * xb.var(ddof=1)) / (na + nb - 2))
    if pooled == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    j = 1 - 3 / (4 * (na + nb) - 9)
    return float(diff / pooled * j)


def welch(a: Sequence[float], b: Sequence[float], direction: str = "two-sided") -> tuple[float, float]:
    """Welch's t-test of b against a: (t, p). `direction`: greater | less | two-sided (for b − a)."""
    from scipy import stats

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        return (math.nan, math.nan)
    if xa.var(ddof=1) == 0 and xb.var(ddof=1) == 0:
        diff = xb.mean() - xa.mean()
        if diff == 0:
            return (0.0, 1.0)
        t = math.copysign(math.inf, diff)
        p = 0.0 if direction == "two-sided" or (direction == "greater") == (diff > 0) else 1.0
        return (t, p)
    res = stats.ttest_ind(xb, xa, equal_var=False, alternative=direction)
    return (float(res.statistic), float(res.pvalue))


def _clean(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def analyze(metrics: Mapping[str, Sequence[float]], baseline: str, direction: str = "two-sided",
            alpha: float = ALPHA) -> dict[str, Any]:
    """Per-arm summaries, each treatment compared with the baseline, and a verdict.

    Verdict per comparison (treatment − baseline):
    * supported: Welch p < alpha with the effect in the predicted direction (for a
      two-sided hypothesis: any significant difference);
    * refuted: a significant effect in the opposite direction;
    * inconclusive: anything else (too few seeds, too noisy, no effect).
    The hypothesis is supported if any treatment supports it, refuted if every
    treatment refutes it, inconclusive otherwise.
    """
    arms: dict[str, dict[str, Any]] = {}
    for arm, vals in metrics.items():
        x = [float(v) for v in vals]
        lo, hi = bootstrap_ci(x)
        arms[arm] = {"n": len(x), "values": x,
                     "mean": _clean(float(np.mean(x))) if x else None,
                     "std": _clean(float(np.std(x, ddof=1))) if len(x) > 1 else None,
                     "ci_low": _clean(lo), "ci_high": _clean(hi)}
    comparisons = []
    base = list(metrics.get(baseline, []))
    for arm, vals in metrics.items():
        if arm == baseline:
            continue
        t, p = welch(base, vals, direction)
        lo, hi = bootstrap_diff_ci(base, vals)
        g = hedges_g(base, vals)
        a, b = arms[baseline], arms[arm]
        diff = (b["mean"] - a["mean"]) if a["mean"] is not None and b["mean"] is not None else None
        overlap = None
        if None not in (a["ci_low"], a["ci_high"], b["ci_low"], b["ci_high"]):
            overlap = not (b["ci_low"] > a["ci_high"] or a["ci_low"] > b["ci_high"])
        significant = p is not None and not math.isnan(p) and p < alpha
        if diff is None or not significant:
            verdict = "inconclusive"
        elif direction == "two-sided" or (direction == "greater") == (diff > 0):
            verdict = "supported"
        else:
            verdict = "refuted"
        if direction != "two-sided" and diff is not None and not significant:
            # a one-sided test cannot see the opposite effect; test it two-sided
            _, p2 = welch(base, vals, "two-sided")
            if not math.isnan(p2) and p2 < alpha and (direction == "greater") != (diff > 0):
                verdict = "refuted"
        comparisons.append({"arm": arm, "baseline": baseline, "diff": _clean(diff) if diff is not None else None,
                            "diff_ci_low": _clean(lo), "diff_ci_high": _clean(hi), "hedges_g": _g(g),
                            "t": _g(t), "p": _clean(p), "ci_overlap": overlap, "verdict": verdict,
                            "better": (arm if diff > 0 else baseline) if diff else None})
    verdicts = [c["verdict"] for c in comparisons]
    if any(v == "supported" for v in verdicts):
        overall = "supported"
    elif verdicts and all(v == "refuted" for v in verdicts):
        overall = "refuted"
    else:
        overall = "inconclusive"
    return {"arms": arms, "baseline": baseline, "direction": direction, "alpha": alpha,
            "comparisons": comparisons, "verdict": overall}


def _g(x: float) -> float | str | None:
    """JSON-safe: inf as a string, nan as None."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


# ---------------------------------------------------------------- plots


def metric_plot(result: Mapping[str, Any], out: Path, ylabel: str) -> Path:
    """Each arm: its trials' scores (dots) and the mean with its 95 % bootstrap CI (bar)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    arms = result["arms"]
    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (name, a) in enumerate(arms.items()):
        xs = np.full(len(a["values"]), i) + np.linspace(-0.08, 0.08, max(1, len(a["values"])))
        ax.scatter(xs, a["values"], s=18, alpha=0.6, color="gray")
        if a["mean"] is not None:
            lo, hi = a["ci_low"], a["ci_high"]
            ax.errorbar([i], [a["mean"]], yerr=[[a["mean"] - lo], [hi - a["mean"]]], fmt="o",
                        capsize=6, markersize=8, linewidth=2)
    ax.set_xticks(range(len(arms)), list(arms), rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_title("Per-arm mean with 95 % bootstrap CI (dots: seeds)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def curves_plot(histories: Mapping[str, list[tuple[list[float], list[float]]]], out: Path) -> Path:
    """Reward per step, mean over seeds with a ± SD band per arm (store's plot helper)."""
    from store.plots import reward_curves

    return Path(reward_curves(histories, out, title="Reward per step (mean ± SD over seeds)",
                              ylabel="reward_mean"))
