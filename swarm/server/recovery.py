"""Durability of finished episodes: persist before the ack, mark what trained, replay after a restart.

    finish  -> persist (buffer row "buffered" or "failed", fsync'd) -> ack
    take    -> failed_group_policy: drop a group with a failed episode, or keep it when >= 2 remain
    step s  -> its episodes' rows become "trained" at s (never trained again)
    restart -> rows trained after the restored checkpoint go back to "buffered" (those weights
               were lost: the steps are trained again, their metrics rows say `redone`),
               rows over the replay bound for the policy that would train them become
               "dropped_stale", the rest return to the batcher as their groups (complete
               ones first; at most B per window, the others wait in a backlog); the
               counters of acknowledged work are rebuilt from the rows (`finished` equals
               the acknowledgements, whatever the checkpoint's counters said)

A restored partial group keeps its id and its free slots; the clients' re-played
jobs for that task fill it (or the stall rule completes it, leases.py). Replayed
episodes have their own staleness bound, `replay_staleness` (R): an episode is
replayed into a window only while every sample of it is at most R versions from
the policy that will train that window (`episode_lag`, an absolute distance: an
episode from a step the restart rolled back is as off-policy as one from the step
before), re-checked each time a window opens; the PPO ratio against its recorded
logprobs corrects the lag. R = None (the default) is computed at the restart as
what the replay needs: the widest lag among the restored rows plus the windows the
replay takes, so no acknowledged episode is dropped as stale; normal running stays
on `max_staleness`. The trainer's screen (`Batch.screen`) applies the same bounds
when it takes a batch; what it drops is marked here too. When replayed groups
complete a window, `groups_ready` is published (the trainer may start a step).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from pathlib import Path

from swarm.config.server import ServerConfig
from swarm.protocol import FinishRequest, FinishResponse
from swarm.server.batcher import Batch, Batcher, FinishedEpisode, Group, episode_lag
from swarm.server.buffer import BufferedRow, BufferError, DurableBuffer, encode_samples
from swarm.server.counters import Counters
from swarm.server.episodes import Episode
from swarm.server.events import Topic
from swarm.server.exceptions import Unavailable

log = logging.getLogger("swarm.server")
BUFFER_FILE = "buffer.sqlite"
RUN_STARTED = "run_started_at"  # buffer meta: rows finished before it belong to an earlier run
#: buffer row state -> the counter of it rebuilt at a restart
REBUILT = {
    "trained": "episodes_trained",
    "dropped_stale": "dropped_stale",
    "skipped": "episodes_skipped",
    "dropped_group": "episodes_dropped_failed_group",
    "dropped_stall": "episodes_dropped_stalled",
}


class Durability:
    """The durable buffer and what to do with its rows; reads the settings of `config` it names
    (`durable_buffer`, `out_dir`, `failed_group_policy`, `compact_buffer`, `group_size`,
    `replay_staleness`); it sets the batcher's bound of replayed episodes."""

    def __init__(self, config: ServerConfig, batcher: Batcher, counters: Counters) -> None:
        self.config = config
        self.batcher = batcher
        self.counters = counters
        self.buffer = DurableBuffer(Path(config.out_dir) / BUFFER_FILE) if config.durable_buffer else None
        self.groups_ready: Topic[[]] = Topic("replayed groups ready")
        self.failed: Counter[str] = Counter()  # failed finishes per group id still in the batcher
        self.backlog: list[Group] = []  # restored groups waiting for room in a window
        self._versions: dict[str, int] = {}  # restored episode id -> its policy version
        self._future_window: int | None = None  # highest window in the buffer at boot

    # -- finish ---------------------------------------------------------------------------------
    async def persist(
        self, ep: Episode, req: FinishRequest, finished: FinishedEpisode, response: FinishResponse
    ) -> None:
        """Write the finished episode durably (group commit: concurrent finishes share one fsync);
        `Unavailable` (retryable, not acknowledged) if that fails."""
        if self.buffer is None:
            return
        payload = {
            "samples": encode_samples(finished.samples),
            "metrics": finished.metrics,
            "calls": finished.calls,
            "tokens_unmerged": finished.tokens_unmerged,
            "drift": finished.drift,
            "agent_rewards": req.agent_rewards,
        }
        try:
            await self.buffer.add_async(
                episode_id=ep.id,
                group_id=ep.group_id,
                task_id=ep.task_id,
                task_family=ep.task_family,
                epoch=ep.epoch,
                policy_version=ep.policy_version,
                status=req.status,
                reward=req.reward,
                state="failed" if req.status == "failed" else "buffered",
                idempotency_key=req.idempotency_key,
                response=response.model_dump(),
                payload=payload,
            )
        except BufferError as exc:
            log.error("could not persist episode %s: %s", ep.id, exc)
            self.counters.add("buffer_errors")
            raise Unavailable(
                "buffer_unavailable", "the episode buffer could not persist this finish; retry", retry_after=1
            ) from None

    def failed_finish(self, group_id: str) -> None:
        """An episode of `group_id` finished "failed": `failed_group_policy` judges its group when taken."""
        self.failed[group_id] += 1

    def closed_episode(self, episode_id: str) -> Episode | None:
        """A finished episode known only to the buffer (finished before a restart): for idempotent retries."""
        row = self.buffer.get(episode_id) if self.buffer is not None else None
        if row is None:
            return None
        return Episode(
            id=row.id,
            task_id=row.task_id,
            task_family=row.task_family,
            group_id=row.group_id,
            metadata={},
            policy_version=row.policy_version,
            created_at=0.0,
            lease_expires_at=0.0,
            epoch=row.epoch,
            state="finished",
            finish_key=row.idempotency_key,
            finish_response=row.response,
            reward=row.reward,
        )

    # -- batches ----------------------------------------------------------------------------------
    def apply_failed_policy(self, batch: Batch) -> None:
        """The failed-group policy, applied to a batch the trainer just took (before it trains)."""
        keep = self.config.failed_group_policy == "keep"
        for g in batch.groups:
            failed = self.failed.pop(g.group_id, 0)
            if failed and g.finished and not (keep and len(g.finished) >= 2):
                self._mark([e.episode_id for e in g.finished], "dropped_group")
                self.counters.add("groups_dropped_failed")
                self.counters.add("episodes_dropped_failed_group", len(g.finished))
                g.dropped += len(g.finished)
                g.finished = []

    def resolved(self, batch: Batch, step: int | None) -> None:
        """Step `step` trained `batch` (None: it was skipped or the step failed)."""
        ids = [e.episode_id for e in batch.episodes]
        if batch.stale:  # screened out by the staleness bound when the batch was taken
            self._mark([e.episode_id for e in batch.stale], "dropped_stale")
            self.counters.add("dropped_stale", len(batch.stale))
        if step is not None:
            self._mark(ids, "trained", step)
            self.counters.add("episodes_trained", len(ids))
        else:
            self._mark(ids, "skipped")
            self.counters.add("episodes_skipped", len(ids))

    def dropped_stalled(self, ids: list[str]) -> None:
        """A stalled group was dropped whole (`stalled_group_policy: drop`): its finished rows never train."""
        self._mark(ids, "dropped_stall")

    def _mark(self, ids: list[str], state: str, step: int | None = None) -> None:
        if self.buffer is None or not ids:
            return
        try:
            self.buffer.mark(ids, state, step)
        except Exception:  # the in-memory truth stands; a restart may replay these rows once more
            log.exception("could not mark %d buffered episode(s) %s", len(ids), state)
            self.counters.add("buffer_errors")

    def compact(self, checkpointed_step: int) -> None:
        """After a checkpoint: drop the samples of rows no restart can replay (blocking: run in a thread)."""
        if self.buffer is None or not self.config.compact_buffer:
            return
        try:
            n = self.buffer.compact(checkpointed_step)
        except Exception:  # compaction only saves space: never fail a checkpoint over it
            log.exception("could not compact the episode buffer")
            return
        self.counters.add("buffer_compacted", n)

    # -- restart ------------------------------------------------------------------------------------
    def recover(self, resumed: bool, step: int, policy_version: int) -> None:
        """After `Swarm.resume` restored `step` and `policy_version` (or started afresh):
        put acknowledged-but-untrained episodes back into the batcher."""
        if self.buffer is None:
            return
        if not resumed:
            n = self.buffer.discard_unfinished()
            self.buffer.set_meta(RUN_STARTED, repr(time.time()))  # earlier runs' rows count no more
            if n:
                log.warning("not resuming: %d buffered episode(s) of an earlier run discarded", n)
            return
        rolled = self.buffer.rollback_to(step)
        rows = self.buffer.buffered()
        self.counters.add("episodes_rolled_back", rolled)
        self._rebuild_counters()
        groups: dict[str, Group] = {}
        for r in rows:
            g = groups.setdefault(r.group_id, Group(r.group_id, r.task_id, self.config.group_size))
            g.finished.append(_finished(r))
            g.size = max(g.size, len(g.finished))
            self._versions[r.id] = r.policy_version
        for gid, n in self.buffer.failed_in(groups).items():
            g = groups[gid]
            g.dropped = min(n, g.size - len(g.finished))
            self.failed[gid] = n
        # complete groups first (training resumes at once), then the nearest to the restored policy
        self.backlog = sorted(
            groups.values(), key=lambda g: (not g.complete, min(self._lag(e, policy_version) for e in g.finished))
        )
        self.batcher.replay_staleness = self._replay_bound(policy_version)
        self._future_window = self.buffer.max_window()
        replayed = self._inject(policy_version)
        log.info(
            "buffer of %r: %d episode(s) replayed, %d rolled back from lost steps, %d waiting, %d stale",
            self.config.served_model_name,  # a server of several policies says this once per policy
            replayed,
            rolled,
            sum(len(g.finished) for g in self.backlog),
            self.counters["dropped_stale"],
        )

    def refill(self, policy_version: int) -> None:
        """A new window (to be trained by `policy_version`) opened: restored groups that waited for
        room go in (staleness re-checked)."""
        if self.backlog or self._future_window is not None:
            self._inject(policy_version)
        live = self.batcher.groups
        self.failed = Counter({k: v for k, v in self.failed.items() if k in live})

    def _inject(self, version: int) -> int:
        b = self.batcher
        waiting: list[Group] = []
        replayed = 0
        for g in self.backlog:
            stale = [e for e in g.finished if self._lag(e, version) > self._bound()]
            if stale:
                self._mark([e.episode_id for e in stale], "dropped_stale")
                self.counters.add("dropped_stale", len(stale))
                g.finished = [e for e in g.finished if e not in stale]
            if not g.finished:
                self.failed.pop(g.group_id, None)
                continue
            if len(b.groups) < b.batch_groups and g.group_id not in b.groups:
                b.groups[g.group_id] = g
                replayed += len(g.finished)
            else:
                waiting.append(g)
        self.backlog = waiting
        self.counters.add("episodes_replayed", replayed)
        if self._future_window is not None:
            if b.window <= self._future_window and self.buffer is not None:
                # group ids must stay unique: this window may have been played before a rollback
                b.number_groups_from(self.buffer.next_group_index(b.window))
            else:
                self._future_window = None
        if replayed and b.ready():
            self.groups_ready.publish()
        return replayed

    def _replay_bound(self, version: int) -> int:
        """`replay_staleness`, or (None) what replaying every restored episode needs: the widest lag
        from `version` now, plus one version per window the backlog will take to train."""
        if self.config.replay_staleness is not None:
            return self.config.replay_staleness
        widest = max((self._lag(e, version) for g in self.backlog for e in g.finished), default=0)
        windows = math.ceil(len(self.backlog) / max(1, self.batcher.batch_groups))
        return max(self.batcher.max_staleness, widest + windows)

    def _bound(self) -> int:
        r = self.batcher.replay_staleness
        return self.batcher.max_staleness if r is None else r

    def _rebuild_counters(self) -> None:
        """The counters of acknowledged work, from the rows of this run: the checkpoint's counters
        are as old as the checkpoint, the buffer holds every acknowledgement since."""
        assert self.buffer is not None
        since = self.buffer.get_meta(RUN_STARTED)
        states, failed = self.buffer.tally(float(since) if since else None)
        self.counters.set("finished", sum(states.values()))
        self.counters.set("finished_failed", failed)
        for state, counter in REBUILT.items():
            self.counters.set(counter, states.get(state, 0))

    def _lag(self, e: FinishedEpisode, version: int) -> int:
        """A restored episode's lag: by its samples' versions, or its row's when it has none."""
        if e.samples:
            return episode_lag(e.samples, version)
        return abs(version - self._versions[e.episode_id])

    def counts(self) -> dict[str, int]:
        if self.buffer is None:
            return {}
        return {f"buffer_{k}": v for k, v in self.buffer.counts().items()}

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()


def _finished(r: BufferedRow) -> FinishedEpisode:
    p = r.payload
    return FinishedEpisode(
        r.id,
        r.reward,
        r.samples(),
        dict(p.get("metrics") or {}),
        calls=int(p.get("calls", 0)),
        tokens_unmerged=int(p.get("tokens_unmerged", 0)),
        drift=int(p.get("drift", 0)),
        family=r.task_family,
        replayed=True,
    )
