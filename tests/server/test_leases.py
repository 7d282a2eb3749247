"""Leases and fencing: expiry, hand-over with a new epoch (409 for the zombie), heartbeats, stalls."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer, wait_until


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _say(ep, text: str, max_tokens: int = 4):
    return ep.openai.chat.completions.create(
        model=ep.model, max_tokens=max_tokens, messages=[{"role": "user", "content": text}]
    )


def _epoch(api_key: str) -> int:
    return int(api_key.split(".")[2])


def test_zombie_is_fenced_after_hand_over(make_server) -> None:
    # 2 s: long enough for A's first call under load (0.4 s lapsed before it once, CI 2026-12-07: a 409)
    srv: RunningServer = make_server(group_size=2, batch_groups=1, lease_seconds=2.0)
    client = SwarmClient(srv.url, srv.token, heartbeats=False)  # A stops beating: a stalled client
    zombie = client.claim("t")
    _say(zombie, "holder A was here")
    wait_until(lambda: srv.swarm.counters["expired"] == 1)
    assert srv.swarm.status().open_episodes == 0
    # the slot reopened: B gets the same episode under the next epoch
    fresh = SwarmClient(srv.url, srv.token)
    b = fresh.claim("t")
    assert b.id == zombie.id and _epoch(b.api_key) == _epoch(zombie.api_key) + 1
    _say(b, "holder B speaking")
    # everything the zombie sends now is refused with 409 and lands nowhere
    for action in ("heartbeat", "finish", "abort"):
        r = httpx.post(
            f"{srv.url}/swarm/v1/episodes/{zombie.id}/{action}", json={"reward": 1.0}, headers=_h(zombie.api_key)
        )
        assert r.status_code == 409 and r.json()["error"]["code"] == "stale_epoch", (action, r.text)
    with pytest.raises(openai.ConflictError):
        zombie.openai_client(max_retries=0).chat.completions.create(
            model=zombie.model, max_tokens=4, messages=[{"role": "user", "content": "holder A again"}]
        )
    b.finish(1.0)
    c = fresh.claim("t")
    _say(c, "holder C speaking")
    c.finish(0.0)
    wait_until(lambda: srv.swarm.trainer.step == 1)
    texts = [srv.engine.tokenizer.decode(s.input_ids) for s in srv.engine.batches[0].samples]
    assert any("holder B" in t for t in texts) and any("holder C" in t for t in texts)
    assert not any("holder A" in t for t in texts)  # the zombie's data never trains


def test_in_flight_call_of_an_expired_episode_is_dropped(make_server, model_dir) -> None:
    srv = make_server(engine=FakeEngine(model_dir, token_delay_s=0.05), group_size=1, batch_groups=1, lease_seconds=0.3)
    ep = SwarmClient(srv.url, srv.token, heartbeats=False).claim("t")
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _say(ep, "slow", max_tokens=40)))
    t.start()
    t.join(15)  # 40 tokens x 0.05 s: the lease lapses mid-call (no heartbeats)
    assert srv.swarm.counters["expired"] == 1 and srv.swarm.counters["calls_dropped"] == 1
    new = SwarmClient(srv.url, srv.token).claim("t")
    assert new.id == ep.id and srv.swarm.registry.get(ep.id).calls == []  # nothing of the zombie's call


def test_heartbeats_and_calls_keep_a_lease(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=1, lease_seconds=0.5)
    beating = SwarmClient(srv.url, srv.token).claim("a")  # background heartbeats
    talking = SwarmClient(srv.url, srv.token, heartbeats=False).claim("a")  # only its own calls
    for _ in range(8):
        time.sleep(0.2)
        _say(talking, "still here", max_tokens=2)
    assert srv.swarm.counters["expired"] == 0
    beating.finish(1.0)
    talking.finish(0.0)
    assert beating.result is not None and talking.result is not None


def test_expired_slot_lets_another_task_in(make_server) -> None:
    srv = make_server(group_size=1, batch_groups=1, lease_seconds=0.3)
    client = SwarmClient(srv.url, srv.token, heartbeats=False)
    client.claim("t1")
    r = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": "t2"}, headers=_h(srv.token))
    assert r.status_code == 429  # the window's only group is t1's
    wait_until(lambda: srv.swarm.counters["expired"] == 1)
    other = client.claim("t2", wait=False)
    _say(other, "my turn")
    other.finish(0.5)
    wait_until(lambda: srv.swarm.trainer.step == 1)


def test_stalled_group_completes_smaller(make_server) -> None:
    srv = make_server(group_size=3, batch_groups=1, lease_seconds=5, group_stall_s=0.3)
    client = SwarmClient(srv.url, srv.token)
    for reward in (1.0, 0.0):
        ep = client.claim("t")
        _say(ep, "hi")
        ep.finish(reward)
    # nobody claims the third copy: after group_stall_s the group trains with two
    wait_until(lambda: srv.swarm.trainer.step == 1)
    assert srv.swarm.counters["slots_abandoned"] == 1
    assert len({s.episode_id for s in srv.engine.batches[0].samples}) == 2


def test_abort_open_gives_episodes_back(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=1)
    client = SwarmClient(srv.url, srv.token)
    eps = [client.claim("t"), client.claim("t")]
    assert srv.swarm.status().open_episodes == 2 and len(client.open_episodes()) == 2
    assert client.abort_open("shutting down") == 2
    assert srv.swarm.status().open_episodes == 0 and srv.swarm.counters["aborted"] == 2
    assert all(e.done and e.lost for e in eps) and client.open_episodes() == []
    assert not srv.swarm.batcher.groups  # released slots: the group is gone, the window is free
