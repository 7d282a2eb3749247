"""The tiny supervisor around every local job (stdlib only: it starts in ~30 ms).

    python -m scheduler._wrap --dir JOBDIR --slots SLOTDIR --max N --time-limit S -- CMD...

It runs detached from the scheduler (its own session), so jobs outlive a scheduler
crash, and it records everything the scheduler needs to learn what happened later:

0. Record: writes JOBDIR/wrapper.json {pid, start_ticks} before anything else, so a
   submitter that died before recording the job's handle can still find it
   (`LocalBackend.find`).
1. Queue: waits until it holds one of N slot locks (`flock` on SLOTDIR/slot-I.lock;
   the kernel drops a dead holder's lock, so slots never leak). Until then the job is
   PENDING. First come, first served: each waiter holds a ticket file in
   SLOTDIR/queue (named by submission time, locked while its waiter lives), and only
   the first live ticket may take a free slot; a dead waiter's ticket is unlocked and
   swept by the next. The queue works with no scheduler process running at all.
   `--max 0`: a light job (`JobSpec.light`) starts at once, taking no slot.
2. Start: starts CMD in its own process group with stdout/stderr appended to
   JOBDIR/stdout and JOBDIR/stderr, then writes JOBDIR/child and JOBDIR/started (JSON,
   atomically; in that order, so a job seen RUNNING always has its process group on record).
3. Limits: past `--time-limit` seconds it sends SIGTERM to the job's process group,
   SIGKILL after `--kill-wait` seconds, and records TIMEOUT. SIGTERM/SIGINT to the
   wrapper does the same and records CANCELLED.
4. End: writes JOBDIR/exit.json {state, exit_code, reason, started_at, finished_at}
   atomically (temp file + rename) and exits with the job's exit code.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SLOT_POLL_S = 0.2
WRAPPER_RECORD = "wrapper.json"


def proc_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot; None if it is gone or a zombie.

    Field 22 of /proc/PID/stat: with the pid it names one process for the machine's
    uptime (a recycled pid gets another start time).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: as good as gone
        return None
    return int(fields[19])


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader sees the old file or the whole new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class _Stop:
    """Why the wrapper was asked to stop (set from a signal handler)."""

    reason: str | None = None


def _on_signal(signum: int, _frame: Any) -> None:
    _Stop.reason = "CANCELLED"


def acquire_slot(slots: Path, n: int, ticket: str | None = None) -> int | None:
    """Block until one of `n` slot locks is ours, in ticket order; the fd stays open (held) until exit."""
    queue = slots / "queue"
    queue.mkdir(parents=True, exist_ok=True)
    name = ticket or f"{time.time_ns():020d}-{os.getpid()}"
    tmp = queue / f".{name}.tmp"
    tfd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(tfd, fcntl.LOCK_EX)  # locked before it is visible: never taken for a dead waiter's
    os.rename(tmp, queue / name)
    try:
        while _Stop.reason is None:
            if _first_in_line(queue, name):
                fd = _try_slot(slots, n)
                if fd is not None:
                    return fd
            time.sleep(SLOT_POLL_S)
        return None
    finally:
        (queue / name).unlink(missing_ok=True)
        os.close(tfd)


def _first_in_line(queue: Path, name: str) -> bool:
    """True when no live ticket is ahead of ours (dead waiters' tickets are swept on the way)."""
    for other in sorted(p for p in os.listdir(queue) if not p.startswith(".")):
        if other >= name:
            return True
        try:
            fd = os.open(queue / other, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live waiter was first
        else:
            (queue / other).unlink(missing_ok=True)  # its waiter died while queued
        finally:
            os.close(fd)
    return True


def _try_slot(slots: Path, n: int) -> int | None:
    for i in range(n):
        fd = os.open(slots / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return fd
    return None


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def supervise(child: subprocess.Popen[bytes], deadline: float, kill_wait: float) -> tuple[int, str | None]:
    """Wait for the job; enforce the deadline and cancellation. Returns (returncode, stop reason)."""
    stop: str | None = None
    kill_at = float("inf")
    while True:
        try:
            return child.wait(timeout=0.25), stop
        except subprocess.TimeoutExpired:
            pass
        if stop is None:
            if _Stop.reason is not None:
                stop = _Stop.reason
            elif time.time() >= deadline:
                stop = "TIMEOUT"
            if stop is not None:
                _kill_group(child.pid, signal.SIGTERM)
                kill_at = time.time() + kill_wait
        elif time.time() >= kill_at:
            _kill_group(child.pid, signal.SIGKILL)
            kill_at = float("inf")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scheduler._wrap")
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--slots", required=True, type=Path)
    ap.add_argument("--max", type=int, default=1)
    ap.add_argument("--ticket", default=None, help="queue position (sorts by name); default: now")
    ap.add_argument("--time-limit", type=float, required=True)
    ap.add_argument("--kill-wait", type=float, default=5.0)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    job_dir: Path = args.dir

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    write_json(job_dir / WRAPPER_RECORD, {"pid": os.getpid(), "start_ticks": proc_start_ticks(os.getpid())})

    slot_fd = acquire_slot(args.slots, args.max, args.ticket) if args.max > 0 else -1  # -1: a light job, no slot
    if slot_fd is None:  # cancelled while queued
        now = time.time()
        write_json(
            job_dir / "exit.json",
            {
                "state": "CANCELLED",
                "exit_code": None,
                "reason": "cancelled while pending",
                "started_at": None,
                "finished_at": now,
            },
        )
        return 143

    started_at = time.time()
    try:
        with open(job_dir / "stdout", "ab") as out, open(job_dir / "stderr", "ab") as err:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, process_group=0)
    except OSError as e:  # command not found, not executable, ...
        write_json(
            job_dir / "exit.json",
            {
                "state": "FAILED",
                "exit_code": 127,
                "reason": f"could not start: {e}",
                "started_at": started_at,
                "finished_at": time.time(),
            },
        )
        return 127
    # `child` before `started`: whoever sees RUNNING can also find (and force-kill) the job's group
    write_json(job_dir / "child", {"pid": child.pid, "pgid": child.pid})
    write_json(job_dir / "started", {"started_at": started_at, "wrapper_pid": os.getpid()})

    rc, stop = supervise(child, started_at + args.time_limit, args.kill_wait)
    exit_code = rc if rc >= 0 else 128 - rc
    if stop == "TIMEOUT":
        state, reason = "TIMEOUT", f"time limit of {args.time_limit:g} s reached"
    elif stop == "CANCELLED" or (job_dir / "cancel").exists():
        # a forced cancel SIGKILLs the job's group: the wrapper may see that death before its own
        state, reason = "CANCELLED", "cancelled"
    elif rc == 0:
        state, reason = "COMPLETED", None
    else:
        state = "FAILED"
        reason = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
    write_json(
        job_dir / "exit.json",
        {
            "state": state,
            "exit_code": exit_code,
            "reason": reason,
            "started_at": started_at,
            "finished_at": time.time(),
        },
    )
    if slot_fd >= 0:
        os.close(slot_fd)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
