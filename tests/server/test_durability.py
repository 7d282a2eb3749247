"""The durable buffer: on disk before the ack, trained once, replayed after a restart; failed
episodes and the failed-group policy; generation timeouts."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx
import openai
import pytest

from swarm.client import SwarmAPIError, SwarmClient
from swarm.engine.fake import FakeEngine
from swarm.testing import wait_until


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _rows(out: Path) -> dict[str, tuple]:
    db = sqlite3.connect(out / "buffer.sqlite")
    try:
        return {r[0]: r[1:] for r in db.execute("SELECT id, state, trained_step, task_id, status FROM episodes")}
    finally:
        db.close()


def _play(client: SwarmClient, task: str, reward: float = 1.0, status: str | None = None):
    ep = client.claim(task)
    ep.openai.chat.completions.create(
        model=ep.model, max_tokens=4, messages=[{"role": "user", "content": f"task {task}"}]
    )
    if status == "failed":
        ep.fail("tool crashed")
    else:
        ep.finish(reward)
    return ep


def test_finish_is_on_disk_before_the_ack_and_trained_once(make_server, tmp_path: Path) -> None:
    srv = make_server(group_size=2, batch_groups=1)
    client = SwarmClient(srv.url, srv.token)
    a = _play(client, "t", 1.0)
    assert _rows(tmp_path / "out")[a.id][:2] == ("buffered", None)  # acknowledged => durable
    b = _play(client, "t", 0.0)
    wait_until(lambda: srv.swarm.status().counters.get("buffer_trained") == 2)  # marked as the step ends
    assert srv.swarm.trainer.step == 1
    rows = _rows(tmp_path / "out")
    assert rows[a.id][:2] == rows[b.id][:2] == ("trained", 1)
    counters = srv.swarm.status().counters
    assert counters["buffer_trained"] == 2 and counters["episodes_trained"] == 2
    assert counters.get("http_5xx", 0) == 0


def test_idempotent_finish_and_open_group_survive_a_restart(make_server, tmp_path: Path) -> None:
    kw = dict(group_size=2, batch_groups=1, secret="fixed-secret", checkpoint_on_stop=False)
    srv = make_server(**kw)
    client = SwarmClient(srv.url, srv.token)
    first = client.claim("t")
    first.openai.chat.completions.create(
        model=first.model, max_tokens=4, messages=[{"role": "user", "content": "first"}]
    )
    body = {"reward": 0.75, "idempotency_key": "finish-1"}
    url = f"{srv.url}/swarm/v1/episodes/{first.id}/finish"
    acked = httpx.post(url, json=body, headers=_h(first.api_key))
    assert acked.status_code == 200
    in_flight = client.claim("t")  # open when the server goes: not acknowledged, not kept
    srv.stop()

    srv2 = make_server(**kw)
    url2 = f"{srv2.url}/swarm/v1/episodes/{first.id}/finish"
    again = httpx.post(url2, json=body, headers=_h(first.api_key))
    assert again.status_code == 200 and again.json() == acked.json()  # same answer, not counted twice
    other = httpx.post(url2, json={**body, "idempotency_key": "finish-2"}, headers=_h(first.api_key))
    assert other.status_code == 409
    client2 = SwarmClient(srv2.url, srv2.token)
    in_flight._client = client2  # the same episode key, against the restarted server
    with pytest.raises(SwarmAPIError) as err:
        in_flight.finish(1.0)
    assert err.value.status_code == 404 and in_flight.lost
    [group] = srv2.swarm.status().groups  # the restored group waits for its second episode
    assert (group.task_id, group.finished, group.claimed) == ("t", 1, 0)
    second = _play(client2, "t", 0.25)
    assert second.group_id == group.group_id
    wait_until(lambda: srv2.swarm.trainer.step == 1)
    assert {s.episode_id for s in srv2.engine.batches[0].samples} == {first.id, second.id}
    assert srv2.swarm.counters["episodes_replayed"] == 1


def test_restart_rolls_back_lost_steps_and_drops_stale_episodes(make_server, tmp_path: Path) -> None:
    kw = dict(
        group_size=1,
        batch_groups=1,
        checkpoint_every=0,
        checkpoint_on_stop=False,
        max_staleness=1,
        replay_staleness=1,
        secret="s",
    )  # a bound on replay (the default replays everything)
    srv = make_server(**kw)
    client = SwarmClient(srv.url, srv.token)
    ids = {}
    for step, task in enumerate("abc", start=1):
        ids[task] = _play(client, task).id
        wait_until(lambda step=step: srv.swarm.trainer.step == step)
    srv.stop()  # no checkpoint was ever written: the restart begins again at version 0
    srv2 = make_server(**kw)
    # a (v0, staleness 0) trains at once; b (v1) waits for room, then trains; c (v2) is too stale
    wait_until(lambda: srv2.swarm.trainer.step == 2)
    assert [[s.episode_id for s in b.samples] for b in srv2.engine.batches] == [[ids["a"]], [ids["b"]]]
    rows = _rows(tmp_path / "out")
    assert rows[ids["a"]][:2] == ("trained", 1) and rows[ids["b"]][:2] == ("trained", 2)
    assert rows[ids["c"]][:2] == ("dropped_stale", None)
    c = srv2.swarm.status().counters
    assert c["dropped_stale"] == 1 and c["episodes_rolled_back"] == 3 and c["buffer_dropped_stale"] == 1


@pytest.mark.parametrize("policy,size,ok,trained", [("drop", 3, 2, 0), ("keep", 3, 2, 2), ("keep", 2, 1, 0)])
def test_failed_episodes_and_group_policy(
    make_server, tmp_path: Path, policy: str, size: int, ok: int, trained: int
) -> None:
    srv = make_server(group_size=size, batch_groups=1, failed_group_policy=policy)
    client = SwarmClient(srv.url, srv.token)
    good = [_play(client, "t", float(i)).id for i in range(ok)]
    bad = _play(client, "t", status="failed")
    assert bad.result is not None and bad.result.samples == 0
    wait_until(lambda: srv.swarm.batcher.window == 1 and not srv.swarm.batcher.stepping)  # taken and resolved
    rows = _rows(tmp_path / "out")
    assert rows[bad.id][0] == "failed" and rows[bad.id][3] == "failed"
    trained_ids = {s.episode_id for b in srv.engine.batches for s in b.samples}
    assert len(trained_ids) == trained and bad.id not in trained_ids
    assert all(rows[i][0] == ("trained" if trained else "dropped_group") for i in good)
    assert srv.swarm.counters["finished_failed"] == 1


def test_generate_timeout_is_a_504_and_the_server_stays_up(make_server, model_dir) -> None:
    eng = FakeEngine(model_dir, token_delay_s=0.2, chunk_tokens=1, stop_probability=0.0)
    srv = make_server(engine=eng, group_size=1, batch_groups=1, generate_timeout_s=0.3)
    client = SwarmClient(srv.url, srv.token)
    ep = client.claim("t")
    t0 = time.monotonic()
    r = httpx.post(
        f"{ep.base_url}/chat/completions",
        headers=_h(ep.api_key),
        timeout=30,
        json={"model": ep.model, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 504 and time.monotonic() - t0 < 5
    assert r.json()["error"]["code"] == "generate_timeout" and r.headers["x-should-retry"] == "false"
    stream = ep.openai_client(max_retries=0).chat.completions.create(
        model=ep.model, max_tokens=100, stream=True, messages=[{"role": "user", "content": "hi"}]
    )
    with pytest.raises(openai.APIError, match="longer than"):
        for _ in stream:
            pass
    status = client.status()  # the loop was never blocked
    assert status.counters["generate_timeouts"] == 2 and status.counters["http_5xx"] == 1
    ep.finish(0.0)
    assert json.loads(ep.result.model_dump_json())["calls"] == 0  # timed-out calls are not recorded


def test_checkpoints_compact_what_no_restart_can_replay(make_server, tmp_path: Path) -> None:
    srv = make_server(group_size=1, batch_groups=1, checkpoint_every=2, secret="s", checkpoint_on_stop=False)
    client = SwarmClient(srv.url, srv.token)
    eps = []
    for step in range(1, 4):
        eps.append(_play(client, f"t{step}"))
        wait_until(lambda step=step: srv.swarm.trainer.step == step)
    wait_until(lambda: srv.swarm.checkpointed_step == 2 and srv.swarm.counters["buffer_compacted"] == 2)
    ids = [e.id for e in eps]
    failed = _play(client, "f", status="failed").id
    db = sqlite3.connect(tmp_path / "out" / "buffer.sqlite")
    payload = dict(db.execute("SELECT id, payload FROM episodes").fetchall())
    db.close()
    assert payload[ids[0]] == payload[ids[1]] == "{}"  # trained into checkpoint 2: never replayed
    assert json.loads(payload[ids[2]])["samples"]  # trained at step 3, after it: a restart replays it
    assert json.loads(payload[failed]) != {}  # compacted at the next checkpoint
    srv.stop()
    srv2 = make_server(group_size=1, batch_groups=1, checkpoint_every=2, secret="s")
    wait_until(lambda: srv2.swarm.trainer.step == 3)  # resumed at 2; step 3 re-trained from the buffer
    assert [s.episode_id for s in srv2.engine.batches[0].samples] == [ids[2]]
    assert srv2.swarm.counters["episodes_rolled_back"] == 1
    r = httpx.post(f"{srv2.url}/swarm/v1/episodes/{ids[0]}/finish", json={"reward": 1.0}, headers=_h(eps[0].api_key))
    assert r.status_code == 409, r.text  # a compacted row still closes its episode


def test_buffer_compact_and_rollback_unit(tmp_path: Path) -> None:
    from swarm.server.buffer import DurableBuffer

    buf = DurableBuffer(tmp_path / "b.sqlite")
    for i, state in enumerate(["buffered", "buffered", "buffered", "failed"]):
        buf.add(
            episode_id=f"e{i}",
            group_id="t#w0g0",
            task_id="t",
            task_family="f",
            epoch=0,
            policy_version=0,
            status="ok" if state == "buffered" else "failed",
            reward=1.0,
            state=state,
            idempotency_key=None,
            response={},
            payload={"samples": [], "pad": "x" * 1000},
        )
    buf.mark(["e0"], "trained", 1)
    buf.mark(["e1"], "trained", 2)
    before = buf.payload_bytes()
    assert buf.compact(1) == 2  # e0 (trained at 1 <= 1) and e3 (failed); e1 after, e2 untrained
    assert buf.payload_bytes() < before and buf.compact(1) == 0
    assert buf.rollback_to(0) == 1  # e1 comes back; e0 was compacted and cannot
    assert sorted(r.id for r in buf.buffered()) == ["e1", "e2"]
    assert buf.get("e0").state == "trained"
    buf.close()
