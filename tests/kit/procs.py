"""What /proc says about processes, for tests that must see a process, its group or its tree end.

Imported by name (the root conftest puts this folder on sys.path). Stdlib only, so a suite run from
another venv (vLLM's, verl's) can use it too. Processes are found by PID, process group or parent,
never by name;
`scheduler._wrap.proc_start_ticks` is the product's reader of the same file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgid, ...); None once it is gone.

    The command name is cut at the last ")": it may hold spaces and parentheses itself."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _running(fields: list[str] | None) -> bool:
    return fields is not None and fields[0] not in ("Z", "X")  # a zombie has ended; only its reaping is left


def running(pid: int) -> bool:
    return _running(stat(pid))


def gone_within(pids: int | list[int], seconds: float) -> bool:
    """Whether every one of `pids` has ended (or is a zombie) within `seconds`."""
    todo = [pids] if isinstance(pids, int) else list(pids)
    end = time.monotonic() + seconds
    while todo := [p for p in todo if running(p)]:
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
    return True


def _every() -> dict[int, list[str]]:
    out = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        fields = stat(int(path.parent.name))
        if _running(fields):
            out[int(path.parent.name)] = fields  # type: ignore[assignment]
    return out


def group(leader: int) -> list[int]:
    """The running PIDs of process group `leader`."""
    return [pid for pid, fields in _every().items() if int(fields[2]) == leader]


def tree(root: int) -> list[int]:
    """`root` and every running process below it, so a test kills exactly what a run started."""
    children: dict[int, list[int]] = {}
    for pid, fields in _every().items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def environ(pid: int) -> dict[str, str]:
    """/proc/PID/environ as a dict (empty once the process is gone or when it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def marked(marks: dict[str, str], spare: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """The running PIDs (not `spare`, not this process) whose environment holds every `marks` pair: what a
    process with that environment started, and what those started in turn, wherever they were re-parented."""
    me = os.getpid()
    return [
        pid
        for pid in _every()
        if pid != me and pid not in spare and all(environ(pid).get(k) == v for k, v in marks.items())
    ]


def kill_marked(marks: dict[str, str]) -> None:
    """A failed test's cleanup: SIGKILL, by PID, what `marked(marks)` finds (a run's orphaned children)."""
    for pid in marked(marks):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


__all__ = ["environ", "gone_within", "group", "kill_marked", "marked", "running", "stat", "tree"]


def hangup_default() -> None:
    """`preexec_fn` of a child a test sends SIGHUP: the signal's default action, as from a terminal.

    A child inherits an ignored SIGHUP, so under `nohup` (a suite started in the background) the
    product rightly treats the hangup as ignored, and a test of what a closed terminal does cannot
    see it."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
