"""Paired analysis by seed, the sequential boundaries and successive halving, on fixed tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from researcher.analysis import SUPPORTED, analyze, paired_t, pairing, sequential_look
from researcher.sequential import boundaries, halving_stops, nominal_alpha, spent_alpha

BASE = [0.20, 0.25, 0.22, 0.30]  # seeds 0..3
TREAT = [0.28, 0.31, 0.27, 0.41]


def test_paired_t_reproduces_a_hand_computed_value():
    # by hand: d = 0.08, 0.06, 0.05, 0.11; mean 0.075; squared deviations 0.000025 + 0.000225 + 0.000625
    # + 0.001225 = 0.0021; var 0.0021 / 3 = 0.0007; se √0.0007 / √4 = 0.0132288; t = 0.075 / 0.0132288
    t, p, lo, hi = paired_t(BASE, TREAT)
    assert t == pytest.approx(5.66947, abs=1e-4)
    # t(0.975, 3) = 3.182446: interval 0.075 ± 3.182446 × 0.0132288 = 0.075 ± 0.042100
    assert (lo, hi) == (pytest.approx(0.032900, abs=1e-5), pytest.approx(0.117100, abs=1e-5))
    ref = stats.ttest_rel(TREAT, BASE)
    assert (t, p) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue))
    assert p == pytest.approx(0.01090, abs=2e-4)  # two-sided, 3 degrees of freedom
    assert paired_t(BASE, TREAT, "greater")[1] == pytest.approx(ref.pvalue / 2)


def test_analysis_pairs_only_deterministic_trials_with_every_seed_matched():
    metrics, seeds = {"base": BASE, "treat": TREAT}, {"base": [0, 1, 2, 3], "treat": [0, 1, 2, 3]}
    paired = analyze(metrics, "base", seeds=seeds, deterministic=True)["comparisons"][0]
    assert paired["method"] == "paired" and paired["p"] == pytest.approx(stats.ttest_rel(TREAT, BASE).pvalue)
    assert paired["welch"]["p"] == pytest.approx(stats.ttest_ind(TREAT, BASE, equal_var=False).pvalue)
    assert paired["p_holm_welch"] == pytest.approx(paired["welch"]["p"]) and "every seed" in paired["method_reason"]
    welch = analyze(metrics, "base", seeds=seeds, deterministic=False)["comparisons"][0]
    assert welch["method"] == "welch" and "deterministic" in welch["method_reason"] and welch["paired"] is None
    assert welch["p"] == pytest.approx(paired["welch"]["p"])  # the default: Welch, as before
    # seed-matched values given in a different order still pair by seed
    shuffled = analyze(
        {"base": BASE[::-1], "treat": TREAT},
        "base",
        seeds={"base": [3, 2, 1, 0], "treat": [0, 1, 2, 3]},
        deterministic=True,
    )["comparisons"][0]
    assert shuffled["p"] == pytest.approx(paired["p"])
    ok, why = pairing([0, 1, 2, 3], [0, 1, 2], deterministic=True)  # a failed trial leaves seed 3 alone
    assert not ok and "[3]" in why


def test_holm_runs_over_the_tests_used_and_a_stopped_arm_counts_with_p_one():
    rng = np.random.default_rng(3)
    metrics = {"base": list(rng.normal(0.3, 0.05, 4)), "a": list(rng.normal(0.6, 0.05, 4)), "b": [0.1, 0.11, 0.09, 0.1]}
    seeds = {k: [0, 1, 2, 3] for k in metrics}
    r = analyze(metrics, "base", seeds=seeds, deterministic=True, stopped={"b": "stopped at step 3"})
    a, b = r["comparisons"]
    assert b["verdict"] == "inconclusive" and b["p_holm"] == 1.0 and b["stopped"]
    assert a["p_holm"] == pytest.approx(min(1.0, 2 * a["p"]))  # the family still has two members
    assert "stopped early" in r["rule"] and "paired t-test" in r["rule"]


def test_alpha_spending_boundaries_match_the_published_values_and_spend_alpha():
    assert boundaries([1.0]) == [pytest.approx(1.95996, abs=1e-4)]
    # Lan-DeMets Pocock-type, two equally spaced looks, two-sided 0.05: 2.157, 2.201
    assert boundaries([0.5, 1.0], spending="pocock") == [pytest.approx(2.157, abs=2e-3), pytest.approx(2.201, abs=2e-3)]
    # O'Brien-Fleming-type: the first boundary is z_{α/2}/√t, the last close to 1.96
    c = boundaries([0.5, 1.0])
    assert c[0] == pytest.approx(1.959964 / math.sqrt(0.5), abs=1e-4) and c[1] == pytest.approx(1.977, abs=3e-3)
    assert spent_alpha(1.0, 0.05) == pytest.approx(0.05) and spent_alpha(1.0, 0.05, "pocock") == pytest.approx(0.05)
    rng = np.random.default_rng(0)  # crossing probability under no effect: α
    z1 = rng.standard_normal(200_000)
    z2 = z1 * math.sqrt(0.5) + rng.standard_normal(200_000) * math.sqrt(0.5)
    for spending in ("obrien-fleming", "pocock"):
        c1, c2 = boundaries([0.5, 1.0], spending=spending)
        assert np.mean((abs(z1) >= c1) | (abs(z2) >= c2)) == pytest.approx(0.05, abs=0.003)
    assert nominal_alpha([0.5]) < 0.006 < 0.047 < nominal_alpha([0.5, 1.0]) < 0.05
    look = sequential_look([0.5, 1.0], max_seeds=6)
    assert look["look"] == 2 and look["nominal_alpha"] == pytest.approx(nominal_alpha([0.5, 1.0]))
    judged = analyze({"b": [0.0, 0.1, 0.2], "t": [0.25, 0.35, 0.45]}, "b", sequential=sequential_look([0.5]))
    assert judged["comparisons"][0]["p_holm"] < 0.05 and judged["verdict"] == "inconclusive"  # p ≈ 0.03 > 0.0056
    assert analyze({"b": [0.0, 0.1, 0.2], "t": [0.25, 0.35, 0.45]}, "b")["verdict"] == SUPPORTED


def test_successive_halving_stops_only_the_clearly_behind_bottom_half():
    interim = {"base": [0.30, 0.32, 0.31], "a": [0.60, 0.62, 0.61], "b": [0.10, 0.12, 0.11], "c": [0.59, 0.2, 0.4]}
    stops = halving_stops(interim, "base")
    assert list(stops) == ["b"] and "behind a" in stops["b"]  # c is in the bottom half but not clearly behind
    assert halving_stops({"base": [0.1, 0.1, 0.1], "a": [0.9, 0.9, 0.9]}, "base") == {}  # never the baseline
    assert halving_stops({"base": [0.3] * 3, "a": [0.1, 0.1]}, "base") == {}  # a rung with too few trials
