"""A study's `deterministic` default: on for `swarm train` trials (they run --deterministic), off otherwise."""

from __future__ import annotations

import sys

import pytest

from researcher.config import StudyConfig
from researcher.trials import lockstep_allows


def test_swarm_train_trials_are_deterministic_by_default_and_others_are_not() -> None:
    assert StudyConfig(topic="t").deterministic is True
    assert StudyConfig(topic="t", trial_program=[sys.executable, "fake_trial.py"]).deterministic is False
    assert StudyConfig(topic="t", shared_base=True).deterministic is False
    assert StudyConfig(topic="t", deterministic=False).deterministic is False
    with pytest.raises(ValueError, match="shared-base"):
        StudyConfig(topic="t", shared_base=True, deterministic=True)


def test_knobs_that_rule_out_lockstep() -> None:
    assert lockstep_allows({"lr": 3e-4}) and lockstep_allows({"max_staleness": 0, "clients": 1})
    assert not lockstep_allows({"max_staleness": 1}) and not lockstep_allows({"clients": 2})
