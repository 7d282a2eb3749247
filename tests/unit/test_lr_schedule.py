"""The lr schedule (swarm/algorithms/schedule.py) and the knobs that turn it on (TrainConfig)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm.algorithms.schedule import lr_at
from swarm.config.train import TrainConfig


def test_no_schedule_is_the_constant_lr() -> None:
    assert [lr_at(3e-4, s) for s in (0, 1, 1000)] == [3e-4] * 3
    cfg = TrainConfig(lr=3e-4)
    assert cfg.at_step(50) is cfg  # nothing copied on the path every step takes


def test_warmup_rises_linearly_and_never_starts_at_zero() -> None:
    # the first step already trains (lr/(w+1)); step w is the first at the full lr
    assert [lr_at(1.0, s, warmup=3) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_decay_by_hand() -> None:
    lr, w, d, floor = 1e-3, 10, 100, 0.1
    assert lr_at(lr, w, w, d, floor) == pytest.approx(lr)  # the decay starts at the peak
    assert lr_at(lr, w + 50, w, d, floor) == pytest.approx(lr * (0.1 + 0.9 * 0.5))  # cos(pi/2) = 0
    assert lr_at(lr, w + 25, w, d, floor) == pytest.approx(lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))))
    assert lr_at(lr, w + d, w, d, floor) == pytest.approx(lr * floor)
    assert lr_at(lr, w + 10 * d, w, d, floor) == pytest.approx(lr * floor)  # then holds


@given(
    step=st.integers(0, 10_000),
    warmup=st.integers(0, 500),
    decay=st.integers(0, 5_000),
    floor=st.floats(0.0, 1.0),
)
def test_the_lr_stays_in_bounds_and_decays_monotonically(step: int, warmup: int, decay: int, floor: float) -> None:
    now, then = lr_at(2e-4, step, warmup, decay, floor), lr_at(2e-4, step + 1, warmup, decay, floor)
    assert 0.0 <= now <= 2e-4 * (1 + 1e-12)
    if step < warmup:
        assert now > 0.0 and then >= now  # rising, and the first step already trains
    else:
        assert 2e-4 * floor * (1 - 1e-9) <= now and then <= now + 1e-18  # falling to the floor, never under


def test_at_step_changes_only_the_lr() -> None:
    cfg = TrainConfig(lr=1e-3, lr_warmup_steps=4, lr_decay_steps=10, kl_coef=0.1)
    got = cfg.at_step(0)
    assert got.lr == pytest.approx(2e-4) and got.kl_coef == 0.1 and cfg.lr == 1e-3
    assert got.model_dump(exclude={"lr"}) == cfg.model_dump(exclude={"lr"})


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="step must be"):
        lr_at(1e-3, -1)
    for bad in ({"lr_warmup_steps": -1}, {"lr_decay_steps": -5}, {"lr_min_ratio": 1.5}):
        with pytest.raises(ValueError):
            TrainConfig(**bad)
