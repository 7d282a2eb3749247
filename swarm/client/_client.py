"""`SwarmClient` and `Episode`: claim an episode, hand its OpenAI endpoint to agent code, finish.

    client = SwarmClient("http://127.0.0.1:8000", token)
    with client.episode(task_id="arith-0-3") as ep:
        reply = ep.openai.chat.completions.create(model=ep.model, messages=[...])
        ep.finish(reward=1.0)          # leaving without finish (or by an exception) aborts

Every call is retry-safe: claims and finishes carry idempotency keys, so the
client retries connection errors and 5xx with backoff; 429 (the server's
on-policy window is full, or it is training) is waited out honouring
`Retry-After`. A server that is stopping raises `ServerStopping`. With
`reconnect_s`, a server reached once is waited for that long (a restart), unless
it said it is stopping: a 503 "stopping" on any response, the episodes' model
calls included, marks the client `stopping`, and an unreachable server is then a
finished stop (`ServerStopping` at once), not a restart to wait out. Those
rules are in `_retry.py`. While an episode is open a background thread renews
its lease (`_heartbeat.py`); an episode the server no longer knows (404/409) is
marked `lost`. No torch here.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any
from urllib.parse import quote

import httpx

from swarm.client._coalesce import Coalescer, Item
from swarm.client._episode import EpisodeBase
from swarm.client._heartbeat import Heartbeats
from swarm.client._retry import (
    STOPPED_MESSAGE,
    TRANSIENT,
    Attempts,
    Policy,
    ServerStopping,
    SwarmAPIError,
    SwarmError,
    mark_stopping,
    worker_token,
)
from swarm.protocol import API_PREFIX, ClaimResponse, FinishResponse, HeartbeatResponse, StatusResponse
from swarm.tls import tls_context

log = logging.getLogger(__name__)

#: Connection pools shared by a client's episodes' OpenAI calls (see `SwarmClient.openai_http`).
OPENAI_POOLS = 16


class SwarmClient:
    """Synchronous client of one swarm server (thread-safe: share it across a fleet)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 6,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        claim_wait_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
        reconnect_s: float | None = None,
        heartbeat_s: float | None = None,
        heartbeats: bool = True,
        model: str | None = None,
    ) -> None:
        """`reconnect_s`: once the server was reached, keep retrying connection errors and
        502/503/504 this long (a restart) beyond `max_retries`. `heartbeats`: renew the lease of
        every open episode from a background thread (every third of the lease, or `heartbeat_s`)."""
        self.url = url.rstrip("/")
        self.token = worker_token(token)
        self.timeout = timeout
        self.claim_wait_s = max(0.0, min(claim_wait_s, timeout / 2, 30.0))  # long poll per claim request
        #: the policy episodes are claimed for on a server of several (`--policy`); None: its first
        self.model = model
        self.policy = Policy(max_retries, backoff_s, max_backoff_s, reconnect_s)
        #: Set for good by a 503 "stopping" on any response (SDK requests, heartbeats, model calls).
        self.stopping_event = threading.Event()
        self._hooks = {"response": [partial(mark_stopping, stopping=self.stopping_event)]}
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport, event_hooks=self._hooks)
        self._closed = threading.Event()
        self._connected = False  # reached the server once: connection errors now mean "reconnect"
        self._down_since: float | None = None  # when an outage began (`Attempts` says it once)
        self._heartbeats = Heartbeats(self._http, self._closed, heartbeat_s) if heartbeats else None
        self._pools: list[httpx.Client] = []  # for the episodes' OpenAI calls (`openai_http`)
        self._pools_lock = threading.Lock()
        self._turn = 0
        # concurrent claims and finishes of this client's threads share requests (`_coalesce.py`)
        self._claims = Coalescer(self._http, self.token, f"{API_PREFIX}/claims", "claims")
        self._finishes = Coalescer(self._http, self.token, f"{API_PREFIX}/finishes", "finishes")

    # -- plumbing -------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        json: Any = None,
        wait_429: bool = False,
        wait_timeout: float | None = None,
        stop: threading.Event | None = None,
        via: tuple[Coalescer, dict] | None = None,
    ) -> dict:
        """One API call with retries; returns the JSON body of the successful answer.

        `via`: (coalescer, batch entry): sent together with what other threads send at
        the same moment (`_coalesce.py`); alone, it goes as this very request.
        """
        headers = {"Authorization": f"Bearer {key or self.token}"}
        tries = Attempts(self, wait_429, wait_timeout)
        item = Item(path, key or self.token, json, via[1]) if via is not None else None
        while True:
            try:
                if via is not None and item is not None:
                    r = via[0].call(item)
                else:
                    r = self._http.request(method, path, json=json, headers=headers)
                delay = tries.response(r)
                if delay is None:
                    return r.json()
            except TRANSIENT as exc:
                delay = tries.error(exc)
            if self._sleep(delay, stop):
                if self.stopping_event.is_set():
                    raise ServerStopping(STOPPED_MESSAGE)
                raise SwarmError("cancelled while waiting to retry")

    @property
    def stopping(self) -> bool:
        """The server said it is stopping (a 503 "stopping" on any response): a fleet ends."""
        return self.stopping_event.is_set()

    def _sleep(self, delay: float, stop: threading.Event | None) -> bool:
        """Sleep `delay`; True when `stop`, `close()` or the server's stop interrupted it."""
        end = time.monotonic() + delay
        while True:
            if self._closed.is_set() or self.stopping_event.is_set() or (stop is not None and stop.is_set()):
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            (stop or self._closed).wait(min(left, 0.1))

    # -- API ------------------------------------------------------------------
    def claim(
        self,
        task_id: str,
        task_family: str = "default",
        metadata: dict | None = None,
        *,
        roles: list[str] | None = None,
        wait: bool = True,
        wait_timeout: float | None = None,
        stop: threading.Event | None = None,
        model: str | None = None,
    ) -> Episode:
        """Claim an episode; with `wait`, 429s are waited out (until `wait_timeout` or `stop`)."""
        body = {
            "task_id": task_id,
            "task_family": task_family,
            "metadata": metadata or {},
            "roles": roles,
            "claim_key": uuid.uuid4().hex,
            "wait_s": self.claim_wait_s if wait else 0.0,
            "policy": model or self.model,  # which policy plays it (a server of several); None: the first
        }
        data = self.request(
            "POST",
            f"{API_PREFIX}/episodes",
            json=body,
            wait_429=wait,
            wait_timeout=wait_timeout,
            stop=stop,
            via=(self._claims, body),
        )
        ep = Episode(self, ClaimResponse.model_validate(data))
        if self._heartbeats is not None:
            self._heartbeats.add(ep)
        return ep

    @contextmanager
    def episode(
        self, task_id: str, task_family: str = "default", metadata: dict | None = None, **claim_kwargs: Any
    ) -> Iterator[Episode]:
        """Claim, yield the `Episode`, and abort it unless it was finished inside the block."""
        ep = self.claim(task_id, task_family, metadata, **claim_kwargs)
        try:
            yield ep
        except BaseException as exc:
            ep._abort_quietly(f"exception in episode block: {type(exc).__name__}: {exc}"[:1000])
            raise
        finally:
            if not ep.done:
                ep._abort_quietly("left the episode block without finish")
            ep.close()

    def status(self) -> StatusResponse:
        """The server's status; on a server of several policies, that of this client's (`model`)."""
        return StatusResponse.model_validate(self.request("GET", _status_path(self.model)))

    def open_episodes(self) -> list[Episode]:
        """Episodes claimed through this client and not yet finished, aborted or closed."""
        return self._heartbeats.open_episodes() if self._heartbeats is not None else []

    def abort_open(self, reason: str = "client shutting down", timeout: float = 5.0) -> int:
        """Give every open episode back (one quick try each, no retries): for a clean shutdown,
        so their slots reopen now instead of when their leases lapse. Returns how many were aborted."""
        n = 0
        for ep in self.open_episodes():
            with ep.guard:  # a team's members are sealed or given back together (`_team.py`)
                if ep.done or ep.sealing:
                    continue
                ep.done = ep.lost = True  # the workflow's next call gets 409 and ends; nothing to finish
                # a teammate finished by hand, or with its finish in flight (`sealing`): the team is not
                # played again (`TeamEpisode.replayable`), so nobody would take a released slot and its
                # group would wait out the stall; give it up
                release = not any(s.result is not None or s.sealing for s in ep.siblings)
            try:
                r = self._http.post(
                    ep._path("abort"),
                    json={"reason": reason, "release": release},
                    headers={"Authorization": f"Bearer {ep.api_key}"},
                    timeout=timeout,
                )
                n += int(r.status_code == 200)
            except (httpx.HTTPError, RuntimeError):
                pass
            ep._untrack()
        return n

    def openai_http(self) -> httpx.Client:
        """A connection pool for a new episode's `openai.OpenAI` (closed with the client).

        Building an `openai.OpenAI` with its own pool costs ~30 ms of CPU, so episodes
        share pools (their keys differ per request header, not per connection). Several
        pools, handed out in turn, not one: httpx scans every connection of a pool, under
        one lock, for each request, so a fleet's 64 threads on one 64-connection pool
        spent a quarter of the client's CPU there. Bounded, so fleets that come and go
        reuse them; one TLS context for all (building one costs ~2 ms).
        """
        with self._pools_lock:
            self._turn += 1
            if len(self._pools) < OPENAI_POOLS:
                self._pools.append(
                    httpx.Client(
                        timeout=self.timeout * 10,
                        verify=tls_context(),
                        event_hooks=self._hooks,
                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
                    )
                )
                return self._pools[-1]
            return self._pools[self._turn % OPENAI_POOLS]

    def close(self) -> None:
        self._closed.set()
        self._http.close()
        with self._pools_lock:
            pools, self._pools = self._pools, []
        for pool in pools:
            pool.close()

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Episode(EpisodeBase):
    """One claimed episode: `.openai`, `.model`, `.finish(reward)`, `.abort()`."""

    def __init__(self, client: SwarmClient, claim: ClaimResponse) -> None:
        super().__init__(claim, client.timeout * 10)
        self._shared_http = client.openai_http()
        self._stopping = client.stopping_event
        self._client = client

    def finish(
        self, reward: float, metrics: dict[str, float] | None = None, agent_rewards: dict[str, float] | None = None
    ) -> FinishResponse:
        """Report the reward; retried safely (one idempotency key for all attempts)."""
        return self._finish(self._finish_body(reward, metrics, agent_rewards))

    def finish_choices(self, rewards: Sequence[float], metrics: dict[str, float] | None = None) -> FinishResponse:
        """Score each choice of the episode's one call (`n=len(rewards)`, in choice order): each
        trains as its own sample, and the choices form the group (see `FinishRequest`)."""
        return self._finish(self._choices_body(rewards, metrics))

    def fail(self, reason: str | None = None, metrics: dict[str, float] | None = None) -> FinishResponse:
        """Finish as failed (environment crash, tool error): recorded, never trained; the
        server's `failed_group_policy` decides whether the rest of its group trains."""
        body = {**self._finish_body(0.0, metrics, None), "status": "failed"}
        return self._finish(body)

    def _finish(self, body: dict) -> FinishResponse:
        # sealed while the finish is in flight: a Ctrl-C's `abort_open` leaves it to land (aborting it
        # then would throw away a reward already sent), and a teammate it gives back keeps no slot
        with self.guard:
            sealed = self.sealing  # a team's finish seals its members itself
            self.sealing = True
        try:
            entry = {**body, "episode_id": self.id, "api_key": self.api_key}
            data = self._client.request(
                "POST", self._path("finish"), key=self.api_key, json=body, via=(self._client._finishes, entry)
            )
        except BaseException as exc:
            self.sealing = sealed  # not finished: `abort_open` gives it back as any open episode
            if isinstance(exc, SwarmAPIError):
                self._gone(exc)
            raise
        return self._finished(data)

    def abort(self, reason: str | None = None, release: bool = True) -> None:
        """Give the episode up; nothing of it is trained. `release=False`: do not retry its slot."""
        try:
            self._client.request(
                "POST", self._path("abort"), key=self.api_key, json={"reason": reason, "release": release}
            )
        except SwarmAPIError as exc:
            self._gone(exc)
            raise
        self.done = True
        self._untrack()

    def heartbeat(self) -> float:
        data = self._client.request("POST", self._path("heartbeat"), key=self.api_key)
        return HeartbeatResponse.model_validate(data).lease_expires_at

    def _abort_quietly(self, reason: str, release: bool = True) -> None:
        if self.done or self.lost:  # a lost episode is closed on the server already
            self.done = True
            self._untrack()
            return
        try:
            self.abort(reason, release=release)
        except SwarmError:
            self.done = True  # the server is gone or the episode already closed: nothing to undo
            self._untrack()


def _status_path(model: str | None) -> str:
    return f"{API_PREFIX}/status" + (f"?policy={quote(model, safe='')}" if model else "")
