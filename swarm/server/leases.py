"""Leases and fencing: a claimed episode lives only while its holder shows signs of life.

    claim      -> lease = now + lease_seconds, epoch e (the key names e)
    heartbeat  -> lease extended              (POST .../heartbeat, sent by the client SDK)
    LLM call   -> lease extended              (the episode's own /v1 calls)
    sweep      -> lease past?  epoch e+1, episode "expired", its slot freed for another claim
    next claim of the same task -> the expired episode is handed over: same id, epoch e+1

The old holder's key still names epoch e, so its late calls, heartbeats and
finish raise `StaleLease` (409 `stale_epoch`: a zombie never writes into anyone's
data), and a call it had in flight lands on the old `Episode` object, already
closed, and is dropped. The sweeper is one asyncio task; it also unsticks a
window whose group waits for copies of a task nobody claims any more
(`group_stall_s`): those free slots are dropped and the group completes smaller.
A sweep that freed anything publishes `slots_freed` (claims waiting for room
retry, a group that just completed may train).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from swarm.server.batcher import Batcher
from swarm.server.config import ServerConfig
from swarm.server.episodes import Episode, EpisodeRegistry
from swarm.server.events import Topic

log = logging.getLogger("swarm.server")


class LeaseKeeper:
    """Renews, expires and hands over episodes; reads `lease_seconds` and `group_stall_s` of `config`."""

    def __init__(self, registry: EpisodeRegistry, batcher: Batcher, config: ServerConfig,
                 counters: Counter[str]) -> None:
        self.registry = registry
        self.batcher = batcher
        self.counters = counters
        self.lease_seconds = config.lease_seconds
        self.sweep_s = max(0.05, min(1.0, self.lease_seconds / 4))
        self.stall_s = config.group_stall_s
        self.slots_freed: Topic[[]] = Topic("slots freed")
        self.reclaimable: dict[str, list[str]] = {}  # task_id -> expired episode ids, oldest first
        self._groups: dict[str, tuple[tuple, float]] = {}  # group_id -> (last seen shape, since)
        self._task: asyncio.Task | None = None

    # -- renewal ------------------------------------------------------------------------------
    def touch(self, ep: Episode) -> None:
        """An episode's own LLM call is a sign of life: extend its lease."""
        if ep.state == "open":
            ep.lease_expires_at = max(ep.lease_expires_at, time.time() + self.lease_seconds)

    # -- hand-over ------------------------------------------------------------------------------
    def take(self, task_id: str) -> Episode | None:
        """An expired episode of `task_id` to hand to a new claim (its epoch already moved on)."""
        ids = self.reclaimable.get(task_id)
        while ids:
            ep = self.registry.closed.get(ids.pop(0))
            if ep is not None and ep.state == "expired":
                if not ids:
                    self.reclaimable.pop(task_id, None)
                return ep
        self.reclaimable.pop(task_id, None)
        return None

    def put_back(self, ep: Episode | None) -> None:
        """A claim that took `ep` was refused: keep it for the next one."""
        if ep is not None:
            self.reclaimable.setdefault(ep.task_id, []).insert(0, ep.id)

    # -- expiry -------------------------------------------------------------------------------
    def expire(self, ep: Episode) -> None:
        ep.epoch += 1  # from now on the holder's key is stale: 409 on everything it sends
        self.registry.close(ep, "expired")
        self.batcher.release(ep.group_id, ep.id)  # the slot reopens for another claim of this task
        ids = self.reclaimable.setdefault(ep.task_id, [])
        ids.append(ep.id)
        del ids[:-max(1, self.batcher.group_size * self.batcher.batch_groups)]  # bounded
        self.counters["expired"] += 1
        log.info("episode %s (task %s) expired: lease not renewed; slot reopened", ep.id, ep.task_id)

    def sweep(self, now: float | None = None) -> int:
        """Expire every open episode whose lease has passed; unstick stalled groups. Returns expiries."""
        now = time.time() if now is None else now
        expired = [ep for ep in self.registry.open.values() if ep.lease_expires_at < now]
        for ep in expired:
            self.expire(ep)
        stalled = self._stalls(time.monotonic())
        if expired or stalled:
            self.slots_freed.publish()
        return len(expired)

    def _stalls(self, mono: float) -> int:
        """Drop the free slots of groups unchanged for `group_stall_s` with nobody playing them."""
        b = self.batcher
        seen: dict[str, tuple[tuple, float]] = {}
        dropped = 0
        for g in list(b.groups.values()):
            shape = (b.window, len(g.claimed), len(g.finished), g.dropped)
            old = self._groups.get(g.group_id)
            since = old[1] if old is not None and old[0] == shape else mono
            seen[g.group_id] = (shape, since)
            if (self.stall_s is not None and not b.training and not g.claimed and g.free > 0
                    and (g.finished or g.dropped) and mono - since >= self.stall_s):
                log.warning("group %s waited %.0fs for %d more episode(s) of %s; completing it smaller",
                            g.group_id, mono - since, g.free, g.task_id)
                self.counters["slots_abandoned"] += g.free
                g.dropped += g.free
                dropped += 1
        self._groups = seen
        return dropped

    # -- the sweeper task ---------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                self.sweep()
            except Exception:  # the sweeper must outlive any bug in one sweep
                log.exception("lease sweep failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lease-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
