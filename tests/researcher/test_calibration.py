"""The verdict rule holds its promises on simulated studies (normal seed noise, seconds, in CI).

* no true difference: the study calls "inconclusive" (never "supported"/"refuted")
  at least 95 % of the time, with one treatment and with three (Holm);
* a planted difference of `DETECTABLE_SDS` seed-to-seed SDs with the default seeds
  (`MIN_SEEDS` per arm) is called "supported" at least 80 % of the time.

Fixed seeds: the same simulated studies every run.
"""

from __future__ import annotations

import numpy as np
import pytest

from researcher.analysis import DETECTABLE_SDS, INCONCLUSIVE, SUPPORTED, analyze
from researcher.planning import PlanDefaults

REPS = 400


def calls(delta: float, treatments: int, direction: str, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    n = PlanDefaults().seeds
    out: dict[str, int] = {}
    for _ in range(REPS):
        metrics = {"base": list(0.3 + 0.05 * rng.standard_normal(n))}
        for i in range(treatments):
            shift = delta * 0.05 if i == 0 else 0.0
            metrics[f"arm{i}"] = list(0.3 + shift + 0.05 * rng.standard_normal(n))
        verdict = analyze(metrics, "base", direction)["verdict"]
        out[verdict] = out.get(verdict, 0) + 1
    return out


@pytest.mark.parametrize("treatments, direction", [(1, "greater"), (1, "two-sided"), (3, "two-sided")])
def test_no_true_difference_is_called_inconclusive_95_percent_of_the_time(treatments, direction):
    got = calls(0.0, treatments, direction, seed=11 + treatments)
    assert got.get(INCONCLUSIVE, 0) >= 0.95 * REPS, got


@pytest.mark.parametrize("direction", ["greater", "two-sided"])
def test_a_planted_difference_is_found_80_percent_of_the_time_with_the_default_seeds(direction):
    assert PlanDefaults().seeds == 3
    got = calls(DETECTABLE_SDS, 1, direction, seed=7)
    assert got.get(SUPPORTED, 0) >= 0.8 * REPS, got
