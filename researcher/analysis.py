"""Statistics of one round: per-arm means with t-intervals, Welch or paired tests, Holm correction, a verdict.

Pure functions over numbers (no I/O; the plots of a result are researcher/plots.py), deterministic, so a
re-run analysis gives the same report:

    metrics = {"lr=0": [0.21, 0.20, 0.22], "lr=0.0003": [0.55, 0.61, 0.58]}
    result = analyze(metrics, baseline="lr=0", direction="greater")
    result["verdict"]            # "supported"

Why these statistics: a study has 3 to 5 seeds per arm. A percentile bootstrap
of 2 values is just their min and max, and at n = 3 it is far too narrow, so the
intervals are Student-t (per arm) and Welch–Satterthwaite (differences), which are
exact for normal noise at any n. Several treatments against one control are
Holm-corrected, so "supported because one of three arms won" keeps its 5 % error
rate. The rule itself is `VERDICT_RULE`, printed in every report.

Arms share seeds (seed 0 of every arm, seed 1 ...). When the study declares its trials
deterministic (the same config and seed give the same run), the seed is a real blocking
factor and a comparison uses the paired t-test on the seed-matched differences, which
removes the seed-to-seed spread the arms share; the Welch result stays beside it. While
one seed can give different runs, pairing by seed carries no information (and costs
degrees of freedom), so the Welch test is used, and the report says which and why
(`pairing`). A round that is one look of a sequential comparison (more seeds after an
inconclusive look) is judged at that look's alpha-spending level (researcher/sequential.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from researcher.experiment import MIN_SEEDS
from researcher.sequential import boundaries, nominal_alpha, spent_alpha, t_pvalue, welch_t

ALPHA = 0.05
LEVEL = 0.95
MIN_N = MIN_SEEDS  # completed trials per arm below which a comparison says nothing
BOOTSTRAP_SEED = 20240611
N_BOOTSTRAP = 10_000
WINDOW_FRACTION = 0.2  # the metric averages the last 20 % of a trial's steps ...
MAX_WINDOW = 5  # ... at least 1 and at most 5 steps
# a true difference of this many seed-to-seed SDs is called at least 80 % of the time with
# MIN_SEEDS seeds per arm (tests/researcher/test_calibration.py holds the claim to it)
DETECTABLE_SDS = 4.0

SUPPORTED = "supported"
REFUTED = "refuted"
INCONCLUSIVE = "inconclusive"
TOO_FEW = "too few seeds to say"

VERDICT_RULE = (
    "Each treatment is compared with the baseline by Welch's two-sided t-test on the per-trial "
    "metric; the p-values of the {m} comparison(s) of this round are Holm-adjusted (family-wise "
    "error at most α = {alpha}). A comparison is *supported* when its adjusted p < α and the "
    "difference has the predicted sign (any sign for a two-sided hypothesis), *refuted* when "
    "adjusted p < α with the opposite sign, and *inconclusive* otherwise; with fewer than {min_n} "
    "completed trials in either arm it is *too few seeds to say*. The round is supported if any "
    "treatment is, refuted if every compared treatment is, too few seeds to say if none could be "
    "compared, inconclusive otherwise. Intervals are 95 % Student-t intervals (per arm) and "
    "Welch intervals (differences), not adjusted for multiplicity. final_reward and reward_gain average "
    "the last {fraction:.0%} of a trial's steps (at least 1, at most {max_window}). With {min_n} seeds per arm "
    "a true difference of about {sds:g} seed-to-seed standard deviations is found at least 80 % of "
    "the time; smaller effects often come out inconclusive, so an inconclusive round is not evidence "
    "of no effect."
)


def metric_window(steps: int) -> int:
    """Steps the final-reward metric averages: scales with the trial so a 2-step trial
    is not scored on 5 steps, and a long one on its end rather than its middle."""
    return max(1, min(MAX_WINDOW, math.ceil(WINDOW_FRACTION * max(1, steps))))


PAIRED_RULE = (
    " Where a comparison is marked *paired*, its test is the paired t-test on the seed-matched "
    "differences (treatment − baseline at the same seed) and its interval the paired t-interval; "
    "that is used only when the study declares its trials deterministic and every seed of each arm "
    "has its match in the other. The Welch result is shown beside it."
)
SEQUENTIAL_RULE = (
    " This round is look {look} of a sequential comparison (more seeds after an inconclusive look): "
    "α is spent by the {spending} Lan–DeMets function over information fractions {fractions} "
    "(seeds per arm so far / at most {max_seeds}), so this look is judged at adjusted p < {nominal:.4g} "
    "(z boundary {z:.3f}; α spent so far {spent:.4g}) and the false-positive rate over all looks stays "
    "at most α."
)
STOPPED_RULE = (
    " An arm stopped early (successive halving: in the bottom half at a rung and clearly behind the "
    "leader) is never called supported; its p-value counts as 1 in the Holm family."
)


def verdict_rule(
    m: int,
    alpha: float = ALPHA,
    sequential: Mapping[str, Any] | None = None,
    paired: bool = False,
    stopped: bool = False,
) -> str:
    """The rule a round was judged by, in words: the base rule, plus what pairing,
    sequential looks and early stopping changed (each only when it applied)."""
    text = VERDICT_RULE.format(
        m=m, alpha=alpha, min_n=MIN_N, fraction=WINDOW_FRACTION, max_window=MAX_WINDOW, sds=DETECTABLE_SDS
    )
    if paired:
        text += PAIRED_RULE
    if sequential:
        text += SEQUENTIAL_RULE.format(
            look=sequential["look"],
            spending=sequential["spending"],
            fractions=", ".join(f"{f:.2f}" for f in sequential["fractions"]),
            max_seeds=sequential.get("max_seeds", "?"),
            nominal=sequential["nominal_alpha"],
            z=sequential["boundary_z"],
            spent=sequential["alpha_spent"],
        )
    if stopped:
        text += STOPPED_RULE
    return text


def trial_metric(rewards: Sequence[float], metric: str, window: int | None = None) -> float | None:
    """One trial's score from its per-step mean rewards; window None: `metric_window` of its length."""
    r = [float(x) for x in rewards if x is not None and not math.isnan(float(x))]
    if not r:
        return None
    w = max(1, min(window if window is not None else metric_window(len(r)), len(r)))
    if metric == "final_reward":
        return float(np.mean(r[-w:]))
    if metric == "reward_gain":
        return float(np.mean(r[-w:]) - np.mean(r[:w]))
    if metric == "mean_reward":
        return float(np.mean(r))
    raise ValueError(f"unknown metric {metric!r}")


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student-t interval of the mean (nan below 2 values: one value has no spread)."""
    from scipy import special  # lazy: scipy takes a second or two to import (and stats.t is slow per call)

    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return (math.nan, math.nan)
    half = special.stdtrit(x.size - 1, 0.5 + level / 2) * x.std(ddof=1) / math.sqrt(x.size)
    return (float(x.mean() - half), float(x.mean() + half))


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Interval of mean(b) − mean(a) with Welch–Satterthwaite degrees of freedom."""
    from scipy import special  # lazy: see t_interval

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        return (math.nan, math.nan)
    va, vb = xa.var(ddof=1) / xa.size, xb.var(ddof=1) / xb.size
    diff = float(xb.mean() - xa.mean())
    if va + vb == 0:
        return (diff, diff)
    df = (va + vb) ** 2 / (va**2 / (xa.size - 1) + vb**2 / (xb.size - 1))
    half = special.stdtrit(df, 0.5 + level / 2) * math.sqrt(va + vb)
    return (diff - half, diff + half)


def bootstrap_ci(
    values: Sequence[float], level: float = LEVEL, n: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """BCa bootstrap interval of the mean (fixed seed: reproducible); nan below MIN_N values.

    Not used for verdicts (at 3 to 5 seeds the t-interval is the honest one); kept for a
    robustness check on studies with many seeds, where the noise may be far from normal.
    """
    from scipy import stats  # lazy: see t_interval

    x = np.asarray(values, dtype=float)
    if x.size < MIN_N:
        return (math.nan, math.nan)
    if np.all(x == x[0]):
        return (float(x[0]), float(x[0]))
    res = stats.bootstrap(
        (x,), np.mean, confidence_level=level, n_resamples=n, method="BCa", random_state=np.random.default_rng(seed)
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


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
    t, df = welch_t(xa, xb)  # scipy.stats.ttest_ind(equal_var=False) computes the same, 100 × slower
    return (t, t_pvalue(t, df, direction))


def paired_t(
    a: Sequence[float], b: Sequence[float], direction: str = "two-sided", level: float = LEVEL
) -> tuple[float, float, float, float]:
    """Paired t-test of b against a on the differences b_i − a_i: (t, p, ci_low, ci_high).

    t = mean(d) / (sd(d) / √n) with n − 1 degrees of freedom; the interval is the
    Student-t interval of mean(d). `a[i]` and `b[i]` must come from the same seed.
    With identical differences (sd 0) the test is decided by their sign, as `welch` does.
    """
    from scipy import special  # lazy: see t_interval

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size != xb.size:
        raise ValueError(f"paired samples need equal sizes, got {xa.size} and {xb.size}")
    d = xb - xa
    n = d.size
    if n < 2:
        return (math.nan, math.nan, math.nan, math.nan)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        if mean == 0:
            return (0.0, 1.0, 0.0, 0.0)
        p = 0.0 if direction == "two-sided" or (direction == "greater") == (mean > 0) else 1.0
        return (math.copysign(math.inf, mean), p, mean, mean)
    t = mean / (sd / math.sqrt(n))  # what scipy.stats.ttest_rel computes (tests/researcher/test_paired.py)
    half = float(special.stdtrit(n - 1, 0.5 + level / 2)) * sd / math.sqrt(n)
    return (t, t_pvalue(t, n - 1, direction), mean - half, mean + half)


def pairing(base_seeds: Sequence[int] | None, arm_seeds: Sequence[int] | None, deterministic: bool) -> tuple[bool, str]:
    """Whether a comparison may be paired by seed, and why (a sentence for the report).

    Paired only when the trials are deterministic (else the same seed gives different
    runs and pairing by it means nothing) and every seed of each arm has its match in
    the other (a failed or stopped trial leaves its partner unmatched: Welch then).
    """
    if not deterministic:
        return False, (
            "Welch (unpaired): the study does not declare its trials deterministic, and while the same "
            "seed can give different runs, pairing by seed carries no information"
        )
    if base_seeds is None or arm_seeds is None:
        return False, "Welch (unpaired): the trials' seeds are not known"
    sb, sa = list(base_seeds), list(arm_seeds)
    if len(set(sb)) != len(sb) or len(set(sa)) != len(sa):
        return False, "Welch (unpaired): a seed occurs twice in one arm"
    if set(sb) != set(sa):
        lone = sorted(set(sb) ^ set(sa))
        return False, f"Welch (unpaired): seed(s) {lone} have no match in the other arm (failed or stopped trials)"
    if len(sb) < 2:
        return False, "Welch (unpaired): fewer than 2 matched seeds"
    return True, "paired t on seed-matched differences: the trials are deterministic and every seed has its match"


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values (same order as given): p_(i) × (m − i + 1), kept monotone."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def _clean(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _g(x: float | None) -> float | str | None:
    """JSON-safe: inf as a string, nan as None."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def _arm_summary(values: Sequence[float]) -> dict[str, Any]:
    x = [float(v) for v in values]
    lo, hi = t_interval(x)
    return {
        "n": len(x),
        "values": x,
        "mean": _clean(float(np.mean(x))) if x else None,
        "std": _clean(float(np.std(x, ddof=1))) if len(x) > 1 else None,
        "ci_low": _clean(lo),
        "ci_high": _clean(hi),
    }


def _comparison(
    base: list[float],
    vals: list[float],
    a: dict,
    b: dict,
    base_seeds: Sequence[int] | None = None,
    arm_seeds: Sequence[int] | None = None,
    deterministic: bool = False,
) -> dict[str, Any]:
    diff = (b["mean"] - a["mean"]) if a["mean"] is not None and b["mean"] is not None else None
    enough = len(base) >= MIN_N and len(vals) >= MIN_N
    t, p = welch(base, vals, "two-sided") if enough else (math.nan, math.nan)
    lo, hi = welch_interval(base, vals)
    overlap = None
    if None not in (a["ci_low"], a["ci_high"], b["ci_low"], b["ci_high"]):
        overlap = not (b["ci_low"] > a["ci_high"] or a["ci_low"] > b["ci_high"])
    welch_result = {"t": _g(t), "p": _clean(p), "ci_low": _clean(lo), "ci_high": _clean(hi)}
    paired, why = pairing(base_seeds, arm_seeds, deterministic)
    paired_result = None
    if paired and enough:
        assert base_seeds is not None and arm_seeds is not None
        by_seed = dict(zip(base_seeds, base, strict=True))
        order = list(arm_seeds)
        pt, pp, plo, phi = paired_t([by_seed[s] for s in order], vals, "two-sided")
        paired_result = {
            "t": _g(pt),
            "p": _clean(pp),
            "ci_low": _clean(plo),
            "ci_high": _clean(phi),
            "n_pairs": len(order),
        }
    used = paired_result or welch_result
    return {
        "diff": _clean(diff),
        "n": [len(base), len(vals)],
        "enough": enough,
        "method": "paired" if paired_result else "welch",
        "method_reason": why,
        "diff_ci_low": used["ci_low"],
        "diff_ci_high": used["ci_high"],
        "hedges_g": _g(hedges_g(base, vals)),
        "t": used["t"],
        "p": used["p"],
        "welch": welch_result,
        "paired": paired_result,
        "ci_overlap": overlap,
        "better": None,
        "stopped": None,
    }


def sequential_look(
    fractions: Sequence[float], alpha: float = ALPHA, spending: str = "obrien-fleming", max_seeds: int | None = None
) -> dict[str, Any]:
    """What the last of these looks is judged at (see researcher/sequential.py), JSON-able."""
    z = boundaries(fractions, alpha, spending)[-1]
    return {
        "look": len(fractions),
        "fractions": [float(f) for f in fractions],
        "spending": spending,
        "max_seeds": max_seeds,
        "alpha_spent": spent_alpha(fractions[-1], alpha, spending),
        "nominal_alpha": nominal_alpha(fractions, alpha, spending),
        "boundary_z": _g(z),
    }


def analyze(
    metrics: Mapping[str, Sequence[float]],
    baseline: str,
    direction: str = "two-sided",
    alpha: float = ALPHA,
    *,
    seeds: Mapping[str, Sequence[int]] | None = None,
    deterministic: bool = False,
    sequential: Mapping[str, Any] | None = None,
    stopped: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Per-arm summaries, each treatment compared with the baseline, and a verdict (`VERDICT_RULE`).

    The test is two-sided even for a directional hypothesis: "supported" and
    "refuted" together must stay within α when nothing differs.

    `seeds`: each arm's seeds, in the order of its values (pairing needs them);
    `deterministic`: the study's trials are reproducible, so seed-matched arms are
    compared by the paired t-test (`pairing`); `sequential`: this round is a look of a
    sequential comparison (`sequential_look`), judged at its nominal level instead of α;
    `stopped`: arms stopped early, {arm: why}, never supported and counted with p = 1.
    """
    stopped = dict(stopped or {})
    level = float(sequential["nominal_alpha"]) if sequential else alpha
    arms = {arm: _arm_summary(vals) for arm, vals in metrics.items()}
    base = [float(v) for v in metrics.get(baseline, [])]
    seeds = seeds or {}
    comparisons = []
    for arm, vals in metrics.items():
        if arm == baseline:
            continue
        c = _comparison(
            base,
            [float(v) for v in vals],
            arms.get(baseline, _arm_summary([])),
            arms[arm],
            seeds.get(baseline),
            seeds.get(arm),
            deterministic,
        )
        c.update(arm=arm, baseline=baseline, stopped=stopped.get(arm))
        if c["diff"]:
            c["better"] = arm if c["diff"] > 0 else baseline
        comparisons.append(c)
    for arm, why in stopped.items():  # a stopped arm with no completed trial still counts in the family
        if arm != baseline and arm not in metrics:
            c = _comparison(base, [], arms.get(baseline, _arm_summary([])), _arm_summary([]))
            c.update(arm=arm, baseline=baseline, stopped=why)
            arms[arm] = _arm_summary([])
            comparisons.append(c)
    family = [c for c in comparisons if (c["enough"] and c["p"] is not None) or c["stopped"]]
    for key, get in (("p_holm", lambda c: c["p"]), ("p_holm_welch", lambda c: c["welch"]["p"])):
        for c, p_adj in zip(
            family, holm([1.0 if c["stopped"] or get(c) is None else get(c) for c in family]), strict=True
        ):
            c[key] = p_adj
    for c in comparisons:
        c.setdefault("p_holm", None)
        c.setdefault("p_holm_welch", None)
        c["verdict"] = _verdict(c, direction, level)
        c["verdict_welch"] = _verdict({**c, "p_holm": c["p_holm_welch"]}, direction, level)
    verdicts = [c["verdict"] for c in comparisons]
    compared = [v for v in verdicts if v != TOO_FEW]
    if SUPPORTED in compared:
        overall = SUPPORTED
    elif compared and all(v == REFUTED for v in compared):
        overall = REFUTED
    elif not compared:
        overall = TOO_FEW
    else:
        overall = INCONCLUSIVE
    any_paired = any(c["method"] == "paired" for c in comparisons)
    return {
        "arms": arms,
        "baseline": baseline,
        "direction": direction,
        "alpha": alpha,
        "level": level,
        "min_n": MIN_N,
        "comparisons": comparisons,
        "verdict": overall,
        "deterministic": deterministic,
        "sequential": dict(sequential) if sequential else None,
        "stopped": stopped,
        "rule": verdict_rule(len(family), alpha, sequential, any_paired, bool(stopped)),
    }


def _verdict(c: dict[str, Any], direction: str, alpha: float) -> str:
    if c.get("stopped"):
        return INCONCLUSIVE
    if not c["enough"]:
        return TOO_FEW
    if c["p_holm"] is None or c["p_holm"] >= alpha or not c["diff"]:
        return INCONCLUSIVE
    if direction == "two-sided" or (direction == "greater") == (c["diff"] > 0):
        return SUPPORTED
    return REFUTED
