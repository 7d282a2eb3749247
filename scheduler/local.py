"""Local backend: jobs as detached processes on this machine.

Each job is `python -m scheduler._wrap ... -- CMD` started in its own session
(`start_new_session=True`), so it survives the scheduler being killed. The wrapper
queues on slot locks (concurrency limit; PENDING until a slot frees), enforces the time
limit (SIGTERM, then SIGKILL to the job's process group → TIMEOUT) and writes the exit
code to a file. Everything lives in one directory per job:

    <log_dir>/<name>-<stamp>-<token>/
        stdout, stderr     the job's output
        started            JSON: when the job got a slot and started
        child              JSON: pid/pgid of the job's process group
        spec.json          the submitted spec (mode 600: env may hold tokens)
        wrapper.json       the wrapper's pid and start time, written first thing by the wrapper
        handle.json        the JobHandle, written by `submit` once the wrapper started
        exit.json          JSON: state, exit code, reason, times (written last)
        cancel             marker: a cancel was requested

The handle's `external_id` is "PID:START_TICKS" of the wrapper: the start time (field
22 of /proc/PID/stat) tells a live wrapper from an unrelated process that was given
the same pid after a reboot or pid wrap-around. So a scheduler restarted after a crash
needs only the handle to tell RUNNING (wrapper alive), PENDING (alive, no slot yet) and
finished (exit.json, also when the job ended while no scheduler was running). A
submitter that died before recording the handle gets it back from `find(spec)`, which
reads handle.json, or wrapper.json if it died even before writing that.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler._wrap import WRAPPER_RECORD, proc_start_ticks
from scheduler.base import BackendError, JobHandle, JobStatus, Stream, read_log
from scheduler.spec import ENV_JOB_ID, JobSpec
from store.models import JobState
from store.paths import data_dir

ENV_MAX_JOBS = "ROOST_LOCAL_MAX_JOBS"
# A job directory with neither handle.json nor the wrapper's record is younger than this:
# its wrapper may still be starting, so `find` waits for it before saying "never started".
WRAPPER_START_GRACE_S = 10.0


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _submitted_env(job_dir: Path) -> dict[str, str]:
    spec = _read_json(job_dir / "spec.json") or {}
    env = spec.get("env")
    return env if isinstance(env, dict) else {}


class LocalBackend:
    """Run jobs as local processes, at most `max_concurrent` at once (the rest PENDING)."""

    name = "local"

    def __init__(
        self,
        max_concurrent: int | None = None,
        state_dir: Path | None = None,
        kill_wait_s: float = 5.0,
        python: str = sys.executable,
    ) -> None:
        if max_concurrent is None:
            max_concurrent = int(os.environ.get(ENV_MAX_JOBS) or os.cpu_count() or 1)
        self.max_concurrent = max(1, max_concurrent)
        if state_dir is None:
            state_dir = data_dir() / "scheduler" / "local"
        self.slots_dir = Path(state_dir) / "slots"
        self.kill_wait_s = kill_wait_s
        self.python = python
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # ours to reap

    # ---------------------------------------------------------------- submit
    def submit(self, spec: JobSpec) -> JobHandle:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        job_dir = spec.resolved_log_dir() / f"{spec.name}-{stamp}-{secrets.token_hex(3)}"
        job_dir.mkdir(parents=True, exist_ok=False)
        spec_file = job_dir / "spec.json"
        spec_file.touch(mode=0o600)  # the environment may hold tokens
        spec_file.write_text(spec.model_dump_json(indent=1))
        command = list(spec.command)
        if spec.setup:  # setup lines run in bash, then the command replaces the shell
            script = "set -e\n" + "\n".join(spec.setup) + '\nexec "$@"\n'
            command = ["bash", "-c", script, spec.name, *command]
        argv = [
            self.python,
            "-m",
            "scheduler._wrap",
            "--dir",
            str(job_dir),
            "--slots",
            str(self.slots_dir),
            "--max",
            str(0 if spec.light else self.max_concurrent),
            "--ticket",
            f"{time.time_ns():020d}-{job_dir.name}",  # queue order: submission order
            "--time-limit",
            str(spec.time_limit_s),
            "--kill-wait",
            str(self.kill_wait_s),
            "--",
            *command,
        ]
        env = {**os.environ, **spec.env}
        try:
            with open(job_dir / "wrapper.log", "ab") as wlog:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=wlog,
                    stderr=wlog,
                    cwd=spec.cwd,
                    env=env,
                    start_new_session=True,
                )
        except OSError as e:
            raise BackendError(f"could not start local job {spec.name!r}: {e}") from e
        ticks = proc_start_ticks(proc.pid)  # our unreaped child: the pid cannot be reused yet
        self._children[proc.pid] = proc
        handle = JobHandle(
            backend=self.name,
            external_id=f"{proc.pid}:{ticks}",
            name=spec.name,
            stdout_path=str(job_dir / "stdout"),
            stderr_path=str(job_dir / "stderr"),
        )
        # Lets a submitter that crashed before recording the handle find it again.
        (job_dir / "handle.json").write_text(handle.model_dump_json())
        return handle

    # ---------------------------------------------------------------- find
    def find(self, spec: JobSpec) -> JobHandle | None:
        """The newest job directory of this spec that a wrapper was started for."""
        key = spec.env.get(ENV_JOB_ID)
        mine = re.compile(re.escape(spec.name) + r"-\d{8}-\d{6}-[0-9a-f]{6}")  # as `submit` names them
        dirs = sorted(
            (d for d in spec.resolved_log_dir().glob(f"{spec.name}-*") if d.is_dir() and mine.fullmatch(d.name)),
            reverse=True,
        )
        for job_dir in dirs:
            if key is not None and _submitted_env(job_dir).get(ENV_JOB_ID) != key:
                continue
            return self._handle_in(job_dir, spec.name)
        return None

    def _handle_in(self, job_dir: Path, name: str) -> JobHandle | None:
        deadline = time.monotonic() + WRAPPER_START_GRACE_S - (time.time() - job_dir.stat().st_mtime)
        while True:
            saved = _read_json(job_dir / "handle.json")
            if saved is not None:
                return JobHandle.model_validate(saved)
            wrapper = _read_json(job_dir / WRAPPER_RECORD)
            if wrapper is not None:
                return JobHandle(
                    backend=self.name,
                    external_id=f"{wrapper['pid']}:{wrapper['start_ticks']}",
                    name=name,
                    stdout_path=str(job_dir / "stdout"),
                    stderr_path=str(job_dir / "stderr"),
                )
            if time.monotonic() >= deadline:
                return None  # the submitter died before the wrapper was started
            time.sleep(0.05)

    # ---------------------------------------------------------------- status
    def status(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        self._reap()
        return {h.external_id: self._status_one(h) for h in handles}

    def reattach(self, handle: JobHandle) -> JobStatus:
        """Nothing to re-connect: the job directory and the pid are the whole state."""
        return self._status_one(handle)

    def _status_one(self, h: JobHandle) -> JobStatus:
        job_dir = Path(h.stdout_path).parent
        done = self._finished(job_dir)
        if done is not None:
            return done
        started = _read_json(job_dir / "started")
        if self._alive(h):
            if started is None:
                return JobStatus(state=JobState.PENDING)
            return JobStatus(state=JobState.RUNNING, started_at=_ts(started["started_at"]))
        done = self._finished(job_dir)  # it may have finished between the two looks
        if done is not None:
            return done
        started_at = _ts(started["started_at"]) if started else None
        if (job_dir / "cancel").exists():
            return JobStatus(
                state=JobState.CANCELLED,
                reason="cancelled (killed)",
                started_at=started_at,
                finished_at=_ts(time.time()),
            )
        return JobStatus(
            state=JobState.FAILED,
            started_at=started_at,
            reason="the job's supervisor died without recording an exit code "
            "(killed with SIGKILL, or the machine rebooted)",
        )

    @staticmethod
    def _finished(job_dir: Path) -> JobStatus | None:
        rec = _read_json(job_dir / "exit.json")
        if rec is None:
            return None
        return JobStatus(
            state=JobState(rec["state"]),
            exit_code=rec.get("exit_code"),
            reason=rec.get("reason"),
            started_at=_ts(rec.get("started_at")),
            finished_at=_ts(rec.get("finished_at")),
        )

    @staticmethod
    def _pid(h: JobHandle) -> tuple[int, int | None]:
        pid, _, ticks = h.external_id.partition(":")
        return int(pid), (int(ticks) if ticks not in ("", "None") else None)

    def _alive(self, h: JobHandle) -> bool:
        pid, ticks = self._pid(h)
        now = proc_start_ticks(pid)
        return now is not None and (ticks is None or now == ticks)

    def _reap(self) -> None:
        """Collect our finished wrappers so they do not linger as zombies."""
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]

    # ---------------------------------------------------------------- cancel, logs
    def cancel(self, handle: JobHandle, force: bool = False) -> None:
        """SIGTERM the wrapper (it stops the job, SIGKILL after kill_wait, records CANCELLED).

        `force`: SIGKILL the job's process group and the wrapper now, and return once both are
        gone (up to 2 s: a killed process exits when the kernel next runs it, which on a loaded
        machine is not at once); the status then reads CANCELLED from the `cancel` marker written first.
        """
        job_dir = Path(handle.stdout_path).parent
        if (job_dir / "exit.json").exists():
            return
        (job_dir / "cancel").touch()
        if not self._alive(handle):
            return
        pid, _ = self._pid(handle)
        child = _read_json(job_dir / "child") if force else None
        if child:
            try:
                os.killpg(child["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)
        except ProcessLookupError:
            pass
        if force:
            self._wait_gone(handle, 2.0, child_pid=child["pid"] if child else None)

    def _wait_gone(self, handle: JobHandle, timeout: float, child_pid: int | None = None) -> None:
        """Until the wrapper (and the job's group leader `child_pid`) are gone, or `timeout` passed."""
        end = time.monotonic() + timeout

        def alive() -> bool:
            return self._alive(handle) or (child_pid is not None and proc_start_ticks(child_pid) is not None)

        while alive() and time.monotonic() < end:
            self._reap()
            time.sleep(0.02)

    def logs(self, handle: JobHandle, stream: Stream = "stdout", tail_bytes: int | None = None) -> str:
        return read_log(handle.stdout_path if stream == "stdout" else handle.stderr_path, tail_bytes)
