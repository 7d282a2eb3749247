"""The episode API over HTTP: claim, finish (idempotent), abort, heartbeat, status, auth, admin."""

from __future__ import annotations

import time

import httpx
import pytest

from swarm.testing import RunningServer


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _claim(srv: RunningServer, task_id: str = "t1", **body) -> httpx.Response:
    return httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": task_id, **body}, headers=_h(srv.token))


def _post(
    srv: RunningServer, episode: dict, action: str, body: dict | None = None, key: str | None = None
) -> httpx.Response:
    return httpx.post(
        f"{srv.url}/swarm/v1/episodes/{episode['episode_id']}/{action}",
        json=body,
        headers=_h(key or episode["api_key"]),
    )


def test_claim_shape(server: RunningServer) -> None:
    r = _claim(server, "t1", task_family="arith", metadata={"k": [1, 2]})
    assert r.status_code == 200
    c = r.json()
    assert c["base_url"] == f"{server.url}/v1" and c["api_key"].startswith("rk.")
    assert c["policy_version"] == 0 and c["task_id"] == "t1" and c["lease_expires_at"] > time.time()
    assert server.swarm.registry.get(c["episode_id"]).metadata == {"k": [1, 2]}
    r = _claim(server, "t2", roles=["planner"], metadata={"k": 1})  # a team member's claim keeps its role
    assert server.swarm.registry.get(r.json()["episode_id"]).metadata == {"k": 1, "roles": ["planner"]}


def test_claim_key_makes_a_retried_claim_idempotent(server: RunningServer) -> None:
    a = _claim(server, "t1", claim_key="abc").json()
    b = _claim(server, "t1", claim_key="abc").json()
    assert a["episode_id"] == b["episode_id"]
    assert server.swarm.status().open_episodes == 1


def test_finish_is_idempotent_by_key(server: RunningServer) -> None:
    ep = _claim(server).json()
    first = _post(server, ep, "finish", {"reward": 0.25, "idempotency_key": "k1"})
    again = _post(server, ep, "finish", {"reward": 0.25, "idempotency_key": "k1"})
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    assert server.swarm.counters["finished"] == 1
    other = _post(server, ep, "finish", {"reward": 0.25, "idempotency_key": "k2"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "episode_finished"
    assert _post(server, ep, "abort").status_code == 409
    assert _post(server, ep, "heartbeat").status_code == 409
    # the key with another body: it answered 200 with the first reward, and the caller never knew
    reused = _post(server, ep, "finish", {"reward": 0.0, "idempotency_key": "k1"})
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "idempotency_key_reused"
    assert "finished this episode with another body (reward 0.25)" in reused.json()["error"]["message"]


def test_abort_then_status(server: RunningServer) -> None:
    ep = _claim(server).json()
    assert _post(server, ep, "heartbeat").json()["lease_expires_at"] > time.time()
    assert _post(server, ep, "abort", {"reason": "bored"}).json()["status"] == "aborted"
    assert _post(server, ep, "abort").status_code == 200  # idempotent
    assert _post(server, ep, "finish", {"reward": 1.0}).status_code == 409
    s = httpx.get(f"{server.url}/swarm/v1/status", headers=_h(server.token)).json()
    assert s["counters"]["aborted"] == 1 and s["open_episodes"] == 0 and s["step"] == 0
    assert s["group_size"] == 2 and s["batch_groups"] == 2 and s["policy_version"] == 0


def test_auth_failures(server: RunningServer) -> None:
    ep = _claim(server).json()
    other = _claim(server).json()
    sig = ep["api_key"].rsplit(".", 1)
    forged = f"{sig[0]}.{'0' * len(sig[1])}"
    cases = [
        (httpx.post(f"{server.url}/swarm/v1/episodes", json={"task_id": "x"}), 401),
        (httpx.post(f"{server.url}/swarm/v1/episodes", json={"task_id": "x"}, headers=_h("nope")), 401),
        (httpx.post(f"{server.url}/swarm/v1/episodes", json={"task_id": "x"}, headers=_h(ep["api_key"])), 401),
        (_post(server, ep, "finish", {"reward": 1.0}, key=forged), 401),
        (_post(server, ep, "finish", {"reward": 1.0}, key=other["api_key"]), 403),
        (_post(server, ep, "finish", {"reward": 1.0}, key=server.token), 401),
        (httpx.get(f"{server.url}/swarm/v1/status"), 401),
        (httpx.post(f"{server.url}/swarm/v1/admin/checkpoint", headers=_h(server.token)), 403),
        (httpx.post(f"{server.url}/swarm/v1/admin/stop", headers=_h(ep["api_key"])), 401),
        (
            httpx.post(
                f"{server.url}/swarm/v1/episodes/{'0' * 32}/finish",
                json={"reward": 1},
                headers=_h(server.swarm.registry.signer.sign("0" * 32, 1)),
            ),
            404,
        ),
    ]
    for r, status in cases:
        assert r.status_code == status, (r.request.url, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "code"} and err["message"]
    assert _post(server, ep, "finish", {"reward": 1.0}).status_code == 200  # still fine


def test_admin_checkpoint(server: RunningServer) -> None:
    r = httpx.post(f"{server.url}/swarm/v1/admin/checkpoint", headers=_h(server.admin_token))
    assert r.status_code == 200 and r.json()["path"].endswith("step_000000")


def test_admin_stop_refuses_new_claims_then_exits(make_server) -> None:
    srv = make_server(stop_grace_s=1.0)
    r = httpx.post(f"{srv.url}/swarm/v1/admin/stop", headers=_h(srv.admin_token))
    assert r.status_code == 200
    r = _claim(srv)
    assert r.status_code == 503 and r.json()["error"]["code"] == "stopping"
    srv.thread.join(10)
    assert not srv.thread.is_alive()


def test_openapi_spec_lists_routes(server: RunningServer) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    for path in (
        "/swarm/v1/episodes",
        "/swarm/v1/episodes/{episode_id}/finish",
        "/swarm/v1/status",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
    ):
        assert path in spec["paths"]


@pytest.mark.parametrize("task_id", ["", "x" * 513])
def test_bad_task_ids(server: RunningServer, task_id: str) -> None:
    r = _claim(server, task_id)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
