"""A frozen client costs one stall period, not two (issue item 15).

The stall bound fences the frozen holder and trains its group without it. When the holder
thaws, its finish gets 409 and its fleet re-plays the job: one more claim of the same task.
That claim used to open a fresh group of n slots, of which it fills one; nobody plays the
others (the task's other copies finished long ago), so the next window waited a second full
`group_stall_s` on it. The fenced holder's slot is owed to its replay instead: the replay's
group has as many slots as replays are owed, and completes when the replay finishes.
"""

from __future__ import annotations

import time

import httpx

from swarm.testing import RunningServer, wait_until

STALL_S = 1.5


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _claim(srv: RunningServer, task: str) -> dict:
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": task, "wait_s": 5}, headers=_h(srv.token))
    assert r.status_code == 200, r.text
    return r.json()


def _call(srv: RunningServer, ep: dict) -> None:
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"model": ep["model"], "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200, r.text


def _finish(srv: RunningServer, ep: dict) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/finish", json={"reward": 1.0}, headers=_h(ep["api_key"])
    )


def _play(srv: RunningServer, task: str) -> dict:
    ep = _claim(srv, task)
    _call(srv, ep)
    assert _finish(srv, ep).status_code == 200
    return ep


def test_a_frozen_client_holds_training_one_stall_period(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=2, lease_seconds=30, group_stall_s=STALL_S)
    frozen = _claim(srv, "f")  # ... makes its call and freezes (its 30 s lease runs on)
    _call(srv, frozen)
    for task in ("f", "g", "g"):
        _play(srv, task)
    t0 = time.monotonic()
    wait_until(lambda: srv.swarm.trainer.step == 1, timeout=STALL_S + 10)
    first = time.monotonic() - t0
    assert STALL_S * 0.8 <= first < STALL_S + 2  # the one stall period the bound allows

    # it thaws: its finish is fenced, and its fleet re-plays the job (one claim of `f`)
    late = _finish(srv, frozen)
    assert late.status_code == 409 and late.json()["error"]["code"] == "stale_epoch"
    replay = _play(srv, "f")
    for task in ("h", "h"):  # the others play on
        _play(srv, task)
    t1 = time.monotonic()
    wait_until(lambda: srv.swarm.trainer.step == 2, timeout=STALL_S + 10)
    second = time.monotonic() - t1
    assert second < STALL_S / 2, f"the replay's group held the next window {second:.2f}s"
    batch = srv.engine.batches[1]
    assert {s.episode_id for s in batch.samples} >= {replay["episode_id"]}
    members: dict[str, set[str]] = {}
    for sample in batch.samples:
        members.setdefault(sample.group_id, set()).add(sample.episode_id)
    assert sorted(map(len, members.values())) == [1, 2]  # the replay's group: its one owed slot
    counters = srv.swarm.status().counters
    assert counters["groups_stalled"] == 1  # only the frozen one's group, once


def test_an_owed_slot_lapses_with_the_lease(make_server) -> None:
    """A fenced holder that never comes back (dead, not frozen) owes nothing after a lease: the
    task's next claims form ordinary groups of n."""
    srv = make_server(group_size=2, batch_groups=1, lease_seconds=1.0, group_stall_s=0.5)
    frozen = _claim(srv, "f")
    _call(srv, frozen)
    _play(srv, "f")
    wait_until(lambda: srv.swarm.trainer.step == 1, timeout=10)  # stalled (0.5 s) before the 1 s lease ran out
    assert srv.swarm.status().counters["groups_stalled"] == 1
    time.sleep(1.2)  # past the fenced holder's lease: it is taken for dead
    a, b = _claim(srv, "f"), _claim(srv, "f")
    assert a["group_id"] == b["group_id"]  # one group of two, as ever


def test_batcher_sizes_a_group_to_its_owed_slots() -> None:
    from swarm.server.batcher import Batcher

    b = Batcher(group_size=4, batch_groups=3)
    now = time.time()
    b.owe("f", now + 30)
    b.owe("f", now + 30)
    b.owe("x", now - 1)  # lapsed already
    g = b.admit("f", "r1", now=now)
    assert g.size == 2 and b.owed("f", now) == 0  # both replays of f share one group of two
    assert b.admit("f", "r2", now=now) is g
    b.release(g.group_id, "r1")
    b.release(g.group_id, "r2")  # both gave their slots back: the group goes, the slots stay owed
    assert g.group_id not in b.groups and b.owed("f", now) == 2
    assert b.admit("x", "e1", now=now).size == 4  # nothing owed (it lapsed): an ordinary group
    assert b.admit("f", "r3", now=now + 31).size == 4  # past the deadline: ordinary again
