"""`AsyncSwarmClient`: the asyncio twin of `SwarmClient`, for async agent frameworks.

    async with AsyncSwarmClient(url, token) as client:
        async with client.episode("arith-0-3") as ep:
            reply = await ep.async_openai.chat.completions.create(model=ep.model, messages=[...])
            await ep.finish(1.0)

Same retry rules as the sync client (`_retry.Policy`), the server's stop included
(`stopping`); no torch.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx

from swarm.client._client import _status_path
from swarm.client._episode import EpisodeBase
from swarm.client._heartbeat import AsyncHeartbeats
from swarm.client._retry import TRANSIENT, Attempts, Policy, SwarmAPIError, SwarmError, amark_stopping, worker_token
from swarm.protocol import API_PREFIX, ClaimResponse, FinishResponse, HeartbeatResponse, StatusResponse


class AsyncSwarmClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 6,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        claim_wait_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
        reconnect_s: float | None = None,
        heartbeat_s: float | None = None,
        heartbeats: bool = True,
        model: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = worker_token(token)
        self.timeout = timeout
        self.claim_wait_s = max(0.0, min(claim_wait_s, timeout / 2, 30.0))  # long poll per claim request
        #: the policy episodes are claimed for on a server of several (`--policy`); None: its first
        self.model = model
        self.policy = Policy(max_retries, backoff_s, max_backoff_s, reconnect_s)
        #: Set for good by a 503 "stopping" on any response (SDK requests, heartbeats, model calls).
        self.stopping_event = threading.Event()
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout,
            transport=transport,
            event_hooks={"response": [partial(amark_stopping, stopping=self.stopping_event)]},
        )
        self._connected = False
        self._down_since: float | None = None  # when an outage began (`Attempts` says it once)
        self._heartbeats = AsyncHeartbeats(self._http, heartbeat_s) if heartbeats else None

    async def request(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        json: Any = None,
        wait_429: bool = False,
        wait_timeout: float | None = None,
    ) -> dict:
        headers = {"Authorization": f"Bearer {key or self.token}"}
        tries = Attempts(self, wait_429, wait_timeout)
        while True:
            try:
                r = await self._http.request(method, path, json=json, headers=headers)
                delay = tries.response(r)
                if delay is None:
                    return r.json()
            except TRANSIENT as exc:
                delay = tries.error(exc)
            await asyncio.sleep(delay)

    @property
    def stopping(self) -> bool:
        """The server said it is stopping (a 503 "stopping" on any response)."""
        return self.stopping_event.is_set()

    async def claim(
        self,
        task_id: str,
        task_family: str = "default",
        metadata: dict | None = None,
        *,
        roles: list[str] | None = None,
        wait: bool = True,
        wait_timeout: float | None = None,
        model: str | None = None,
    ) -> AsyncEpisode:
        body = {
            "task_id": task_id,
            "task_family": task_family,
            "metadata": metadata or {},
            "roles": roles,
            "claim_key": uuid.uuid4().hex,
            "wait_s": self.claim_wait_s if wait else 0.0,
            "policy": model or self.model,  # which policy plays it (a server of several); None: the first
        }
        data = await self.request("POST", f"{API_PREFIX}/episodes", json=body, wait_429=wait, wait_timeout=wait_timeout)
        ep = AsyncEpisode(self, ClaimResponse.model_validate(data))
        if self._heartbeats is not None:
            self._heartbeats.add(ep)  # renewed from a background task while open
        return ep

    @asynccontextmanager
    async def episode(
        self, task_id: str, task_family: str = "default", metadata: dict | None = None, **claim_kwargs: Any
    ) -> AsyncIterator[AsyncEpisode]:
        ep = await self.claim(task_id, task_family, metadata, **claim_kwargs)
        try:
            yield ep
        except BaseException as exc:
            await ep._abort_quietly(f"exception in episode block: {type(exc).__name__}: {exc}"[:1000])
            raise
        finally:
            if not ep.done:
                await ep._abort_quietly("left the episode block without finish")
            await ep.aclose()

    async def status(self) -> StatusResponse:
        return StatusResponse.model_validate(await self.request("GET", _status_path(self.model)))

    async def aclose(self) -> None:
        if self._heartbeats is not None:
            await self._heartbeats.stop()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSwarmClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncEpisode(EpisodeBase):
    def __init__(self, client: AsyncSwarmClient, claim: ClaimResponse) -> None:
        super().__init__(claim, client.timeout * 10)
        self._stopping = client.stopping_event
        self._client = client

    async def finish(
        self, reward: float, metrics: dict[str, float] | None = None, agent_rewards: dict[str, float] | None = None
    ) -> FinishResponse:
        return await self._finish(self._finish_body(reward, metrics, agent_rewards))

    async def finish_choices(self, rewards: Sequence[float], metrics: dict[str, float] | None = None) -> FinishResponse:
        """`Episode.finish_choices`: a reward per choice of the episode's one call."""
        return await self._finish(self._choices_body(rewards, metrics))

    async def fail(self, reason: str | None = None, metrics: dict[str, float] | None = None) -> FinishResponse:
        """Finish as failed (environment crash, tool error): recorded, never trained."""
        return await self._finish({**self._finish_body(0.0, metrics, None), "status": "failed"})

    async def _finish(self, body: dict) -> FinishResponse:
        try:
            data = await self._client.request("POST", self._path("finish"), key=self.api_key, json=body)
        except SwarmAPIError as exc:
            self._gone(exc)
            raise
        return self._finished(data)

    async def abort(self, reason: str | None = None, release: bool = True) -> None:
        try:
            await self._client.request(
                "POST", self._path("abort"), key=self.api_key, json={"reason": reason, "release": release}
            )
        except SwarmAPIError as exc:
            self._gone(exc)
            raise
        self.done = True
        self._untrack()

    async def heartbeat(self) -> float:
        data = await self._client.request("POST", self._path("heartbeat"), key=self.api_key)
        return HeartbeatResponse.model_validate(data).lease_expires_at

    async def _abort_quietly(self, reason: str) -> None:
        if self.done or self.lost:
            self.done = True
            self._untrack()
            return
        try:
            await self.abort(reason)
        except SwarmError:
            self.done = True
            self._untrack()
