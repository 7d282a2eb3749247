"""Batcher: groups by task, B groups per step, on-policy admission (pure, no server)."""

from __future__ import annotations

import pytest

from swarm.samples import TrainSample
from swarm.server.batcher import Batcher, FinishedEpisode
from swarm.server.exceptions import Refused


def _finish(b: Batcher, group_id: str, eid: str, reward: float = 1.0) -> None:
    sample = TrainSample([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5], eid, group_id, reward)
    b.finish(group_id, FinishedEpisode(eid, reward, [sample]))


def test_group_completes_with_n_finished_and_step_needs_b_groups() -> None:
    b = Batcher(group_size=2, batch_groups=2)
    g1 = b.admit("a", "e1")
    assert b.admit("a", "e2") is g1
    g2 = b.admit("b", "e3")
    b.admit("b", "e4")
    assert g1.group_id != g2.group_id
    _finish(b, g1.group_id, "e1")
    assert not g1.complete
    _finish(b, g1.group_id, "e2")
    assert g1.complete and b.complete_groups() == 1 and not b.ready()
    _finish(b, g2.group_id, "e3")
    _finish(b, g2.group_id, "e4", 0.0)
    assert b.ready()
    batch = b.take()
    assert len(batch.groups) == 2 and len(batch.samples) == 4
    stats = batch.stats()
    assert stats["reward_mean"] == 0.75 and stats["episodes"] == 4
    assert stats["generated_tokens"] == 8 and stats["tokens"] == 12


def test_admission_caps_tasks_and_slots_per_policy_version() -> None:
    b = Batcher(group_size=2, batch_groups=1, claims_during_step=False)
    g = b.admit("a", "e1")
    b.admit("a", "e2")
    with pytest.raises(Refused) as r:
        b.admit("a", "e3")  # group full, and no room for a second group
    assert r.value.code == "window_full"
    with pytest.raises(Refused):
        b.admit("b", "e4")
    _finish(b, g.group_id, "e1")
    _finish(b, g.group_id, "e2")
    b.take()
    with pytest.raises(Refused) as r:  # while the step trains
        b.admit("b", "e5")
    assert r.value.code == "training"
    b.reopen()
    g2 = b.admit("b", "e5")
    assert g2.group_id.startswith("b#w1")


def test_abort_frees_slot_and_drop_shrinks_group() -> None:
    b = Batcher(group_size=2, batch_groups=1)
    g = b.admit("a", "e1")
    b.admit("a", "e2")
    b.release(g.group_id, "e2")  # released: another claim of "a" may take it
    assert g.free == 1
    assert b.admit("a", "e3") is g
    with pytest.raises(Refused):
        b.admit("a", "e4")
    _finish(b, g.group_id, "e1")
    b.release(g.group_id, "e3", drop=True)  # given up: the group completes smaller
    assert g.complete and b.ready()
    assert len(b.take().episodes) == 1


def test_empty_group_after_release_gives_its_place_back() -> None:
    b = Batcher(group_size=2, batch_groups=1)
    g = b.admit("a", "e1")
    b.release(g.group_id, "e1")
    g2 = b.admit("b", "e2")  # "a" left nothing behind; "b" may open the only group
    assert g2.task_id == "b" and g2.group_id != g.group_id


def test_same_task_opens_second_group_once_first_is_full() -> None:
    b = Batcher(group_size=2, batch_groups=2)
    g1 = b.admit("a", "e1")
    b.admit("a", "e2")
    g2 = b.admit("a", "e3")
    assert g2 is not g1 and g2.task_id == "a"


def test_finish_without_slot_is_an_error() -> None:
    b = Batcher(group_size=2, batch_groups=1)
    with pytest.raises(KeyError):
        b.finish("nope", FinishedEpisode("x", 1.0, []))
    with pytest.raises(RuntimeError):
        b.take()


def test_batch_stats_report_reward_per_family() -> None:
    from swarm.server.batcher import Batch, Group

    g1 = Group(
        "a#w0g0",
        "a",
        2,
        finished=[FinishedEpisode("e1", 1.0, [], family="math"), FinishedEpisode("e2", 0.0, [], family="math")],
    )
    g2 = Group("b#w0g1", "b", 1, finished=[FinishedEpisode("e3", 0.5, [], family="code")])
    stats = Batch(window=0, groups=[g1, g2]).stats()
    assert stats["reward_mean/math"] == 0.5 and stats["reward_mean/code"] == 0.5
    assert stats["episodes/math"] == 2 and stats["episodes/code"] == 1 and stats["reward_mean"] == 0.5
