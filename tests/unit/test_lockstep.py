"""Deterministic mode's pure parts: seed derivation, slots, a batch's fixed order, the claim turnstile,
and the config rules of `--deterministic` (swarm/server/lockstep.py, swarm/client/_turnstile.py)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from swarm.client._turnstile import Turnstile
from swarm.config.run import RunConfig
from swarm.config.server import ServerConfig
from swarm.server.batcher import Batch, Batcher, FinishedEpisode, Group
from swarm.server.episodes import Episode
from swarm.server.lockstep import SEED_MOD, Lockstep, batch_order, derive_seed, free_slot


def _episode(episode_id: str, group: Group) -> Episode:
    return Episode(episode_id, group.task_id, "arith", group.group_id, {}, 0, 0.0, 0.0)


def test_derived_seeds_are_stable_distinct_and_in_range() -> None:
    places = [
        (s, t, o, slot, c) for s in (0, 1) for t in ("a-0", "a-1") for o in (0, 1) for slot in range(4) for c in (0, 1)
    ]
    seeds = [derive_seed(*p) for p in places]
    assert seeds == [derive_seed(*p) for p in places]  # a function of the place alone
    assert len(set(seeds)) == len(places)  # every part of the place counts
    assert all(0 <= s < SEED_MOD for s in seeds)
    # n choices of one call add their index: that must not land on a neighbour's seed
    assert not {s + i for s in seeds for i in range(1, 64)} & set(seeds)


def test_free_slot_gives_a_released_index_back() -> None:
    assert free_slot([]) == 0
    assert free_slot([0, 1, 3]) == 2
    assert free_slot([1, 2]) == 0


def test_slots_follow_claims_and_a_replacement_takes_the_released_index() -> None:
    lock = Lockstep(run_seed=7)
    batcher = Batcher(group_size=3, batch_groups=1)
    g = batcher.admit("t0", "e0")
    assert lock.admitted("e0", g) == 0
    batcher.admit("t0", "e1")
    assert lock.admitted("e1", g) == 1
    batcher.release(g.group_id, "e0")  # aborted with release: its slot is free again
    batcher.admit("t0", "e2")
    assert lock.admitted("e2", g) == 0
    batcher.admit("t0", "e3")
    assert lock.admitted("e3", g) == 2
    assert lock.admitted("e3", g) == 2  # asked again: the same slot


def test_a_calls_seed_depends_on_its_place_not_on_who_claimed_first() -> None:
    def seeds(claim_order: list[str]) -> dict[int, list[int]]:
        lock = Lockstep(run_seed=3)
        batcher = Batcher(group_size=2, batch_groups=1)
        out: dict[int, list[int]] = {}
        for eid in claim_order:
            g = batcher.admit("task-5", eid)
            slot = lock.admitted(eid, g)
            ep = _episode(eid, g)
            out[slot] = [lock.seed_for(ep), lock.seed_for(ep)]  # two calls: each its own seed
        return out

    first, second = seeds(["x", "y"]), seeds(["y", "x"])
    assert first == second  # slot 0's calls sample alike whichever thread claimed first
    assert first[0][0] != first[0][1] != first[1][0]
    assert first[0][0] == derive_seed(3, "task-5", 0, 0, 0) and first[1][1] == derive_seed(3, "task-5", 0, 1, 1)


def test_a_tasks_later_group_is_a_new_occurrence() -> None:
    lock = Lockstep(run_seed=0)
    g1 = Group("t#w0g0", "t", 1, claimed={"a"})
    g2 = Group("t#w1g0", "t", 1, claimed={"b"})
    lock.admitted("a", g1)
    lock.admitted("b", g2)
    assert lock.seed_for(_episode("a", g1)) != lock.seed_for(_episode("b", g2))
    assert lock.occurrence == {"t#w0g0": 0, "t#w1g0": 1}


def _finished(eid: str) -> FinishedEpisode:
    return FinishedEpisode(eid, 1.0, [])


def test_batch_order_ignores_admission_and_finish_order() -> None:
    occurrence = {"b#1": 0, "a#2": 0, "a#3": 1}
    slots = {"e0": 0, "e1": 1, "e2": 2, "f0": 0, "g0": 0}
    expected = None
    for trial in range(6):
        rng = random.Random(trial)
        members = [_finished(e) for e in ("e0", "e1", "e2")]
        rng.shuffle(members)  # finish order: timing
        groups = [
            Group("b#1", "b", 3, finished=members),
            Group("a#2", "a", 1, finished=[_finished("f0")]),
            Group("a#3", "a", 1, finished=[_finished("g0")]),
        ]
        rng.shuffle(groups)  # admission order (two fleets racing)
        ordered = batch_order(groups, occurrence, slots)
        got = [(g.group_id, [e.episode_id for e in g.finished]) for g in ordered]
        assert expected is None or got == expected
        expected = got
    assert expected == [("a#2", ["f0"]), ("a#3", ["g0"]), ("b#1", ["e0", "e1", "e2"])]


def test_order_sorts_a_taken_batch_and_forgets_its_groups() -> None:
    lock = Lockstep(run_seed=0)
    batcher = Batcher(group_size=2, batch_groups=2)
    for task, eids in (("t1", ("p", "q")), ("t0", ("r", "s"))):
        for eid in eids:
            g = batcher.admit(task, eid)
            lock.admitted(eid, g)
    for eid, gid in (("q", "t1#w0g0"), ("s", "t0#w0g1"), ("p", "t1#w0g0"), ("r", "t0#w0g1")):  # finish order
        batcher.finish(gid, _finished(eid))
    batch: Batch = batcher.take()
    lock.order(batch)
    assert [(g.task_id, [e.episode_id for e in g.finished]) for g in batch.groups] == [
        ("t0", ["r", "s"]),
        ("t1", ["p", "q"]),
    ]
    assert lock.slots == {} and lock.occurrence == {}


def test_turnstile_lets_claims_through_in_ticket_order() -> None:
    gate = Turnstile()
    tickets = [gate.ticket() for _ in range(8)]
    through: list[int] = []

    def claim(ticket: int) -> None:
        time.sleep(random.random() * 0.02)  # threads reach the turnstile in any order
        with gate.turn(ticket) as mine:
            assert mine
            through.append(ticket)

    threads = [threading.Thread(target=claim, args=(t,)) for t in reversed(tickets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert through == tickets


def test_turnstile_passes_on_after_a_failed_claim_and_lets_go_on_stop() -> None:
    gate, stop = Turnstile(), threading.Event()
    first, second, third = gate.ticket(), gate.ticket(), gate.ticket()
    with pytest.raises(RuntimeError), gate.turn(first):
        raise RuntimeError("claim refused")
    with gate.turn(second) as mine:  # the failure passed the turn on
        assert mine
    stop.set()
    with gate.turn(third + 1, stop) as mine:  # never its turn, but the fleet is stopping
        assert not mine


def test_deterministic_server_is_on_policy_in_lockstep() -> None:
    assert ServerConfig().claims_during_step and not ServerConfig().deterministic  # off: as before
    cfg = ServerConfig(deterministic=True)
    assert cfg.claims_during_step is False and cfg.max_staleness == 0
    with pytest.raises(ValueError, match="max-staleness"):
        ServerConfig(deterministic=True, max_staleness=1)


def test_deterministic_run_takes_one_client_process_per_task() -> None:
    run = RunConfig(server={"deterministic": True})
    assert run.server.deterministic and run.server.claims_during_step is False
    with pytest.raises(ValueError, match="--clients 1"):
        RunConfig(clients=2, server={"deterministic": True})
