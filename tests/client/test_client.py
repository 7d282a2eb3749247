"""SwarmClient: retries and backoff (mock transport), and the episode context manager (real server)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from swarm.client import (
    AsyncSwarmClient,
    ServerStopping,
    SwarmAPIError,
    SwarmClient,
    SwarmUnavailable,
)
from swarm.testing import RunningServer

CLAIM = {
    "episode_id": "e1",
    "base_url": "http://x/v1",
    "api_key": "rk.e1.1.s",
    "lease_expires_at": 0.0,
    "policy_version": 3,
    "model": "m",
    "group_id": "g",
    "task_id": "t",
}
MESSAGES = [{"role": "user", "content": "hi"}]


def _mock(responses: list) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = responses.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return httpx.MockTransport(handler), seen


def _err(status: int, code: str, headers: dict | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": code, "type": "x", "code": code}}, headers=headers)


def test_retries_connection_errors_and_429_with_retry_after() -> None:
    transport, seen = _mock(
        [
            httpx.ConnectError("refused"),
            _err(429, "window_full", {"Retry-After": "0.2"}),
            _err(502, "bad_gateway"),
            httpx.Response(200, json=CLAIM),
        ]
    )
    client = SwarmClient("http://srv", "tok", transport=transport, backoff_s=0.01)
    t0 = time.monotonic()
    ep = client.claim("t")
    assert time.monotonic() - t0 >= 0.2  # honoured Retry-After
    assert ep.id == "e1" and ep.policy_version == 3 and len(seen) == 4
    keys = {json.loads(r.content)["claim_key"] for r in seen}
    assert len(keys) == 1  # every retry carries the same idempotency key
    assert seen[0].headers["authorization"] == "Bearer tok"


def test_429_without_wait_and_client_errors_raise() -> None:
    transport, _ = _mock([_err(429, "window_full"), _err(400, "invalid_request")])
    client = SwarmClient("http://srv", "tok", transport=transport)
    with pytest.raises(SwarmAPIError) as e:
        client.claim("t", wait=False)
    assert e.value.status_code == 429 and e.value.code == "window_full"
    with pytest.raises(SwarmAPIError) as e:
        client.claim("t")
    assert e.value.status_code == 400


def test_stopping_and_unreachable() -> None:
    transport, _ = _mock([_err(503, "stopping")])
    with pytest.raises(ServerStopping):
        SwarmClient("http://srv", "tok", transport=transport).claim("t")
    transport, seen = _mock([httpx.ConnectError("refused")] * 3)
    with pytest.raises(SwarmUnavailable):
        SwarmClient("http://srv", "tok", transport=transport, max_retries=2, backoff_s=0.01).status()
    assert len(seen) == 3


def test_finish_retries_with_one_idempotency_key() -> None:
    finish = {
        "episode_id": "e1",
        "reward": 1.0,
        "samples": 1,
        "calls": 1,
        "group_id": "g",
        "policy_version": 3,
        "step": 0,
    }
    transport, seen = _mock(
        [httpx.Response(200, json=CLAIM), httpx.ReadTimeout("slow"), httpx.Response(200, json=finish)]
    )
    client = SwarmClient("http://srv", "tok", transport=transport, backoff_s=0.01)
    with client.episode("t") as ep:
        assert ep.finish(1.0).reward == 1.0
    bodies = [json.loads(r.content) for r in seen[1:]]
    assert bodies[0]["idempotency_key"] == bodies[1]["idempotency_key"]
    assert seen[1].headers["authorization"] == "Bearer rk.e1.1.s"


def test_episode_block_finish_exception_and_no_finish(server: RunningServer) -> None:
    client = SwarmClient(server.url, server.token)
    with client.episode("a", task_family="fam", metadata={"i": 1}) as ep:
        r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
        assert r.choices[0].message.content is not None
        ep.finish(1.0, metrics={"turns": 1.0})
    assert ep.done and ep.result is not None and ep.result.calls == 1
    with pytest.raises(ValueError):
        with client.episode("a") as ep2:
            raise ValueError("agent crashed")
    assert server.swarm.registry.get(ep2.id).state == "aborted"
    with client.episode("b") as ep3:
        pass
    assert server.swarm.registry.get(ep3.id).state == "aborted"
    status = client.status()
    assert status.counters["finished"] == 1 and status.counters["aborted"] == 2


def test_async_client(server: RunningServer) -> None:
    async def go() -> tuple[int, str]:
        async with AsyncSwarmClient(server.url, server.token) as client:
            async with client.episode("a") as ep:
                await ep.heartbeat()
                r = await ep.async_openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
                assert r.choices[0].message.content is not None
                await ep.finish(0.5)
            async with client.episode("a") as ep2:
                pass
            status = await client.status()
            return status.counters["finished"], server.swarm.registry.get(ep2.id).state

    assert asyncio.run(go()) == (1, "aborted")


def test_a_client_without_a_token_says_so_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request failed deep in httpx before: `Illegal header value b'Bearer '`."""
    from swarm.client import AsyncSwarmClient, SwarmError

    monkeypatch.delenv("ROOST_TOKEN", raising=False)
    for cls in (SwarmClient, AsyncSwarmClient):
        with pytest.raises(SwarmError, match=r"no token: pass token=\.\.\. or set ROOST_TOKEN"):
            cls("http://127.0.0.1:9")
    monkeypatch.setenv("ROOST_TOKEN", "from-env")
    assert SwarmClient("http://127.0.0.1:9").token == "from-env"


def test_a_reward_that_is_no_finite_number_is_said_before_anything_is_sent() -> None:
    """NaN failed inside httpx's JSON encoder ("Out of range float values are not JSON compliant")."""
    from swarm.client import InvalidReward
    from swarm.client._episode import EpisodeBase

    for body, message in (
        (lambda: EpisodeBase._finish_body(float("nan"), None, None), "reward must be a finite number, got nan"),
        (lambda: EpisodeBase._finish_body("0.5", None, None), "reward must be a finite number, got '0.5'"),
        (lambda: EpisodeBase._finish_body(True, None, None), "reward must be a finite number, got True"),
        (lambda: EpisodeBase._finish_body(1.0, {"len": float("inf")}, None), r"metrics\['len'\] must be a finite"),
        (lambda: EpisodeBase._finish_body(1.0, None, {"a": None}), r"agent_rewards\['a'\] must be a finite"),
        (lambda: EpisodeBase._choices_body([1.0, "a"], None), r"choice reward \[1\] must be a finite number"),
        (lambda: EpisodeBase._choices_body("ab", None), "choice rewards must be a list of numbers"),
    ):
        with pytest.raises(InvalidReward, match=message):
            body()
    import numpy as np

    sent = EpisodeBase._finish_body(np.float32(0.5), {"n": np.int64(3)}, None)  # numpy's scalars are numbers
    assert sent["reward"] == 0.5 and sent["metrics"] == {"n": 3.0} and json.dumps(sent)


def test_agent_rewards_for_a_tag_no_call_carried_are_said(server: RunningServer, caplog) -> None:
    """A typo in a tag trained every agent on the episode's reward, without a word. Not an error (an
    agent that did not act this time would lose the episode): the answer names them, the SDK warns once."""
    client = SwarmClient(server.url, server.token)
    for _ in range(2):
        ep = client.claim("t-agents")
        ep.openai_client(agent="alice").chat.completions.create(
            model=ep.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        with caplog.at_level("WARNING", logger="swarm.client._episode"):
            result = ep.finish(0.0, agent_rewards={"alice": 1.0, "carol": 1.0})
        assert result.unmatched_agents == ["carol"] and result.samples == 1
    said = [r.getMessage() for r in caplog.records if "applied to nothing" in r.getMessage()]
    assert len(said) == 1 and "agent_rewards for 'carol' applied to nothing" in said[0], said
    client.close()
