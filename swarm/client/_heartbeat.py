"""Background heartbeats: while an episode is open, its lease is renewed without the agent's help.

One daemon thread per `SwarmClient` (one asyncio task per `AsyncSwarmClient`)
beats for every open episode of that client: a fleet of 64 episodes costs one
thread, not 64. Each episode beats every third of its lease (two beats may be
lost before the lease lapses), or every `heartbeat_s` when that is shorter.

A beat answered 401/404/409 means the episode is gone: its lease expired and
moved on, or the server restarted without it. The episode is marked `lost` (the
fleet then re-plays the job instead of counting a failure) and no longer beats.
Transport errors are ignored until the next beat: the lease has slack for that.

Episodes are seen through the `Beating` protocol (what a beat reads and sets),
so this module needs nothing from `_client.py`, which imports it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Protocol

import httpx

from swarm.protocol import ClaimResponse

log = logging.getLogger("swarm.client")
GONE = (401, 404, 409, 410)


class Beating(Protocol):
    """What a heartbeat needs of an episode (`EpisodeBase` is one)."""

    id: str
    claim: ClaimResponse
    api_key: str
    done: bool
    lost: bool

    def _path(self, action: str) -> str: ...


def beat_period(ep: Beating, heartbeat_s: float | None) -> float:
    lease = (
        ep.claim.lease_seconds if getattr(ep.claim, "lease_seconds", None) else ep.claim.lease_expires_at - time.time()
    )  # older servers: infer it (clock skew permitting)
    period = max(0.05, float(lease) / 3)
    return min(period, heartbeat_s) if heartbeat_s else period


def _judge(ep: Beating, status: int) -> bool:
    """True when the episode should keep beating."""
    if status in GONE:
        ep.lost = True
        log.info("episode %s is gone on the server (%d); it will not be finished", ep.id, status)
        return False
    return True


class Heartbeats:
    """The sync client's heartbeat thread (started on the first claim)."""

    def __init__(self, http: httpx.Client, closed: threading.Event, heartbeat_s: float | None) -> None:
        self._http = http
        self._closed = closed
        self.heartbeat_s = heartbeat_s
        self._due: dict[str, tuple[Any, float]] = {}  # episode id -> (episode, next beat, monotonic)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._sleeping_until = 0.0  # when the thread wakes next on its own (monotonic)

    def add(self, ep: Beating) -> None:
        due = time.monotonic() + beat_period(ep, self.heartbeat_s)
        with self._lock:
            self._due[ep.id] = (ep, due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="swarm-heartbeats", daemon=True)
                self._thread.start()
            wake = not self._sleeping_until or due < self._sleeping_until  # else it wakes in time anyway
        if wake:  # a fleet claims hundreds of episodes a second: not one wake-up (and scan) each
            self._wake.set()

    def remove(self, ep: Beating) -> None:
        with self._lock:
            self._due.pop(ep.id, None)

    def open_episodes(self) -> list[Any]:
        with self._lock:
            return [ep for ep, _ in self._due.values()]

    def _run(self) -> None:
        while not self._closed.is_set():
            now = time.monotonic()
            with self._lock:  # what is due, and (atomically with it) until when the thread sleeps
                due = [ep for ep, t in self._due.values() if t <= now]
                nxt = min((t for _, t in self._due.values()), default=now + 1.0)
                pause = max(0.01, min(1.0, nxt - now))
                self._sleeping_until = 0.0 if due else now + pause
            for ep in due:
                self._beat(ep)
            if not due:
                self._wake.wait(pause)
                self._wake.clear()

    def _beat(self, ep: Beating) -> None:
        period = beat_period(ep, self.heartbeat_s)
        keep = True
        try:
            r = self._http.post(
                ep._path("heartbeat"), headers={"Authorization": f"Bearer {ep.api_key}"}, timeout=max(1.0, period)
            )
            keep = _judge(ep, r.status_code)
        except (httpx.HTTPError, RuntimeError):  # unreachable, or the client was closed meanwhile
            period = max(0.05, period / 2)
        with self._lock:
            if not keep or ep.done:
                self._due.pop(ep.id, None)
            elif ep.id in self._due:
                self._due[ep.id] = (ep, time.monotonic() + period)


class AsyncHeartbeats:
    """The async client's heartbeat task (started on the first claim, inside the running loop)."""

    def __init__(self, http: httpx.AsyncClient, heartbeat_s: float | None) -> None:
        self._http = http
        self.heartbeat_s = heartbeat_s
        self._due: dict[str, tuple[Any, float]] = {}
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None

    def add(self, ep: Beating) -> None:
        self._due[ep.id] = (ep, time.monotonic() + beat_period(ep, self.heartbeat_s))
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="swarm-heartbeats")
        elif self._wake is not None:
            self._wake.set()

    def remove(self, ep: Beating) -> None:
        self._due.pop(ep.id, None)

    def open_episodes(self) -> list[Any]:
        return [ep for ep, _ in self._due.values()]

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            due = [ep for ep, t in self._due.values() if t <= now]
            for ep in due:
                await self._beat(ep)
            if not due:
                nxt = min((t for _, t in self._due.values()), default=now + 1.0)
                assert self._wake is not None
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.01, min(1.0, nxt - time.monotonic())))
                except TimeoutError:
                    pass
                self._wake.clear()

    async def _beat(self, ep: Beating) -> None:
        period = beat_period(ep, self.heartbeat_s)
        keep = True
        try:
            r = await self._http.post(
                ep._path("heartbeat"), headers={"Authorization": f"Bearer {ep.api_key}"}, timeout=max(1.0, period)
            )
            keep = _judge(ep, r.status_code)
        except (httpx.HTTPError, RuntimeError):
            period = max(0.05, period / 2)
        if not keep or ep.done:
            self._due.pop(ep.id, None)
        elif ep.id in self._due:
            self._due[ep.id] = (ep, time.monotonic() + period)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
