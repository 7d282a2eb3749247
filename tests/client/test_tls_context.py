"""The SDK builds one TLS context per process, not one per episode's OpenAI client (swarm/client/_episode.py).

Why it matters: httpx parses the CA bundle again for every client it makes (~20 ms of CPU), more
than a whole episode of a fleet costs, and an async episode used to pay it once per episode."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from swarm import tls
from swarm.client._episode import EpisodeBase
from swarm.protocol import ClaimResponse
from swarm.tls import tls_context


def _episode(n: int) -> EpisodeBase:
    claim = ClaimResponse(
        episode_id=f"e{n}",
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        lease_expires_at=0.0,
        policy_version=0,
        model="m",
        group_id="g",
        task_id="t",
    )
    return EpisodeBase(claim, timeout=5.0)


def test_async_episode_clients_share_the_process_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    real = httpx.create_ssl_context

    def counting(*args: object, **kwargs: object) -> object:
        built.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return built[-1]

    tls_context.cache_clear()
    monkeypatch.setattr(tls.httpx, "create_ssl_context", counting)
    try:
        episodes = [_episode(i) for i in range(3)]
        clients = [ep.async_openai_client() for ep in episodes] + [episodes[0].async_openai_client(agent="critic")]
        assert len(built) == 1  # one context for four clients of three episodes
        assert tls_context() is built[0]
        for c in clients:  # and each client's connections use it (httpx keeps it on the transport's pool)
            assert c._client._transport._pool._ssl_context is built[0]

        async def close() -> None:
            for c in clients:
                await c.close()

        asyncio.run(close())
    finally:
        tls_context.cache_clear()
