"""The asyncio client ends promptly after a clean stop, like the sync one (issue 27, item 12).

`test_clean_stop.py` pins the sync SDK and its fleets. Here `AsyncSwarmClient` with
`reconnect_s=120`: the server's 503 `stopping` reaches it only through an episode's model
call (`ep.async_openai`), and the episode block's abort that follows must take the stop for
a stop, not for a restart to wait out. A real server on loopback, stopped by its admin route.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from swarm.client import AsyncSwarmClient, ServerStopping

MESSAGES = [{"role": "user", "content": "hi"}]


def test_async_episode_block_ends_within_seconds_after_a_stop_met_by_a_model_call(make_server) -> None:
    # a grace long enough that the model call meets the stopping server (503), not a closed socket
    srv = make_server(group_size=2, batch_groups=1, stop_grace_s=2.0)

    async def play() -> tuple[BaseException | None, float, bool]:
        async with AsyncSwarmClient(srv.url, srv.token, max_retries=2, backoff_s=0.05, reconnect_s=120) as client:
            caught: BaseException | None = None
            t0 = time.monotonic()
            try:
                async with client.episode("t0") as ep:
                    r = httpx.post(
                        f"{srv.url}/swarm/v1/admin/stop", headers={"Authorization": f"Bearer {srv.admin_token}"}
                    )
                    assert r.status_code == 200, r.text
                    t0 = time.monotonic()
                    await ep.async_openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
            except Exception as exc:  # the model call's 503, re-raised after the block's abort
                caught = exc
            return caught, time.monotonic() - t0, client.stopping

    caught, waited, stopping = asyncio.run(asyncio.wait_for(play(), timeout=60))
    assert getattr(caught, "status_code", None) == 503, repr(caught)
    assert stopping  # the model call's 503 `stopping` marked the client
    assert waited < 5.0, f"the episode block took {waited:.1f} s to end after the stop"


def test_async_requests_after_a_stop_do_not_reconnect(make_server) -> None:
    """Once a 503 `stopping` was seen, a request that finds the server gone raises `ServerStopping` at once."""
    srv = make_server(group_size=2, batch_groups=1, stop_grace_s=2.0)

    async def play() -> float:
        async with AsyncSwarmClient(srv.url, srv.token, max_retries=2, backoff_s=0.05, reconnect_s=120) as client:
            ep = await client.claim("t0")
            httpx.post(f"{srv.url}/swarm/v1/admin/stop", headers={"Authorization": f"Bearer {srv.admin_token}"})
            with pytest.raises(Exception) as err:
                await ep.async_openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
            assert getattr(err.value, "status_code", None) == 503 and client.stopping
            await asyncio.to_thread(srv.thread.join, 15)
            assert not srv.thread.is_alive()
            t0 = time.monotonic()
            with pytest.raises(ServerStopping):
                await ep.abort("after the stop")
            waited = time.monotonic() - t0
            await ep.aclose()
            return waited

    assert asyncio.run(asyncio.wait_for(play(), timeout=60)) < 2.0
