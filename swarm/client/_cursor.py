"""The fleet's dataset cursor, persisted: a restarted `swarm client` continues where it stopped.

Jobs are numbered in hand-out order: job j plays dataset item (j // n) % len(dataset)
(task 0 × n, task 1 × n, ..., then the next epoch). The state file holds

    {"next": 1234, "pending": [1228, 1231], "n": 8, "dataset_size": 64, ...}

`next` is the first job never handed out; `pending` the jobs handed out but not
done (in flight when the process died). A restart re-plays the pending jobs
first, in order, then goes on from `next`. Re-playing exactly the lost jobs
(not "everything after the oldest lost one") keeps each task's copies at n, so
the server's groups fill instead of waiting for copies nobody sends.

The file is rewritten atomically (temp + rename) at every change: a `kill -9`
leaves the old or the new state. It is keyed by the job list, not the workflow
code: editing the agent does not reset it. No fsync: a process crash keeps the
page cache; only a power cut can lose the last few updates (a few re-played jobs).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from store.paths import data_dir

log = logging.getLogger("swarm.client")


def default_state_path(
    url: str, workflow: str, seed: int, dataset: str | None = None, policy: str | None = None
) -> Path:
    """`ROOST_HOME/client-state/<hash of url, workflow, dataset, seed and policy>.json` (the policy: fleets
    of two policies of one server are two runs; `swarm train` gives its fleets cursors in the run folder)."""
    key = json.dumps([url.rstrip("/"), workflow, dataset, seed] + ([policy] if policy else []))
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return data_dir() / "client-state" / f"{digest}.json"


class JobCursor:
    """Thread-safe job numbering with an optional JSON state file."""

    def __init__(
        self, dataset_size: int, n: int, epochs: int | None = None, path: Path | None = None, meta: dict | None = None
    ) -> None:
        self.dataset_size = dataset_size
        self.n = n
        self.epochs = epochs
        self.path = Path(path) if path is not None else None
        self.meta = dict(meta or {})
        self.next = 0
        self.pending: set[int] = set()
        self.replay: list[int] = []
        self._lock = threading.Lock()
        self._dir_made = False
        if self.path is not None and self.path.exists():
            self._load()

    @property
    def total(self) -> int | None:
        return None if self.epochs is None else self.epochs * self.dataset_size * self.n

    def task_index(self, job: int) -> int:
        return (job // self.n) % self.dataset_size

    def _load(self) -> None:
        assert self.path is not None
        try:
            state = json.loads(self.path.read_text())
            self.next = int(state["next"])
            self.pending = {int(j) for j in state.get("pending", [])}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable client state %s: %s", self.path, exc)
            self.next, self.pending = 0, set()
            return
        if state.get("n") != self.n or state.get("dataset_size") != self.dataset_size:
            log.warning(
                "client state %s was written for n=%s, dataset_size=%s (now %s, %s): continuing by job number",
                self.path,
                state.get("n"),
                state.get("dataset_size"),
                self.n,
                self.dataset_size,
            )
        self.replay = sorted(self.pending)

    def take(self) -> int | None:
        """The next job: a pending one from an earlier run first, else a new one (None: no more)."""
        if self.dataset_size == 0:
            return None
        with self._lock:
            if self.replay:
                return self.replay.pop(0)
            if self.total is not None and self.next >= self.total:
                return None
            job = self.next
            self.next += 1
            self.pending.add(job)
            self._save()
            return job

    def done(self, job: int) -> None:
        """The job finished (or was given up): never re-played."""
        with self._lock:
            self.pending.discard(job)
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        state = {
            "next": self.next,
            "pending": sorted(self.pending),
            "n": self.n,
            "dataset_size": self.dataset_size,
            "updated_at": time.time(),
            **self.meta,
        }
        try:
            if not self._dir_made:  # once: a mkdir per save was a syscall per episode
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._dir_made = True
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk must not stop the fleet; the cursor is a convenience
            log.warning("could not save client state %s: %s", self.path, exc)
