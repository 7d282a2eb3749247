"""Leases and fencing: a claimed episode lives only while its holder shows signs of life.

    claim      -> lease = now + lease_seconds (30 s by default), epoch e (the key names e)
    heartbeat  -> lease extended              (the SDK beats every third of the lease, from a thread
                                               beside the agent: a long tool call keeps its lease)
    LLM call   -> lease extended              (the episode's own /v1 calls)
    sweep      -> lease past?  epoch e+1, episode "expired", its slot freed for another claim
    next claim of the same task -> the expired episode is handed over: same id, epoch e+1

The old holder's key still names epoch e, so its late calls, heartbeats and
finish raise `StaleLease` (409 `stale_epoch`: a zombie never writes into anyone's
data), and a call it had in flight lands on the old `Episode` object, already
closed, and is dropped. A dead or frozen (SIGSTOP, a sleeping laptop) client is
thus detected within one lease; the sweeper runs every min(1 s, lease/4).
While an on-policy step holds generation back (`Batcher.gated`), leases and stall
clocks stand still: the next window's episodes (`claims_during_step`) may be
waiting at the gate with a call their holders cannot finish; the time the step
took is added to every open lease once it ends.

Stalled groups (`group_stall_s`, `stalled_group_policy`): a group without
*progress* (a new claim or hand-over, a finish, an abort that gives the slot up;
an expiry is no progress) for `group_stall_s` is stalled when

  * free slots nobody plays: nobody holds a slot and some are free (clients that
    played its task vanished, and nobody claims it again), or
  * the window waits on it: the window holds its B groups, at least one complete,
    and the clock counts from max(its last progress, the moment the window began
    waiting) -- this covers a holder that still heartbeats but never finishes (a
    hung tool), and a frozen holder whose lease has not run out yet.

A stalled group completes at once: its open episodes are fenced (epoch+1, closed
"expired"; a late finish gets 409) and its free slots dropped; then `partial`
trains the members that finished, `drop` trains none of them (`group_dropped`
is published with their ids: the buffer marks them `dropped_stall`). Either
way the group counts as complete, so one frozen client holds up the others'
training for at most `group_stall_s` after the rest of the window is done, and
only once: a fenced holder's slot is owed to its replay for one lease
(`Batcher.owe`), so when it thaws and its fleet re-plays the job, that one claim
gets a group of its own size instead of a fresh group of n that would wait a
second stall period for claims nobody makes. A live holder learns of the fence
at its next heartbeat (a third of a lease); one gone longer than a lease is taken
for dead, and its task's next claims form ordinary groups.
A sweep that freed anything publishes `slots_freed` (claims waiting for room
retry, a group that just completed may train).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from swarm.config.server import ServerConfig
from swarm.server.batcher import Batcher, Group
from swarm.server.counters import Counters
from swarm.server.episodes import Episode, EpisodeRegistry
from swarm.server.events import Topic

log = logging.getLogger("swarm.server")


@dataclass
class _Progress:
    """What a group looked like at its last progress, and when (monotonic)."""

    window: int
    resolved: int  # finished + dropped
    holders: set[tuple[str, int]]  # (episode id, epoch) of every holder seen since
    since: float


class LeaseKeeper:
    """Renews, expires and hands over episodes, resolves stalled groups; reads `lease_seconds`,
    `group_stall_s` and `stalled_group_policy` of `config`."""

    def __init__(self, registry: EpisodeRegistry, batcher: Batcher, config: ServerConfig, counters: Counters) -> None:
        self.registry = registry
        self.batcher = batcher
        self.counters = counters
        self.lease_seconds = config.lease_seconds
        self.sweep_s = max(0.05, min(1.0, self.lease_seconds / 4))
        self.stall_s = config.group_stall_s
        self.policy = config.stalled_group_policy
        self.slots_freed: Topic[[]] = Topic("slots freed")
        self.group_dropped: Topic[[list[str]]] = Topic("stalled group dropped")  # finished ids not trained
        self.reclaimable: dict[str, list[str]] = {}  # task_id -> expired episode ids, oldest first
        self._groups: dict[str, _Progress] = {}  # group_id -> its last progress
        self._waiting: tuple[int, float] | None = None  # (window, since when) the full window waits on stragglers
        self._held_since: float | None = None  # a step holds generation back since (leases paused)
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
        del ids[: -max(1, self.batcher.group_size * self.batcher.batch_groups)]  # bounded
        self.counters.add("expired")
        log.info("episode %s (task %s) expired: lease not renewed; slot reopened", ep.id, ep.task_id)

    def sweep(self, now: float | None = None) -> int:
        """Expire every open episode whose lease has passed; unstick stalled groups. Returns expiries."""
        now = time.time() if now is None else now
        if self._held_since is not None and not self.batcher.gated:
            held = now - self._held_since  # generation was held back for a step: not the holders' time
            for ep in self.registry.open.values():
                ep.lease_expires_at += held
            self._held_since = None
        if self.batcher.gated:  # an episode may be waiting at the gate, unable to renew through its call
            self._held_since = now if self._held_since is None else self._held_since
            expired = []
        else:
            expired = [ep for ep in self.registry.open.values() if ep.lease_expires_at < now]
        for ep in expired:
            self.expire(ep)
        stalled = self._stalls(time.monotonic())
        if expired or stalled:
            self.slots_freed.publish()
        return len(expired)

    def _stalls(self, mono: float) -> int:
        """Resolve stalled groups (see the module doc); returns how many."""
        b = self.batcher
        full = len(b.groups) >= b.batch_groups
        waiting = full and not b.gated and not b.ready() and any(g.complete for g in b.groups.values())
        if not waiting:
            self._waiting = None
        elif self._waiting is None or self._waiting[0] != b.window:
            self._waiting = (b.window, mono)
        waiting_since = self._waiting[1] if self._waiting is not None else None
        seen: dict[str, _Progress] = {}
        stalled = 0
        for g in list(b.groups.values()):
            holders = {(i, ep.epoch) for i in g.claimed if (ep := self.registry.open.get(i)) is not None}
            old = self._groups.get(g.group_id)
            resolved = len(g.finished) + g.dropped
            moved = old is None or old.window != b.window or resolved > old.resolved or not holders <= old.holders
            if moved or b.gated:  # it moved on, or its calls wait for a step: no clock runs
                seen[g.group_id] = progress = _Progress(b.window, resolved, holders, mono)
            else:
                seen[g.group_id] = progress = _Progress(b.window, resolved, old.holders | holders, old.since)
            since = progress.since
            if self.stall_s is None or b.training or g.complete or self._committing(g):
                continue
            unplayed = not g.claimed and g.free > 0 and resolved > 0 and mono - since >= self.stall_s
            straggler = waiting_since is not None and mono - max(since, waiting_since) >= self.stall_s
            if unplayed or straggler:
                self._resolve_stalled(g, mono - since)
                stalled += 1
        self._groups = seen
        return stalled

    def _committing(self, g: Group) -> bool:
        """A finish of the group is being committed: that is progress, and its slot must stay."""
        return any((ep := self.registry.open.get(i)) is not None and ep.finishing is not None for i in g.claimed)

    def _resolve_stalled(self, g: Group, idle_s: float) -> None:
        fenced = 0
        for i in sorted(g.claimed):
            ep = self.registry.open.get(i)
            if ep is not None:
                ep.epoch += 1  # its holder's key is stale now: 409 on a late call, heartbeat or finish
                self.registry.close(ep, "expired")
                self.batcher.owe(g.task_id, time.time() + self.lease_seconds)  # its replay: no new stall
                fenced += 1
        free = g.free + len(g.claimed)
        g.claimed.clear()
        g.dropped += free
        self.counters.add("groups_stalled")
        self.counters.add("episodes_fenced_stalled", fenced)
        self.counters.add("slots_abandoned", free - fenced)
        dropped: list[str] = []
        if self.policy == "drop" and g.finished:
            dropped = [e.episode_id for e in g.finished]
            g.dropped += len(g.finished)
            g.finished = []
            self.counters.add("episodes_dropped_stalled", len(dropped))
            self.group_dropped.publish(dropped)
        log.warning(
            "group %s of %s made no progress for %.0fs: %d open episode(s) fenced, %d free slot(s) given up; it %s",
            g.group_id,
            g.task_id,
            idle_s,
            fenced,
            free - fenced,
            f"is dropped ({len(dropped)} finished)"
            if self.policy == "drop"
            else f"trains with {len(g.finished)} finished",
        )

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
