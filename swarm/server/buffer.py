"""The durable episode buffer: every acknowledged finish is on disk before the ack.

SQLite in WAL mode with `synchronous=FULL` (`out_dir/buffer.sqlite`): a commit
returns only after the WAL is fsync'd, so a `kill -9` (or a power cut) right
after the finish answer loses nothing. Why SQLite rather than an fsync'd
append-only log: rows change state after they are written (buffered -> trained
at step s), finish must be idempotent by key across restarts (a primary-key
lookup), and recovery wants "every buffered row" without scanning a growing log
or compacting tombstones. SQLite gives atomic multi-row commits, crash recovery
of a torn write, and a file any tool (or a test) can read. One commit per
finish costs a few ms on a laptop disk; it runs on the event loop, which keeps
finish ordering trivial.

Row states (`state`):

    buffered       acknowledged, waiting for (or inside) a batch
    trained        went into the optimisation step `trained_step`
    failed         finished with status "failed": never trained
    dropped_group  its group was dropped by `failed_group_policy`
    dropped_stale  replayed after a restart but older than `max_staleness` allows
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

import json
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from swarm.samples import TrainSample

FINAL_STATES = ("trained", "failed", "dropped_group", "dropped_stale", "skipped", "discarded")
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
        return [TrainSample(input_ids=s["input_ids"], loss_mask=s["loss_mask"],
                            rollout_logprobs=s["logprobs"], episode_id=self.id, group_id=self.group_id,
                            reward=s["reward"], weight=s["weight"], policy_version=s["policy_version"])
                for s in self.payload.get("samples", [])]


def encode_samples(samples: Iterable[TrainSample]) -> list[dict[str, Any]]:
    return [{"input_ids": list(s.input_ids), "loss_mask": list(s.loss_mask),
             "logprobs": list(s.rollout_logprobs), "reward": s.reward, "weight": s.weight,
             "policy_version": s.policy_version} for s in samples]


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

    # -- writes (each one commit, durable when it returns) ------------------------------
    def add(self, *, episode_id: str, group_id: str, task_id: str, task_family: str, epoch: int,
            policy_version: int, status: str, reward: float, state: str, idempotency_key: str | None,
            response: dict, payload: dict) -> None:
        window, index = group_position(group_id)
        row = (episode_id, group_id, task_id, task_family, epoch, policy_version, window, index, status,
               reward, state, None, idempotency_key, json.dumps(response), json.dumps(payload), time.time())
        try:
            with self._lock:
                self._db.execute("INSERT INTO episodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row)
        except sqlite3.Error as exc:
            raise BufferError(f"{type(exc).__name__}: {exc}") from exc

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
                    n += self._db.execute("UPDATE episodes SET state=?, trained_step=? WHERE id=?",
                                          (state, step, i)).rowcount
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
            return self._db.execute("UPDATE episodes SET state='buffered', trained_step=NULL "
                                    "WHERE state='trained' AND trained_step>? AND payload!=?",
                                    (step, COMPACTED)).rowcount

    def compact(self, checkpointed_step: int) -> int:
        """Drop the payload of rows no restart can replay (see the module doc); returns how many."""
        finals = tuple(s for s in FINAL_STATES if s != "trained")
        marks = ",".join("?" * len(finals))
        with self._lock:
            return self._db.execute(
                f"UPDATE episodes SET payload=? WHERE payload!=? AND ((state='trained' AND trained_step<=?) "
                f"OR state IN ({marks}))", (COMPACTED, COMPACTED, checkpointed_step, *finals)).rowcount

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
        cols = ("id, group_id, task_id, task_family, epoch, policy_version, status, reward, state, "
                "trained_step, idempotency_key, response, payload")
        with self._lock:
            rows = self._db.execute(f"SELECT {cols} FROM episodes WHERE {where} ORDER BY finished_at",
                                    args).fetchall()
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
                out[gid] = self._db.execute("SELECT COUNT(*) FROM episodes WHERE group_id=? AND state='failed'",
                                            (gid,)).fetchone()[0]
        return out

    def max_window(self) -> int | None:
        with self._lock:
            return self._db.execute("SELECT MAX(window) FROM episodes").fetchone()[0]

    def next_group_index(self, window: int) -> int:
        """One past the highest group index used in `window` (group ids stay unique across restarts)."""
        with self._lock:
            top = self._db.execute("SELECT MAX(group_index) FROM episodes WHERE window=?", (window,)).fetchone()[0]
        return 0 if top is None else top + 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM episodes GROUP BY state").fetchall())

    def close(self) -> None:
        with self._lock:
            self._db.close()
