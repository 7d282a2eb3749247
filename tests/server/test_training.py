"""Episodes become steps: groups, on-policy admission (429), the gate, metrics.jsonl."""

from __future__ import annotations

import json
import threading

import httpx

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer, wait_until

MESSAGES = [{"role": "user", "content": "What is 1+1?"}]


def _play(client: SwarmClient, task_id: str, reward: float) -> None:
    ep = client.claim(task_id, wait=False)
    ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=8)
    ep.finish(reward, metrics={"turns": 1.0 + reward})
    ep.close()


def test_b_groups_of_n_make_one_step(server: RunningServer) -> None:
    client = SwarmClient(server.url, server.token)
    eng: FakeEngine = server.engine
    for task, rewards in (("a", (1.0, 0.0)), ("b", (0.5, 0.5))):
        for r in rewards:
            assert eng.policy_version == 0
            _play(client, task, r)
    wait_until(lambda: server.swarm.trainer.step == 1 and not server.swarm.batcher.training)
    assert eng.policy_version == 1 and len(eng.batches) == 1
    batch = eng.batches[0]
    assert len(batch.samples) == 4 and {s.group_id.split("#")[0] for s in batch.samples} == {"a", "b"}
    assert all(s.policy_version == 0 for s in batch.samples)
    lines = (server.swarm.out_dir / "metrics.jsonl").read_text().splitlines()
    m = json.loads(lines[0])
    assert m["step"] == 1 and m["policy_version"] == 1 and m["episodes"] == 4 and m["samples"] == 4
    assert abs(m["reward_mean"] - 0.5) < 1e-9 and m["reward_std"] > 0 and m["tokens"] > 0
    assert "loss" in m and "wall_train_s" in m and m["episode/turns"] == 1.5
    ep = client.claim("c")
    assert ep.policy_version == 1
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
    assert r.system_fingerprint == "roost-policy-v1"


def test_admission_429_with_retry_after_and_abort_frees_slot(server: RunningServer) -> None:
    h = {"Authorization": f"Bearer {server.token}"}
    claim = lambda t: httpx.post(f"{server.url}/swarm/v1/episodes", json={"task_id": t}, headers=h)  # noqa: E731
    eps = [claim("a").json(), claim("a").json(), claim("b").json(), claim("b").json()]
    r = claim("c")  # B=2 tasks x n=2 taken
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "window_full"
    assert claim("a").json()["error"]["code"] == "window_full"  # "a" is full too
    httpx.post(
        f"{server.url}/swarm/v1/episodes/{eps[0]['episode_id']}/abort",
        headers={"Authorization": f"Bearer {eps[0]['api_key']}"},
    )
    again = claim("a")
    assert again.status_code == 200 and again.json()["group_id"] == eps[0]["group_id"]
    status = httpx.get(f"{server.url}/swarm/v1/status", headers=h).json()
    assert status["counters"]["claims_rejected"] == 2
    assert sorted(g["claimed"] for g in status["groups"]) == [2, 2]


def test_dropped_slot_lets_a_group_complete_smaller(server: RunningServer) -> None:
    client = SwarmClient(server.url, server.token)
    _play(client, "a", 1.0)
    client.claim("a").abort(release=False)
    _play(client, "b", 1.0)
    _play(client, "b", 0.0)
    wait_until(lambda: server.swarm.trainer.step == 1)
    assert len(server.engine.batches[0].samples) == 3


def test_claims_get_429_while_training_and_generation_waits(make_server, model_dir) -> None:
    srv = make_server(
        engine=FakeEngine(model_dir, train_delay_s=1.0), group_size=1, batch_groups=1, claims_during_step=False
    )
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", 1.0)
    wait_until(lambda: srv.swarm.batcher.training)
    r = httpx.post(
        f"{srv.url}/swarm/v1/episodes", json={"task_id": "b"}, headers={"Authorization": f"Bearer {srv.token}"}
    )
    assert r.status_code == 429 and r.json()["error"]["code"] == "training"
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(client.claim("b").policy_version))  # waits out 429s
    t.start()
    t.join(15)
    assert got == [1]


def test_max_steps_stops_the_server(make_server) -> None:
    srv = make_server(group_size=1, batch_groups=1, max_steps=2, checkpoint_every=0)
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", 1.0)
    wait_until(lambda: srv.swarm.trainer.step == 1)
    _play(client, "b", 1.0)
    srv.thread.join(15)
    assert not srv.thread.is_alive() and srv.swarm.trainer.step == 2
    assert (srv.swarm.out_dir / "checkpoints" / "step_000002").is_dir()  # checkpoint on stop


def test_failed_train_step_keeps_serving(make_server, model_dir) -> None:
    eng = FakeEngine(model_dir)

    def boom(batch):
        raise RuntimeError("engine bug")

    eng.train_step = boom  # type: ignore[method-assign]
    srv = make_server(engine=eng, group_size=1, batch_groups=1)
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", 1.0)
    wait_until(lambda: srv.swarm.trainer.errors == 1 and not srv.swarm.batcher.training)
    assert client.status().counters["train_errors"] == 1
    _play(client, "b", 1.0)  # the window reopened


def test_rollout_log_and_knobs(make_server) -> None:
    srv = make_server(group_size=1, batch_groups=1, temperature=0.0, merge=False)
    client = SwarmClient(srv.url, srv.token)
    with client.episode("a") as ep:
        msgs = list(MESSAGES)
        for _ in range(2):
            r = ep.openai.chat.completions.create(model=ep.model, messages=msgs, max_tokens=4, temperature=1.5)
            msgs += [
                {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": "more"},
            ]
        ep.finish(0.75)
    assert all(q.params.temperature == 0.0 for q in srv.engine.requests)  # forced by the server
    wait_until(lambda: srv.swarm.trainer.step == 1)
    assert len(srv.engine.batches[0].samples) == 2  # --no-merge: one sample per call
    rows = [json.loads(x) for x in (srv.swarm.out_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["reward"] == 0.75 and len(rows[0]["calls"]) == 2
    from swarm.inspect import episode_calls, find_episode

    assert len(episode_calls(find_episode(srv.swarm.out_dir, ep.id))) == 2
