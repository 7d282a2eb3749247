"""`summarize`: the run's reward in two means that never share a step."""

from __future__ import annotations

import pytest

from swarm.config.run import RunConfig
from swarm.run_summary import summarize


@pytest.mark.parametrize(("steps", "window"), [(1, 1), (3, 1), (4, 2), (9, 4), (10, 5), (300, 5)])
def test_the_two_reward_means_never_share_a_step(steps: int, window: int) -> None:
    rows = [{"step": i + 1, "reward_mean": i / 100, "reward_mean/arith": i / 100} for i in range(steps)]
    summary = summarize(rows, 1.0, RunConfig())
    assert summary["reward_window"] == window
    assert summary["reward_first_mean"] == pytest.approx(sum(range(window)) / window / 100)
    assert summary["reward_last_mean"] == pytest.approx(sum(range(steps - window, steps)) / window / 100)
    family = summary["families"]["arith"]
    assert (family["reward_first_mean"], family["reward_last_mean"]) == (
        summary["reward_first_mean"],
        summary["reward_last_mean"],
    )
