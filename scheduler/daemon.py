"""The scheduler daemon: APScheduler 3 with its jobs persisted in the project database.

    swarm sched daemon                     # foreground; SIGTERM / Ctrl-C stop it cleanly
    python -m scheduler.cli daemon --db sqlite:////abs/path/roost.db --interval 5

What it runs, each as a persistent APScheduler job (table `apscheduler_jobs`, in the
same database as the store, so one backup holds both):

* `scheduler.daemon:reconcile_tick` every `interval_s`: poll all active jobs (one
  batched query per backend), record state changes, and the runaway guard (kill jobs
  past their time budget). On start the daemon reconciles once before anything else:
  that is the restart path (local jobs found again by pid + start time, jobs that
  finished meanwhile recorded from their exit-code files).
* ticks other components register, e.g. the researcher's studies:

      from scheduler.daemon import register_tick
      register_tick("study-12", "researcher.daemon:tick", interval_s=60, kwargs={"study_id": 12})

  Functions are stored as textual references ("module:function"): a persisted job
  must be importable by a later process, and a reference survives code reloads where a
  pickled function would not. Keyword arguments are pickled: keep them to plain data.

One daemon per database: a lock file (flock, released by the kernel even on SIGKILL)
refuses a second one.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.util import ref_to_obj

from scheduler.manager import JobManager
from scheduler.records import StoreSink
from store.db import database_url, get_engine, redact
from store.paths import data_dir
from store.schema import init_db

log = logging.getLogger(__name__)

JOBSTORE_TABLE = "apscheduler_jobs"
RECONCILE_JOB_ID = "roost:reconcile"
TICK_PREFIX = "tick:"
DEFAULT_INTERVAL_S = 5.0

JOB_DEFAULTS: dict[str, Any] = {
    # After downtime (daemon stopped, machine asleep) a periodic job would owe one run
    # per missed interval; coalesce=True folds them into a single catch-up run.
    "coalesce": True,
    # A slow reconcile (Slurm controller hanging) or a slow study tick must not pile up
    # copies of itself: the next run is skipped while one is still going.
    "max_instances": 1,
    # None = a late run still runs, however late. With coalesce that means exactly one
    # run right after a restart, which is what reconciliation and study ticks want:
    # a finite grace shorter than the downtime would silently skip that run and leave
    # job states stale for another whole interval (an hour for hourly ticks).
    "misfire_grace_time": None,
}


@dataclass
class _Runtime:
    manager: JobManager
    db_url: str


_runtime: _Runtime | None = None


def current_manager() -> JobManager:
    """The running daemon's job manager (for tick functions running inside the daemon)."""
    if _runtime is None:
        raise RuntimeError("no scheduler daemon is running in this process")
    return _runtime.manager


def reconcile_tick() -> None:
    """Persistent job body: reconcile every active job (runaway guard included)."""
    changed = current_manager().reconcile()
    if changed:
        log.info("reconciled: %s", ", ".join(f"{r.id}={r.state.value}" for r in changed))


# ---------------------------------------------------------------- the APScheduler instance


class _StoreOnly(BackgroundScheduler):
    """A scheduler that reads and writes the job store and runs nothing, ever.

    Started paused it runs nothing, but APScheduler 3's loop runs `_process_jobs` once more after
    `shutdown()` (the state is then STOPPED, which it does not treat as paused): a due job was handed to
    the executor just shut down, and every `researcher study --background` or daemon restart logged
    "Error submitting job ... cannot schedule new futures after shutdown" with a traceback."""

    def _process_jobs(self) -> None:
        return None


def make_scheduler(db_url: str | None = None, store_only: bool = False) -> BackgroundScheduler:
    """A BackgroundScheduler whose job store is the project database (not started); `store_only`: one
    that only edits the store (`_with_scheduler`), never a job."""
    engine = get_engine(database_url(db_url))
    store = SQLAlchemyJobStore(engine=engine, tablename=JOBSTORE_TABLE)
    cls = _StoreOnly if store_only else BackgroundScheduler
    return cls(jobstores={"default": store}, job_defaults=dict(JOB_DEFAULTS), timezone="UTC")


def _with_scheduler(db_url: str | None, scheduler: BackgroundScheduler | None, fn: Any) -> Any:
    """Run `fn(scheduler)` on the given running scheduler, or on a paused temporary one.

    A scheduler started paused writes to and reads from the job store but runs nothing;
    a running daemon picks the change up at its next wakeup (at most one reconcile
    interval later), since it asks the store for due jobs every time it wakes.
    """
    if scheduler is not None:
        return fn(scheduler)
    temp = make_scheduler(db_url, store_only=True)
    temp.start(paused=True)
    try:
        return fn(temp)
    finally:
        temp.shutdown(wait=False)


def register_tick(
    name: str,
    func_ref: str,
    interval_s: float,
    *,
    kwargs: dict[str, Any] | None = None,
    db_url: str | None = None,
    scheduler: BackgroundScheduler | None = None,
) -> str:
    """Persist a periodic call of `func_ref` ("package.module:function"); returns its job id.

    Re-registering a name replaces it (new interval or arguments). The function must be
    importable by the daemon; that is checked here, at registration, not at 3 a.m.
    """
    if ":" not in func_ref:
        raise ValueError(f"func_ref must look like 'package.module:function', got {func_ref!r}")
    ref_to_obj(func_ref)  # raises LookupError if it cannot be imported
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    job_id = TICK_PREFIX + name
    _with_scheduler(
        db_url,
        scheduler,
        lambda s: s.add_job(
            func_ref, "interval", seconds=interval_s, id=job_id, name=name, kwargs=kwargs or {}, replace_existing=True
        ),
    )
    return job_id


def unregister_tick(name: str, *, db_url: str | None = None, scheduler: BackgroundScheduler | None = None) -> bool:
    """Remove a tick; False if there was none of that name."""

    def _remove(s: BackgroundScheduler) -> bool:
        if s.get_job(TICK_PREFIX + name) is None:
            return False
        s.remove_job(TICK_PREFIX + name)
        return True

    return bool(_with_scheduler(db_url, scheduler, _remove))


def list_ticks(*, db_url: str | None = None) -> list[dict[str, Any]]:
    """Registered ticks: name, function reference, interval, next run."""

    def _list(s: BackgroundScheduler) -> list[dict[str, Any]]:
        return [
            {
                "name": j.name,
                "func": j.func_ref,
                "interval_s": j.trigger.interval.total_seconds(),
                "next_run_time": j.next_run_time,
            }
            for j in s.get_jobs()
            if j.id.startswith(TICK_PREFIX)
        ]

    return list(_with_scheduler(db_url, None, _list))


# ---------------------------------------------------------------- the daemon


class DaemonAlreadyRunning(RuntimeError):
    pass


class Daemon:
    """Reconciliation + registered ticks on a background thread pool."""

    def __init__(
        self, db_url: str | None = None, interval_s: float = DEFAULT_INTERVAL_S, manager: JobManager | None = None
    ) -> None:
        self.db_url = database_url(db_url)
        self.interval_s = interval_s
        self.manager = manager
        self.scheduler: BackgroundScheduler | None = None
        self._lock_fd: int | None = None

    def _take_lock(self) -> None:
        path = lock_path(self.db_url)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise DaemonAlreadyRunning(
                f"a scheduler daemon (pid {other or '?'}) already serves this database; lock {path}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def start(self) -> None:
        global _runtime
        self._take_lock()
        engine = init_db(self.db_url)
        if self.manager is None:
            self.manager = JobManager(StoreSink(engine=engine))
        _runtime = _Runtime(self.manager, self.db_url)
        changed = self.manager.reconcile()  # reattach: before the first interval passes
        log.info("daemon started (db %s); reattached %d change(s)", redact(self.db_url), len(changed))
        self.scheduler = make_scheduler(self.db_url)
        self.scheduler.add_job(
            "scheduler.daemon:reconcile_tick",
            "interval",
            seconds=self.interval_s,
            id=RECONCILE_JOB_ID,
            name="reconcile",
            replace_existing=True,
        )
        self.scheduler.start()

    def stop(self) -> None:
        global _runtime
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        _runtime = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.info("daemon stopped")


def lock_path(db_url: str) -> Path:
    """The lock file of the daemon serving `db_url` on this machine (it holds the daemon's pid)."""
    key = hashlib.sha1(db_url.encode()).hexdigest()[:12]
    return Path(data_dir()) / "scheduler" / f"daemon-{key}.lock"


def running_daemon(db_url: str | None = None) -> int | None:
    """The pid of the daemon serving the database on this machine, None when none runs. Read from its
    lock file without touching the lock (a probe that took it could make a starting daemon fail); a
    pid reused by another process reads as a daemon, which only leaves a warning unsaid."""
    try:
        pid = int(lock_path(database_url(db_url)).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def run_daemon(
    db_url: str | None = None, interval_s: float = DEFAULT_INTERVAL_S, stop_event: threading.Event | None = None
) -> None:
    """Run in the foreground until SIGTERM/SIGINT (or `stop_event`), then stop cleanly."""
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    daemon = Daemon(db_url, interval_s)
    daemon.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        daemon.stop()
