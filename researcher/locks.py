"""One process drives a study at a time: a per-study file lock.

flock, not a row in the store: the kernel releases it when its process dies, so a
kill -9 leaves no stale lock, and a second process (a daemon tick, `researcher
status` reconciling trials) that finds it taken skips instead of waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from store.paths import data_dir


@contextlib.contextmanager
def study_lock(study_id: int, blocking: bool = False) -> Iterator[bool]:
    """Yields whether the lock was taken (always, when `blocking`); the holder's PID is in the file."""
    path = data_dir() / "researcher" / "locks" / f"study-{study_id}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield True
    finally:
        os.close(fd)
