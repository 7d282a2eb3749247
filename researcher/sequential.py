"""Sequential rules of an adaptive study: alpha spending across looks, and successive halving.

Pure functions over numbers (no I/O), deterministic:

    nominal_alpha([0.5, 1.0], 0.05, "obrien-fleming")   # the level of look 2 of 2: ≈ 0.049
    halving_stops({"base": [...], "a": [...], "b": [...]}, baseline="base")  # {"b": "..."}

Why alpha spending: an inconclusive comparison that gets more seeds is looked at again,
and testing every look at α = 0.05 calls a null effect "supported" far more often than
5 % of the time (about 8 % over two looks, 11 % over three). A Lan–DeMets spending
function α(t) fixes how much of α may be spent by information fraction t (seeds per arm
so far / the most seeds per arm the study may reach); the boundary of each look is the
z value whose crossing probability, given no crossing before, is that look's share. The
boundaries need only the fractions of this and the earlier looks, not how many looks
will follow, so a study may stop early (budget, precision) without breaking the rule.

The boundaries are computed for z statistics (the recursive integration of Armitage,
McPherson and Rowe, on a Simpson grid); a look's t-test is judged at the boundary's
two-sided nominal level 2·(1 − Φ(c_k)), the usual way to carry z boundaries over to
t-tests with small samples. tests/researcher/test_calibration.py checks, on simulated
studies, that the false-positive rate holds with that approximation.

Why successive halving is only allowed to *stop* arms: a stopped arm's comparison is
never called supported (its p-value counts as 1 in the Holm family, so the family keeps
its size), which can only lower the rate of false "supported" calls; an arm is stopped
only when it is in the bottom half at a rung *and* clearly behind the leader (one-sided
Welch p < `BEHIND_ALPHA` on the metric so far), so a true winner is almost never cut.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Literal

import numpy as np

Spending = Literal["obrien-fleming", "pocock"]
SPENDING_FUNCTIONS: tuple[str, ...] = ("obrien-fleming", "pocock")
GRID_POINTS = 801  # odd: Simpson's rule over each look's continuation region
Z_CAP = 12.0  # a boundary beyond this is never crossed; integrate no wider
BEHIND_ALPHA = 0.05  # successive halving stops an arm only this clearly behind the leader
MIN_RUNG_VALUES = 3  # trials per arm that must have reached a rung before it is judged


def t_pvalue(t: float, df: float, direction: str = "two-sided") -> float:
    """p-value of Student's t with `df` degrees of freedom: two-sided, or one-sided for
    "greater" / "less". Through scipy.special directly: `scipy.stats`' tests cost
    milliseconds a call, which the calibration tests' thousands of studies cannot afford."""
    from scipy import special  # lazy: see spent_alpha

    if direction == "two-sided":
        return float(min(1.0, 2 * special.stdtr(df, -abs(t))))
    if direction == "greater":
        return float(special.stdtr(df, -t))
    if direction == "less":
        return float(special.stdtr(df, t))
    raise ValueError(f"unknown direction {direction!r}")


def welch_t(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's t of mean(b) − mean(a) and its Welch–Satterthwaite degrees of freedom
    (nan, nan below 2 values in either, or with no spread in both)."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        return (math.nan, math.nan)
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    if va + vb == 0:
        return (math.nan, math.nan)
    df = (va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1))
    return (float((xb.mean() - xa.mean()) / math.sqrt(va + vb)), float(df))


def spent_alpha(t: float, alpha: float, spending: str = "obrien-fleming") -> float:
    """α spent by information fraction t (Lan–DeMets): O'Brien–Fleming-like or Pocock-like.

    O'Brien–Fleming, 2 − 2Φ(z_{α/2}/√t), spends almost nothing early (a first look
    at half the seeds is judged at p < 0.003), so the last look keeps nearly all of α;
    Pocock, α·ln(1 + (e − 1)t), spends evenly and stops earlier but pays at the end.
    """
    from scipy import stats  # lazy: scipy.stats takes a second or two to import

    t = min(max(float(t), 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if spending == "obrien-fleming":
        return float(2 - 2 * stats.norm.cdf(stats.norm.isf(alpha / 2) / math.sqrt(t)))
    if spending == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"unknown spending function {spending!r}; known: {', '.join(SPENDING_FUNCTIONS)}")


def _simpson(c: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid over (−c, c) and its Simpson weights."""
    z = np.linspace(-c, c, GRID_POINTS)
    h = z[1] - z[0]
    w = np.ones(GRID_POINTS)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return z, w * h / 3


@lru_cache(maxsize=256)
def _boundaries(fractions: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    from scipy import optimize, stats  # lazy: see spent_alpha

    out: list[float] = []
    z = w = dens = None
    prev_t, prev_spent = 0.0, 0.0
    for t in fractions:
        spent = spent_alpha(t, alpha, spending)
        target = max(0.0, spent - prev_spent)
        if dens is None:  # first look: Z_1 is standard normal
            c = float(stats.norm.isf(target / 2)) if target > 0 else math.inf
        else:
            s = math.sqrt(t - prev_t)
            a, b = math.sqrt(t), math.sqrt(prev_t)

            def crossing(c: float, z=z, w=w, dens=dens, s=s, a=a, b=b) -> float:
                up = stats.norm.sf((c * a - z * b) / s)
                down = stats.norm.cdf((-c * a - z * b) / s)
                return float(np.sum(w * dens * (up + down)))

            c = (
                float(optimize.brentq(lambda c, target=target: crossing(c) - target, 0.0, 2 * Z_CAP))
                if target > 0
                else math.inf
            )
        c_grid = min(c, Z_CAP)
        z_new, w_new = _simpson(c_grid)
        if dens is None:
            dens = stats.norm.pdf(z_new)
        else:  # density of Z_k on (−c_k, c_k), having stayed inside every earlier boundary
            kernel = stats.norm.pdf((z_new[:, None] * a - z[None, :] * b) / s) * a / s
            dens = kernel @ (w * dens)
        z, w = z_new, w_new
        out.append(c)
        prev_t, prev_spent = t, spent
    return tuple(out)


def boundaries(fractions: Sequence[float], alpha: float = 0.05, spending: str = "obrien-fleming") -> list[float]:
    """Two-sided z boundaries c_1..c_K of looks at information fractions `fractions` (increasing, ≤ 1).

    The probability, with no true effect, that |Z_k| ≥ c_k at some look is α(t_K); at
    t_K = 1 it is α. A look that spends nothing has an infinite boundary.
    """
    fr = tuple(round(min(max(float(f), 1e-9), 1.0), 12) for f in fractions)
    if not fr:
        return []
    if any(b <= a for a, b in zip(fr, fr[1:], strict=False)):
        raise ValueError(f"information fractions must increase, got {list(fractions)}")
    if spending not in SPENDING_FUNCTIONS:
        raise ValueError(f"unknown spending function {spending!r}; known: {', '.join(SPENDING_FUNCTIONS)}")
    return list(_boundaries(fr, float(alpha), spending))


def nominal_alpha(fractions: Sequence[float], alpha: float = 0.05, spending: str = "obrien-fleming") -> float:
    """The two-sided p-value level the *last* of these looks is judged at: 2·(1 − Φ(c_K))."""
    from scipy import stats  # lazy: see spent_alpha

    c = boundaries(fractions, alpha, spending)[-1]
    return 0.0 if math.isinf(c) else float(2 * stats.norm.sf(c))


def halving_stops(
    interim: Mapping[str, Sequence[float]],
    baseline: str,
    behind_alpha: float = BEHIND_ALPHA,
    min_values: int = MIN_RUNG_VALUES,
) -> dict[str, str]:
    """Treatment arms to stop at a rung: {arm: why}. The baseline is never stopped.

    `interim`: each live arm's metric so far, one value per trial that reached the rung.
    An arm is stopped when it is in the bottom half of the live arms by mean (successive
    halving keeps the top ⌈n/2⌉) *and* a one-sided Welch test says it trails the leader
    (p < behind_alpha). Arms with fewer than `min_values` values are not judged, and no
    arm is stopped unless every live arm can be (a rung judged on part of the arms is
    judged on the trials that happen to run first).
    """
    arms = {a: [float(v) for v in vals] for a, vals in interim.items()}
    if len(arms) < 2 or any(len(v) < min_values for v in arms.values()):
        return {}
    means = {a: float(np.mean(v)) for a, v in arms.items()}
    ranked = sorted(arms, key=lambda a: means[a], reverse=True)
    leader = ranked[0]
    keep = math.ceil(len(ranked) / 2)
    out: dict[str, str] = {}
    for arm in ranked[keep:]:
        if arm == baseline:
            continue
        t, df = welch_t(arms[arm], arms[leader])
        p = (0.0 if means[leader] > means[arm] else 1.0) if math.isnan(t) else t_pvalue(t, df, "greater")
        if p < behind_alpha:
            out[arm] = (
                f"behind {leader} ({means[arm]:.3f} vs {means[leader]:.3f}, one-sided Welch p {p:.3g} "
                f"< {behind_alpha:g}) and in the bottom half of {len(ranked)} arms"
            )
    return out
