import math

import pytest

from researcher.analysis import (
    TOO_FEW,
    analyze,
    bootstrap_ci,
    hedges_g,
    holm,
    metric_window,
    t_interval,
    trial_metric,
    verdict_rule,
    welch,
    welch_interval,
)


def test_trial_metric():
    r = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert math.isclose(trial_metric(r, "final_reward", 5), 0.4)
    assert math.isclose(trial_metric(r, "reward_gain", 2), 0.55 - 0.05)
    assert math.isclose(trial_metric(r, "mean_reward"), 0.3)
    assert trial_metric([], "final_reward") is None


def test_the_metric_window_scales_with_the_trial():
    assert [metric_window(s) for s in (1, 2, 5, 10, 12, 40, 1000)] == [1, 1, 1, 2, 3, 5, 5]
    assert trial_metric([0.0, 1.0], "final_reward") == 1.0  # a 2-step trial: its last step, not both


def test_bootstrap_is_deterministic_and_covers_the_mean():
    x = [0.1, 0.4, 0.35, 0.2]
    assert bootstrap_ci(x) == bootstrap_ci(x)
    lo, hi = bootstrap_ci(x)
    assert lo < sum(x) / 4 < hi


def test_intervals_are_honest_at_small_n():
    lo, hi = t_interval([0.20, 0.21, 0.22])
    assert (round(lo, 3), round(hi, 3)) == (0.185, 0.235)  # the percentile bootstrap said [0.200, 0.220]
    assert all(math.isnan(v) for v in t_interval([0.2]))
    lo, hi = welch_interval([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert lo < 3.0 < hi and math.isclose(hi - 3.0, 3.0 - lo)
    # two values per arm are not "a CI from their min and max"
    r = analyze({"a": [0.1, 0.2], "b": [0.5, 0.6]}, "a")
    assert r["arms"]["a"]["ci_low"] < 0.1 and r["arms"]["a"]["ci_high"] > 0.2


def test_effect_size_and_welch():
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    assert math.isclose(hedges_g(a, b), 3.0 * (1 - 3 / (4 * 6 - 9)))
    t, p = welch(a, b, "greater")
    assert t > 0 and 0.005 < p < 0.02
    assert welch(a, b, "less")[1] > 0.9


def test_holm():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([]) == []


def test_verdicts():
    base, better = [0.20, 0.21, 0.19], [0.55, 0.60, 0.58]
    r = analyze({"lr=0": base, "lr=3e-4": better}, "lr=0", "greater")
    c = r["comparisons"][0]
    assert r["verdict"] == "supported" and c["ci_overlap"] is False and c["better"] == "lr=3e-4"
    assert analyze({"a": better, "b": base}, "a", "greater")["verdict"] == "refuted"
    noisy = analyze({"a": [0.1, 0.5, 0.3], "b": [0.2, 0.4, 0.35]}, "a", "two-sided")
    assert noisy["verdict"] == "inconclusive" and noisy["comparisons"][0]["ci_overlap"] is True
    empty = analyze({"a": [], "b": [0.2]}, "a")
    assert empty["verdict"] == TOO_FEW and empty["comparisons"][0]["verdict"] == TOO_FEW


def test_too_few_seeds_to_say_below_the_minimum():
    r = analyze({"a": [0.2, 0.21], "b": [0.9, 0.91]}, "a", "greater")  # huge gap, 2 seeds
    assert r["verdict"] == TOO_FEW and r["comparisons"][0]["p"] is None
    mixed = analyze({"a": [0.2, 0.21, 0.19], "b": [0.9, 0.91], "c": [0.5, 0.52, 0.51]}, "a", "greater")
    assert [c["verdict"] for c in mixed["comparisons"]] == [TOO_FEW, "supported"]


def test_several_treatments_are_holm_corrected():
    base = [0.30, 0.35, 0.25]
    one = [0.45, 0.50, 0.40]  # p ≈ 0.025 alone: supported against a single control ...
    assert analyze({"a": base, "b": one}, "a")["verdict"] == "supported"
    r = analyze({"a": base, "b": one, "c": base[::-1], "d": [0.31, 0.36, 0.24]}, "a")
    c = r["comparisons"][0]
    assert c["p"] < 0.05 <= c["p_holm"] and r["verdict"] == "inconclusive"  # ... not among three
    assert r["rule"] == verdict_rule(3) and "3 comparison(s)" in r["rule"] and "Holm" in r["rule"]
