"""A clean stop ends the clients promptly, even those that would wait `reconnect_s` for a restart.

The server's 503 `stopping` may reach a fleet only through a model call (the OpenAI
client), never through an SDK request; the SDK must still take it for a stop, not for
a restart: no retries of the model call, no reconnecting abort (issue item 12).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from swarm.client import ServerStopping, SwarmClient, run_fleet

MESSAGES = [{"role": "user", "content": "hi"}]


def test_fleet_with_reconnect_ends_within_seconds_of_an_admin_stop(make_server) -> None:
    srv = make_server(group_size=2, batch_groups=1, stop_grace_s=0.5)
    client = SwarmClient(srv.url, srv.token, max_retries=2, backoff_s=0.05, reconnect_s=120)
    playing = threading.Semaphore(0)
    go = threading.Event()

    def workflow(task: dict, episode) -> float:
        playing.release()
        go.wait(20)  # the stop comes while the episode is open; its next model call meets it
        episode.openai.chat.completions.create(model=episode.model, messages=MESSAGES, max_tokens=4)
        return 1.0

    result: dict = {}
    fleet = threading.Thread(
        target=lambda: result.update(
            stats=run_fleet(client, workflow, [{"task_id": f"t{i}"} for i in range(4)], n=2, concurrency=4)
        ),
        daemon=True,
    )
    fleet.start()
    for _ in range(2):  # the window holds one group of two: both episodes are playing
        assert playing.acquire(timeout=20)
    r = httpx.post(f"{srv.url}/swarm/v1/admin/stop", headers={"Authorization": f"Bearer {srv.admin_token}"})
    assert r.status_code == 200, r.text
    go.set()
    t0 = time.monotonic()
    fleet.join(30)
    waited = time.monotonic() - t0
    assert not fleet.is_alive(), "the fleet kept running after the server stopped"
    assert waited < 5.0 and result["stats"].stopped_by == "server", (waited, result)
    assert client.stopping


def test_requests_after_a_stop_do_not_reconnect(make_server) -> None:
    """Once a 503 `stopping` was seen (here on a model call), a request that finds the server gone
    raises `ServerStopping` at once instead of retrying for `reconnect_s`."""
    # a grace long enough that the call below meets the stopping server (503), not a closed socket, on a
    # loaded machine too
    srv = make_server(group_size=2, batch_groups=1, stop_grace_s=2.0)
    client = SwarmClient(srv.url, srv.token, max_retries=2, backoff_s=0.05, reconnect_s=120)
    ep = client.claim("t0")
    httpx.post(f"{srv.url}/swarm/v1/admin/stop", headers={"Authorization": f"Bearer {srv.admin_token}"})
    with pytest.raises(Exception) as err:
        ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
    assert getattr(err.value, "status_code", None) == 503 and client.stopping
    srv.thread.join(15)
    assert not srv.thread.is_alive()
    t0 = time.monotonic()
    with pytest.raises(ServerStopping):
        ep.abort("after the stop")
    assert time.monotonic() - t0 < 2.0
