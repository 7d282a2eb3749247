"""The APScheduler daemon: persistent ticks, and surviving SIGKILL with jobs reattached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sched_helpers import wait_for

from scheduler.daemon import (
    JOB_DEFAULTS,
    RECONCILE_JOB_ID,
    Daemon,
    list_ticks,
    make_scheduler,
    register_tick,
    unregister_tick,
)
from scheduler.records import StoreSink
from store.models import JobState

HERE = Path(__file__).parent


def test_job_defaults_are_deliberate() -> None:
    assert JOB_DEFAULTS == {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}


def test_register_tick_persists_and_validates(db_url: str) -> None:
    with pytest.raises(ValueError):
        register_tick("bad", "no_colon_here", 10, db_url=db_url)
    with pytest.raises((LookupError, ImportError)):
        register_tick("bad", "sched_ticks:does_not_exist", 10, db_url=db_url)
    register_tick("study-1", "sched_ticks:touch", 30, kwargs={"path": "/dev/null"}, db_url=db_url)
    register_tick("study-1", "sched_ticks:touch", 60, kwargs={"path": "/dev/null"}, db_url=db_url)  # replaces
    ticks = list_ticks(db_url=db_url)
    assert [(t["name"], t["func"], t["interval_s"]) for t in ticks] == [("study-1", "sched_ticks:touch", 60.0)]
    assert unregister_tick("study-1", db_url=db_url) and not unregister_tick("study-1", db_url=db_url)
    assert list_ticks(db_url=db_url) == []


def test_editing_the_store_runs_no_due_job(db_url: str, tmp_path: Path, caplog) -> None:
    """The paused scheduler that registers a tick ran `_process_jobs` once more after its shutdown: a due job
    went to the executor just shut down ("Error submitting job ... cannot schedule new futures after shutdown",
    a traceback on every `researcher study --background`), or ran from the CLI's process."""
    import time

    out = tmp_path / "ticks.txt"
    register_tick("due", "sched_ticks:touch", 0.05, kwargs={"path": str(out)}, db_url=db_url)
    time.sleep(0.3)  # due now, with no daemon to run it
    with caplog.at_level("ERROR", logger="apscheduler"):
        for i in range(5):
            register_tick(f"other-{i}", "sched_ticks:touch", 60, kwargs={"path": "/dev/null"}, db_url=db_url)
    assert not [r for r in caplog.records if "Error submitting job" in r.getMessage()], caplog.text
    assert not out.exists()  # only a daemon runs ticks


def test_daemon_runs_registered_ticks_and_reconcile(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "ticks.txt"
    daemon = Daemon(db_url, interval_s=0.2)
    daemon.start()
    try:
        register_tick("t", "sched_ticks:touch", 0.2, kwargs={"path": str(out)}, db_url=db_url)  # from "elsewhere"
        wait_for(lambda: out.exists() and out.read_text().count("tick") >= 2, 10, what="ticks")
        assert daemon.scheduler is not None and daemon.scheduler.get_job(RECONCILE_JOB_ID) is not None
    finally:
        daemon.stop()
    # Persisted: a fresh scheduler on the same database sees both jobs.
    s = make_scheduler(db_url)
    s.start(paused=True)
    try:
        assert {j.id for j in s.get_jobs()} == {RECONCILE_JOB_ID, "tick:t"}
        assert s.get_job(RECONCILE_JOB_ID).func_ref == "scheduler.daemon:reconcile_tick"  # type: ignore[union-attr]
    finally:
        s.shutdown(wait=False)


# ---------------------------------------------------------------- the daemon as a process


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["ROOST_LOCAL_MAX_JOBS"] = "4"
    return env


def _cli(args: list[str], tmp_path: Path, db_url: str) -> subprocess.CompletedProcess[str]:
    cmd, *rest = args  # options before the job's command
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", cmd, "--db", db_url, *rest],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def spawn(tmp_path: Path, db_url: str) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "daemon", "--db", db_url, "--interval", "0.3"],
            env=_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.integration
def test_sigkill_and_restart_reattaches_jobs(spawn: object, tmp_path: Path, db_url: str) -> None:
    sink = StoreSink(db_url)
    daemon = spawn()  # type: ignore[operator]
    # Submitted by another process (the CLI), which exits at once: nobody is their parent.
    # Both jobs wait for a file the test creates, so every step below is deterministic.
    go_quick, go_slow = tmp_path / "go-quick", tmp_path / "go-slow"
    ids = []
    for name, cmd in (
        ("quick", f"until [ -e {go_quick} ]; do sleep 0.05; done; exit 3"),
        ("slow", f"until [ -e {go_slow} ]; do sleep 0.05; done"),
    ):
        res = _cli(["submit", "--log-dir", str(tmp_path / "logs"), name, "bash", "-c", cmd], tmp_path, db_url)
        assert res.returncode == 0, res.stderr
        ids.append(int(res.stdout.strip()))
    quick, slow = ids
    wait_for(
        lambda: all(sink.get(i).state == JobState.RUNNING for i in ids),
        30,  # type: ignore[union-attr]
        what="daemon records both RUNNING",
    )

    daemon.kill()  # type: ignore[attr-defined]
    daemon.wait()  # type: ignore[attr-defined]
    go_quick.touch()
    job_dir = Path(sink.get(quick).stdout_path).parent  # type: ignore[union-attr, arg-type]
    wait_for(lambda: (job_dir / "exit.json").exists(), 15, what="quick job ends while no daemon runs")
    assert sink.get(quick).state == JobState.RUNNING  # type: ignore[union-attr]  # nobody recorded it yet

    restarted = spawn()  # type: ignore[operator]
    wait_for(lambda: sink.get(quick).state == JobState.FAILED, 30, what="finished job recorded")  # type: ignore[union-attr]
    q = sink.get(quick)
    assert q is not None and q.exit_code == 3 and q.finished_at is not None
    assert sink.get(slow).state == JobState.RUNNING  # type: ignore[union-attr]  # reattached, still running
    go_slow.touch()
    wait_for(lambda: sink.get(slow).state == JobState.COMPLETED, 30, what="slow completes")  # type: ignore[union-attr]

    second = _cli(["daemon", "--interval", "1"], tmp_path, db_url)  # one daemon per database
    assert second.returncode == 1 and "already serves this database" in second.stderr

    restarted.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    assert restarted.wait(timeout=15) == 0  # type: ignore[attr-defined]
    assert "daemon stopped" in restarted.stdout.read()  # type: ignore[attr-defined]


@pytest.mark.integration
def test_sigint_stops_cleanly(spawn: object) -> None:
    d = spawn()  # type: ignore[operator]
    # SIGINT once the daemon says it started (its handlers are in by then): a fixed 2 s sleep sent it, on a
    # loaded CI machine, before Python had even imported the daemon, and the default handler exited 130
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(d.stdout.readline, "")), daemon=True)  # type: ignore[attr-defined]
    reader.start()
    wait_for(lambda: any("daemon started" in line for line in lines), 60, what="the daemon's start line")
    d.send_signal(signal.SIGINT)  # type: ignore[attr-defined]
    assert d.wait(timeout=15) == 0, "".join(lines)  # type: ignore[attr-defined]
