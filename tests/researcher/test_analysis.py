import math

from researcher.analysis import analyze, bootstrap_ci, hedges_g, trial_metric, welch


def test_trial_metric():
    r = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert math.isclose(trial_metric(r, "final_reward", 5), 0.4)
    assert math.isclose(trial_metric(r, "reward_gain", 2), 0.55 - 0.05)
    assert math.isclose(trial_metric(r, "mean_reward"), 0.3)
    assert trial_metric([], "final_reward") is None


def test_bootstrap_is_deterministic_and_covers_the_mean():
    x = [0.1, 0.4, 0.35, 0.2]
    assert bootstrap_ci(x) == bootstrap_ci(x)
    lo, hi = bootstrap_ci(x)
    assert lo < sum(x) / 4 < hi


def test_effect_size_and_welch():
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    assert math.isclose(hedges_g(a, b), 3.0 * (1 - 3 / (4 * 6 - 9)))
    t, p = welch(a, b, "greater")
    assert t > 0 and 0.005 < p < 0.02
    assert welch(a, b, "less")[1] > 0.9


def test_verdicts():
    base, better = [0.20, 0.21, 0.19], [0.55, 0.60, 0.58]
    r = analyze({"lr=0": base, "lr=3e-4": better}, "lr=0", "greater")
    c = r["comparisons"][0]
    assert r["verdict"] == "supported" and c["ci_overlap"] is False and c["better"] == "lr=3e-4"
    assert analyze({"a": better, "b": base}, "a", "greater")["verdict"] == "refuted"
    noisy = analyze({"a": [0.1, 0.5, 0.3], "b": [0.2, 0.4, 0.35]}, "a", "two-sided")
    assert noisy["verdict"] == "inconclusive" and noisy["comparisons"][0]["ci_overlap"] is True
    empty = analyze({"a": [], "b": [0.2]}, "a")
    assert empty["verdict"] == "inconclusive"
