"""Local backend specifics: queueing, reattach after a restart, pid-reuse guard, lost supervisors."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from sched_helpers import wait_for

from scheduler.base import JobHandle
from scheduler.local import LocalBackend, proc_start_ticks
from scheduler.spec import JobSpec
from store.models import JobState


def _backend(tmp_path: Path, n: int = 2) -> LocalBackend:
    return LocalBackend(max_concurrent=n, state_dir=tmp_path / "state", kill_wait_s=1.0)


def _spec(tmp_path: Path, name: str, command: list[str], **kw: object) -> JobSpec:
    return JobSpec(name=name, command=command, log_dir=str(tmp_path / "logs"), **kw)  # type: ignore[arg-type]


def _state(b: LocalBackend, h: JobHandle) -> JobState:
    return b.status([h])[h.external_id].state


def test_concurrency_limit_queues_the_rest(tmp_path: Path) -> None:
    b = _backend(tmp_path, n=2)
    hs = [b.submit(_spec(tmp_path, f"q{i}", ["sleep", "1"])) for i in range(3)]
    wait_for(lambda: sum(_state(b, h) == JobState.RUNNING for h in hs) == 2, 10, what="two running")
    assert sum(_state(b, h) == JobState.PENDING for h in hs) == 1
    wait_for(lambda: all(_state(b, h) == JobState.COMPLETED for h in hs), 15, what="all done")


def test_a_light_job_runs_beside_a_full_queue(tmp_path: Path) -> None:
    """A shared-base trial's fleet (`light`) takes no slot: it runs while the slot's holder does."""
    b = _backend(tmp_path, n=1)
    release = tmp_path / "release"
    holder = b.submit(_spec(tmp_path, "holder", ["bash", "-c", f"until [ -e {release} ]; do sleep 0.05; done"]))
    wait_for(lambda: _state(b, holder) == JobState.RUNNING, 10, what="the holder running")
    queued = b.submit(_spec(tmp_path, "queued", ["true"]))
    light = b.submit(_spec(tmp_path, "light", ["true"], light=True))
    wait_for(lambda: _state(b, light) == JobState.COMPLETED, 10, what="the light job done")
    assert _state(b, queued) == JobState.PENDING  # the slot is still the holder's
    release.touch()
    wait_for(lambda: _state(b, queued) == JobState.COMPLETED, 10, what="the queued job done")


def test_queue_is_first_come_first_served(tmp_path: Path) -> None:
    b = _backend(tmp_path, n=1)
    order = tmp_path / "order.txt"
    release = tmp_path / "release"
    # holds the one slot until every other job is queued (a fixed sleep raced slow wrapper starts under load)
    gate = b.submit(_spec(tmp_path, "gate", ["bash", "-c", f"until [ -e {release} ]; do sleep 0.05; done"]))
    # the gate must hold the slot before j0 is submitted: wrappers start asynchronously, and under load
    # j0's could otherwise take the slot first and never be queued
    wait_for(lambda: _state(b, gate) == JobState.RUNNING, 60, what="the gate holding the slot")
    hs = []
    for i in range(5):
        hs.append(b.submit(_spec(tmp_path, f"j{i}", ["bash", "-c", f"echo j{i} >> {order}; sleep 0.1"])))
    hs.append(gate)
    queue = b.slots_dir / "queue"
    waiting = {f"j{i}" for i in range(5)}  # tickets end with the job dir, "<name>-<stamp>-<hex>"

    def queued() -> set[str]:  # the gate's own ticket may still be there under load: count j0..j4 by name
        return {p.name.split("-", 1)[1].split("-", 1)[0] for p in queue.iterdir() if not p.name.startswith(".")}

    wait_for(lambda: queue.is_dir() and waiting <= queued(), 60, what="every job queued behind the gate")
    release.touch()
    wait_for(lambda: all(_state(b, h) == JobState.COMPLETED for h in hs), 30, what="all done")
    assert order.read_text().split() == [f"j{i}" for i in range(5)]
    assert not [p for p in (b.slots_dir / "queue").iterdir()]  # every ticket cleaned up


def test_a_dead_waiters_ticket_is_swept(tmp_path: Path) -> None:
    import fcntl

    from scheduler._wrap import _first_in_line

    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "001-dead").write_text("")  # nobody holds its lock: its waiter died
    live = os.open(queue / "002-live", os.O_RDWR | os.O_CREAT)
    fcntl.flock(live, fcntl.LOCK_EX)
    try:
        assert not _first_in_line(queue, "003-me")  # the live one is ahead
        assert not (queue / "001-dead").exists()
        assert _first_in_line(queue, "002-live")
    finally:
        os.close(live)
    assert _first_in_line(queue, "003-me")  # its waiter is gone now too


def test_reattach_from_a_new_backend_instance(tmp_path: Path) -> None:
    """A restarted scheduler has only the handles: running and finished jobs are found again."""
    first = _backend(tmp_path)
    quick = first.submit(_spec(tmp_path, "quick", ["bash", "-c", "exit 4"]))
    slow = first.submit(_spec(tmp_path, "slow", ["sleep", "2"]))
    wait_for(lambda first=first: _state(first, slow) == JobState.RUNNING, 10, what="slow running")
    del first  # "the scheduler died"
    wait_for(lambda: (Path(quick.stdout_path).parent / "exit.json").exists(), 10, what="quick finished")
    second = _backend(tmp_path)
    st = second.reattach(quick)
    assert (st.state, st.exit_code) == (JobState.FAILED, 4)
    assert second.reattach(slow).state == JobState.RUNNING
    wait_for(lambda: _state(second, slow) == JobState.COMPLETED, 10, what="slow completed")


def test_pid_reuse_is_not_mistaken_for_the_job(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    h = b.submit(_spec(tmp_path, "real", ["sleep", "5"]))
    wait_for(lambda: _state(b, h) == JobState.RUNNING, 10, what="running")
    pid, ticks = h.external_id.split(":")
    impostor = h.model_copy(update={"external_id": f"{pid}:{int(ticks) + 1}"})  # same pid, other start
    st = b.status([impostor])[impostor.external_id]
    assert st.state == JobState.FAILED and "supervisor died" in (st.reason or "")
    b.cancel(h, force=True)


def test_supervisor_killed_hard_is_reported_failed(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    h = b.submit(_spec(tmp_path, "victim", ["sleep", "30"]))
    wait_for(lambda: _state(b, h) == JobState.RUNNING, 10, what="running")
    child = json.loads((Path(h.stdout_path).parent / "child").read_text())
    os.kill(int(h.external_id.split(":")[0]), signal.SIGKILL)
    os.killpg(child["pgid"], signal.SIGKILL)
    st = wait_for(lambda: (s := b.status([h])[h.external_id]).terminal and s, 10, what="failed")
    assert st.state == JobState.FAILED  # type: ignore[union-attr]


def test_cancel_pending_and_force_cancel(tmp_path: Path) -> None:
    b = _backend(tmp_path, n=1)
    running = b.submit(_spec(tmp_path, "hog", ["sleep", "30"]))
    wait_for(lambda: _state(b, running) == JobState.RUNNING, 10, what="hog running")
    queued = b.submit(_spec(tmp_path, "queued", ["true"]))
    time.sleep(0.3)
    assert _state(b, queued) == JobState.PENDING
    b.cancel(queued)
    wait_for(lambda: _state(b, queued) == JobState.CANCELLED, 10, what="queued cancelled")
    assert b.status([queued])[queued.external_id].started_at is None
    t0 = time.monotonic()
    b.cancel(running, force=True)
    assert _state(b, running) == JobState.CANCELLED
    assert time.monotonic() - t0 < 3
    child = json.loads((Path(running.stdout_path).parent / "child").read_text())
    assert proc_start_ticks(child["pid"]) is None  # the job's process group is gone too


def test_a_forced_cancel_the_wrapper_outlives_is_recorded_cancelled(tmp_path: Path) -> None:
    """`cancel --force` kills the job's group, then the wrapper: a wrapper that sees its job die in
    between must record CANCELLED (the marker came first), not the SIGKILL as a FAILED job."""
    b = _backend(tmp_path)
    h = b.submit(_spec(tmp_path, "victim", ["sleep", "30"]))
    wait_for(lambda: _state(b, h) == JobState.RUNNING, 10, what="running")
    job_dir = Path(h.stdout_path).parent
    (job_dir / "cancel").touch()  # what cancel() writes first
    os.killpg(json.loads((job_dir / "child").read_text())["pgid"], signal.SIGKILL)  # ... and kills, wrapper last
    st = wait_for(lambda: (s := b.status([h])[h.external_id]).terminal and s, 10, what="recorded")
    assert st.state == JobState.CANCELLED and (job_dir / "exit.json").exists(), st  # type: ignore[union-attr]


def test_time_limit_kills_whole_process_group(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    h = b.submit(
        _spec(
            tmp_path,
            "tree",
            ["bash", "-c", "sleep 60 & sleep 60 & echo $! > pids; wait"],
            time_limit_s=1,
            cwd=str(tmp_path),
        )
    )
    st = wait_for(lambda: (s := b.status([h])[h.external_id]).terminal and s, 15, what="timeout")
    assert st.state == JobState.TIMEOUT  # type: ignore[union-attr]
    grandchild = int((tmp_path / "pids").read_text())
    wait_for(lambda: proc_start_ticks(grandchild) is None, 5, what="grandchild gone")


def test_setup_lines_and_missing_command(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    ok = b.submit(_spec(tmp_path, "setup", ["bash", "-c", 'echo "x=$FROM_SETUP"'], setup=["export FROM_SETUP=42"]))
    bad = b.submit(_spec(tmp_path, "missing", ["/nonexistent/binary"]))
    wait_for(lambda: all(s.terminal for s in b.status([ok, bad]).values()), 15, what="both done")
    assert "x=42" in b.logs(ok)
    st = b.status([bad])[bad.external_id]
    assert (st.state, st.exit_code) == (JobState.FAILED, 127)


def test_logs_tail(tmp_path: Path) -> None:
    b = _backend(tmp_path)
    h = b.submit(_spec(tmp_path, "chatty", ["python3", "-c", "print('a' * 100 + 'END')"]))
    wait_for(lambda: _state(b, h) == JobState.COMPLETED, 10, what="done")
    assert b.logs(h, tail_bytes=4) == "END\n"


@pytest.mark.parametrize("bad", ["", "has space", "-dash", "x" * 101])
def test_spec_rejects_bad_names(bad: str) -> None:
    with pytest.raises(ValueError):
        JobSpec(name=bad, command=["true"])


def test_spec_requires_command_and_valid_env() -> None:
    with pytest.raises(ValueError):
        JobSpec(name="x", command=[])
    with pytest.raises(ValueError):
        JobSpec(name="x", command=["true"], env={"1BAD": "v"})
    assert JobSpec(name="x", command=["true"]).time_limit_s == 3600
