"""One process at a time in a folder: an exclusive lock held for the process's life.

    held = hold_folder(out, "server.lock", "swarm serve")   # FolderInUse names the holder
    describe(held, url=url)                                 # what a refused process is told
    ...                                                     # the lock goes with the process (kill -9 too)

Two servers on one out folder both replay its durable buffer, train the same episodes twice and
write metrics, checkpoints and buffer files over each other; a `swarm train --fresh` into the folder
of a run still going deletes its files under it. Both happen when an old process is still up (another
terminal, a requeued Slurm job whose first run lingers) and a new one is started on its folder. The
kernel's `flock` is released with the process, so a crash never leaves a stale lock, unlike a pid file;
the file holds who has it (JSON), for the message a refused process prints.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import IO, Any


class FolderInUse(RuntimeError):
    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(f"{folder} is in use by {holder}")
        self.holder = holder  # "another swarm serve (pid N, URL)"


def hold_folder(folder: Path, name: str, holder: str) -> IO[str]:
    """Lock `folder/name` for this process (creating the folder); keep the returned file open for as
    long as the folder is in use. FolderInUse, saying who holds it, when another process does."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    held = open(folder / name, "a+")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        who = _who(held.read())
        held.close()
        raise FolderInUse(folder, who) from None
    describe(held, holder=holder, pid=os.getpid())
    return held


def describe(held: IO[str], **info: Any) -> None:
    """Add `info` (a URL once bound, say) to what a process refused this folder is told."""
    held.seek(0)
    try:
        known = json.loads(held.read() or "{}")
    except ValueError:
        known = {}
    held.seek(0)
    held.truncate()
    held.write(json.dumps({**known, **info}))
    held.flush()


def _who(text: str) -> str:
    try:
        info = json.loads(text)
        extra = "".join(f", {info[k]}" for k in ("url",) if info.get(k))
        return f"another {info['holder']} (pid {int(info['pid'])}{extra})"
    except (ValueError, KeyError, TypeError):
        return "another process"


__all__ = ["FolderInUse", "describe", "hold_folder"]
