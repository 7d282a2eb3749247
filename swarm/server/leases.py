"""Leases and fencing: a claimed episode lives only while its holder shows signs of life.

    claim      -> lease = now + lease_seconds, epoch e (the key names e)
    heartbeat  -> lease extended              (POST .../heartbeat, sent by the client SDK)
    LLM call   -> lease extended              (the episode's own /v1 calls)
    sweep      -> lease past?  epoch e+1, episode "expired", its slot freed for another claim
    next claim of the same task -> the expired episode is handed over: same id, epoch e+1

The old holder's key still names epoch e, so its late calls, heartbeats and
finish get 409 `stale_epoch` (a zombie never writes into anyone's data), and a
call it had in flight lands on the old `Episode` object, already closed, and is
dropped. The sweeper is one asyncio task; it also unsticks a window whose group
waits for copies of a task nobody claims any more (`group_stall_s`): those free
slots are dropped and the group completes smaller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from swarm.server.episodes import Episode

if TYPE_CHECKING:
    from swarm.server.state import Swarm

log = logging.getLogger("swarm.server")


class LeaseKeeper:
    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm
        self.lease_seconds = swarm.config.lease_seconds
        self.sweep_s = max(0.05, min(1.0, self.lease_seconds / 4))
        self.stall_s = swarm.config.group_stall_s
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
            ep = self.swarm.registry.closed.get(ids.pop(0))
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
        s = self.swarm
        ep.epoch += 1  # from now on the holder's key is stale: 409 on everything it sends
        s.registry.close(ep, "expired")
        s.batcher.release(ep.group_id, ep.id)  # the slot reopens for another claim of this task
        ids = self.reclaimable.setdefault(ep.task_id, [])
        ids.append(ep.id)
        del ids[:-max(1, s.config.group_size * s.config.batch_groups)]  # bounded
        s.counters["expired"] += 1
        log.info("episode %s (task %s) expired: lease not renewed; slot reopened", ep.id, ep.task_id)

    def sweep(self, now: float | None = None) -> int:
        """Expire every open episode whose lease has passed; unstick stalled groups. Returns expiries."""
        s = self.swarm
        now = time.time() if now is None else now
        expired = [ep for ep in s.registry.open.values() if ep.lease_expires_at < now]
        for ep in expired:
            self.expire(ep)
        stalled = self._stalls(time.monotonic())
        if expired or stalled:
            s.wake_claims()
            s.trainer.kick()
        return len(expired)

    def _stalls(self, mono: float) -> int:
        """Drop the free slots of groups unchanged for `group_stall_s` with nobody playing them."""
        s = self.swarm
        seen: dict[str, tuple[tuple, float]] = {}
        dropped = 0
        for g in list(s.batcher.groups.values()):
            shape = (s.batcher.window, len(g.claimed), len(g.finished), g.dropped)
            old = self._groups.get(g.group_id)
            since = old[1] if old is not None and old[0] == shape else mono
            seen[g.group_id] = (shape, since)
            if (self.stall_s is not None and not s.batcher.training and not g.claimed and g.free > 0
                    and (g.finished or g.dropped) and mono - since >= self.stall_s):
                log.warning("group %s waited %.0fs for %d more episode(s) of %s; completing it smaller",
                            g.group_id, mono - since, g.free, g.task_id)
                s.counters["slots_abandoned"] += g.free
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
