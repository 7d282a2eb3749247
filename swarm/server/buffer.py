"""The durable episode buffer: every acknowledged finish is on disk before the ack.

SQLite in WAL mode with `synchronous=FULL` (`out_dir/buffer.sqlite`): a commit
returns only after the WAL is fsync'd, so a `kill -9` (or a power cut) right
after the finish answer loses nothing. Why SQLite rather than an fsync'd
append-only log: rows change state after they are written (buffered -> trained
at step s), finish must be idempotent by key across restarts (a primary-key
lookup), and recovery wants "every buffered row" without scanning a growing log
or compacting tombstones. SQLite gives atomic multi-row commits, crash recovery
of a torn write, and a file any tool (or a test) can read. One commit per
finish would cost a few ms of fsync, and run on the event loop it stalled every
request; so finishes go through group commit (`add_async`): a writer thread takes
every row queued while the previous commit was syncing and writes them in one
transaction, one fsync for all. Each finish still waits for its own commit
before it is acknowledged: batched, never skipped.

Row states (`state`):

    buffered       acknowledged, waiting for (or inside) a batch
    trained        went into the optimisation step `trained_step`
    failed         finished with status "failed": never trained
    dropped_group  its group was dropped by `failed_group_policy`
    dropped_stale  replayed after a restart but older than `replay_staleness` allows
    dropped_stall  its group stalled and `stalled_group_policy` is drop (leases.py)
    skipped        its batch had no samples, or the training step failed
    discarded      left behind by a start without `resume` over the same out_dir

Compaction: after each checkpoint, rows that can never be replayed again (trained
at or before the checkpointed step, or in any other final state) lose their
payload (the token ids, most of a row's bytes); the row itself stays, so
idempotent finish retries and the accounting still work, and SQLite reuses the
freed pages, so a long run's buffer stops growing with its history. The
token-level record of every episode stays in `rollouts.jsonl` for `swarm inspect`.

Storage only: which rows to replay, and where, is decided by `recovery.py`.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.samples import TrainSample

FINAL_STATES = ("trained", "failed", "dropped_group", "dropped_stale", "dropped_stall", "skipped", "discarded")
COMPACTED = "{}"  # the payload of a compacted row (a stored payload always has "samples")
_WINDOW = re.compile(r"#w(\d+)g(\d+)$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    group_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_family TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    window INTEGER,
    group_index INTEGER,
    status TEXT NOT NULL,
    reward REAL NOT NULL,
    state TEXT NOT NULL,
    trained_step INTEGER,
    idempotency_key TEXT,
    response TEXT NOT NULL,
    payload TEXT NOT NULL,
    finished_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_state ON episodes(state);
CREATE INDEX IF NOT EXISTS episodes_window ON episodes(window);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def group_position(group_id: str) -> tuple[int | None, int | None]:
    """(window, index) of a batcher group id `task#w<window>g<index>`; Nones for other names."""
    m = _WINDOW.search(group_id)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


@dataclass
class BufferedRow:
    """One stored episode, as recovery needs it."""

    id: str
    group_id: str
    task_id: str
    task_family: str
    epoch: int
    policy_version: int
    status: str
    reward: float
    state: str
    trained_step: int | None
    idempotency_key: str | None
    response: dict
    payload: dict

    def samples(self) -> list[TrainSample]:
        """The row's samples with their own episode ids: a group call's choices (`<episode>/<i>`) stay
        separate members of their group (rows written without the ids load under the row's id)."""
        return [
            TrainSample(
                input_ids=s["input_ids"],
                loss_mask=s["loss_mask"],
                rollout_logprobs=s["logprobs"],
                episode_id=s.get("episode_id", self.id),
                group_id=self.group_id,
                reward=s["reward"],
                weight=s["weight"],
                policy_version=s["policy_version"],
            )
            for s in self.payload.get("samples", [])
        ]


def encode_samples(samples: Iterable[TrainSample]) -> list[dict[str, Any]]:
    return [
        {
            "input_ids": list(s.input_ids),
            "loss_mask": list(s.loss_mask),
            "episode_id": s.episode_id,
            "logprobs": list(s.rollout_logprobs),
            "reward": s.reward,
            "weight": s.weight,
            "policy_version": s.policy_version,
        }
        for s in samples
    ]


class BufferError(Exception):
    """The buffer could not persist (disk full, I/O error): the finish must not be acknowledged."""


class DurableBuffer:
    """A tiny SQLite store of finished episodes. Thread-safe (one connection, one lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # fsync the WAL on every commit
        self._db.executescript(_SCHEMA)
        self._group: GroupCommit | None = None  # the group-commit writer thread, started on first use

    # -- writes (each one commit, durable when it returns) ------------------------------
    @staticmethod
    def row(
        *,
        episode_id: str,
        group_id: str,
        task_id: str,
        task_family: str,
        epoch: int,
        policy_version: int,
        status: str,
        reward: float,
        state: str,
        idempotency_key: str | None,
        response: dict,
        payload: dict,
    ) -> tuple:
        """One `episodes` row, as `add`/`add_async` insert it."""
        window, index = group_position(group_id)
        return (
            episode_id,
            group_id,
            task_id,
            task_family,
            epoch,
            policy_version,
            window,
            index,
            status,
            reward,
            state,
            None,
            idempotency_key,
            json.dumps(response),
            json.dumps(payload),
            time.time(),
        )

    def add(self, **fields: Any) -> None:
        """Insert one row in its own commit (blocking until it is fsync'd)."""
        self._insert([self.row(**fields)])

    async def add_async(self, **fields: Any) -> None:
        """Insert one row by group commit: returns once the commit holding it is fsync'd."""
        await asyncio.wrap_future(self._writer().submit(self.row(**fields)))

    def _insert(self, rows: list[tuple]) -> None:
        """All of `rows` in one transaction (one fsync); `BufferError` if it failed (none written)."""
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany("INSERT INTO episodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise BufferError(f"{type(exc).__name__}: {exc}") from exc

    def _writer(self) -> GroupCommit:
        with self._lock:
            if self._group is None:
                self._group = GroupCommit(self._insert)
            return self._group

    def mark(self, ids: Iterable[str], state: str, step: int | None = None) -> int:
        """Move rows to `state` (with `trained_step` for "trained") in one commit."""
        ids = list(ids)
        if not ids:
            return 0
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                n = 0
                for i in ids:
                    n += self._db.execute(
                        "UPDATE episodes SET state=?, trained_step=? WHERE id=?", (state, step, i)
                    ).rowcount
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return n

    def rollback_to(self, step: int) -> int:
        """Rows trained after `step` go back to buffered: the weights holding them were lost.

        Only rows that still hold their samples: a compacted row was trained into
        a checkpoint that is gone now (deleted by hand), and cannot be replayed.
        """
        with self._lock:
            return self._db.execute(
                "UPDATE episodes SET state='buffered', trained_step=NULL "
                "WHERE state='trained' AND trained_step>? AND payload!=?",
                (step, COMPACTED),
            ).rowcount

    def compact(self, checkpointed_step: int) -> int:
        """Drop the payload of rows no restart can replay (see the module doc); returns how many."""
        finals = tuple(s for s in FINAL_STATES if s != "trained")
        marks = ",".join("?" * len(finals))
        with self._lock:
            return self._db.execute(
                f"UPDATE episodes SET payload=? WHERE payload!=? AND ((state='trained' AND trained_step<=?) "
                f"OR state IN ({marks}))",
                (COMPACTED, COMPACTED, checkpointed_step, *finals),
            ).rowcount

    def payload_bytes(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM episodes").fetchone()[0])

    def discard_unfinished(self) -> int:
        with self._lock:
            return self._db.execute("UPDATE episodes SET state='discarded' WHERE state='buffered'").rowcount

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # -- reads ----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _rows(self, where: str, args: tuple = ()) -> list[BufferedRow]:
        cols = (
            "id, group_id, task_id, task_family, epoch, policy_version, status, reward, state, "
            "trained_step, idempotency_key, response, payload"
        )
        with self._lock:
            rows = self._db.execute(f"SELECT {cols} FROM episodes WHERE {where} ORDER BY finished_at", args).fetchall()
        return [BufferedRow(*r[:11], json.loads(r[11]), json.loads(r[12])) for r in rows]

    def get(self, episode_id: str) -> BufferedRow | None:
        rows = self._rows("id=?", (episode_id,))
        return rows[0] if rows else None

    def buffered(self) -> list[BufferedRow]:
        return self._rows("state='buffered'")

    def failed_in(self, group_ids: Iterable[str]) -> dict[str, int]:
        """Failed rows per group (their slots are resolved; a restored group must know)."""
        out: dict[str, int] = {}
        with self._lock:
            for gid in group_ids:
                out[gid] = self._db.execute(
                    "SELECT COUNT(*) FROM episodes WHERE group_id=? AND state='failed'", (gid,)
                ).fetchone()[0]
        return out

    def max_window(self) -> int | None:
        with self._lock:
            return self._db.execute("SELECT MAX(window) FROM episodes").fetchone()[0]

    def next_group_index(self, window: int) -> int:
        """One past the highest group index used in `window` (group ids stay unique across restarts)."""
        with self._lock:
            top = self._db.execute("SELECT MAX(group_index) FROM episodes WHERE window=?", (window,)).fetchone()[0]
        return 0 if top is None else top + 1

    def tally(self, since: float | None = None) -> tuple[dict[str, int], int]:
        """(rows per state, rows finished "failed") of the rows finished at or after `since`, but
        "discarded" ones: what a restart rebuilds its counters from."""
        where, args = (
            ("finished_at>=? AND state!='discarded'", (since,)) if since is not None else ("state!='discarded'", ())
        )
        with self._lock:
            states = dict(
                self._db.execute(f"SELECT state, COUNT(*) FROM episodes WHERE {where} GROUP BY state", args).fetchall()
            )
            failed = self._db.execute(
                f"SELECT COUNT(*) FROM episodes WHERE {where} AND status='failed'", args
            ).fetchone()[0]
        return states, int(failed)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM episodes GROUP BY state").fetchall())

    def close(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.close()  # rows already queued are committed (and answered) first
        with self._lock:
            self._db.close()


class GroupCommit:
    """One writer thread committing queued rows in batches: one transaction, one fsync, per batch.

    While a commit syncs, new rows queue up; the next commit takes them all. A
    batch that fails as a whole (one row a duplicate, say) is retried row by row,
    so each caller learns about its own row only.
    """

    MAX_ROWS = 512

    def __init__(self, insert: Any) -> None:
        self._insert = insert
        self._queue: queue.SimpleQueue[tuple[tuple, Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="buffer-group-commit", daemon=True)
        self._thread.start()
        self.commits = 0  # transactions written (tests and benchmarks compare with rows)
        self.rows = 0

    def submit(self, row: tuple) -> Future:
        done: Future = Future()
        self._queue.put((row, done))
        return done

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            stop = False
            while len(batch) < self.MAX_ROWS:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[tuple, Future]]) -> None:
        try:
            self._insert([row for row, _ in batch])
        except BufferError as exc:
            if len(batch) > 1:
                for one in batch:
                    self._commit([one])
                return
            _settle(batch[0][1], exc)
            return
        except BaseException as exc:  # never leave a finish waiting forever
            for _, done in batch:
                _settle(done, BufferError(f"{type(exc).__name__}: {exc}"))
            return
        self.commits += 1
        self.rows += len(batch)
        for _, done in batch:
            _settle(done, None)


def _settle(done: Future, error: BaseException | None) -> None:
    """Answer one waiter (one whose wait was cancelled has gone; its row's fate stands)."""
    if done.set_running_or_notify_cancel():
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
