"""`swarm.children.stop`: a child and everything it started end, by process group, never by name."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from procs import gone_within, running

from swarm.children import stop, sweep_group


def _spawn(tmp_path: Path, script: str) -> tuple[subprocess.Popen, int]:
    """A child in its own session whose grandchild writes its PID to a file and sleeps."""
    pidfile = tmp_path / "grandchild.pid"
    proc = subprocess.Popen(["bash", "-c", script.replace("PIDFILE", str(pidfile))], start_new_session=True)
    end = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < end, "the grandchild never started"
        time.sleep(0.02)
    return proc, int(pidfile.read_text())


def test_a_grandchild_that_ignores_sigterm_goes_with_its_parent(tmp_path: Path) -> None:
    """The child exits at SIGTERM at once; its grandchild ignores SIGTERM and would live on, an
    orphan holding the group, without the SIGKILL that follows the child's exit."""
    proc, grandchild = _spawn(tmp_path, "bash -c 'trap \"\" TERM; echo $$ > PIDFILE; exec sleep 60' & wait")
    try:
        t0 = time.monotonic()
        stop(proc, grace=10.0)
        assert proc.returncode is not None
        assert time.monotonic() - t0 < 5.0  # it did not wait out the grace: the child had exited
        assert gone_within(grandchild, 5.0), "the grandchild outlived stop()"
    finally:
        if running(grandchild):
            os.kill(grandchild, 9)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    proc, grandchild = _spawn(tmp_path, 'trap "" TERM; echo $$ > PIDFILE; while true; do sleep 0.1; done')
    assert grandchild == proc.pid  # here the child itself writes the file
    t0 = time.monotonic()
    stop(proc, grace=0.5)
    assert proc.returncode == -9 and 0.5 <= time.monotonic() - t0 < 5.0


def test_a_child_reaped_before_is_left_alone(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    stop(proc)  # its group is empty: nothing to signal
    assert proc.returncode == 0


def test_what_a_killed_child_left_in_its_group_goes_at_stop(tmp_path: Path) -> None:
    """As vLLM's launcher SIGKILLed: the child dies at once, a watchdog's poll() reaps it, and its
    grandchild (vLLM's engine core) lives on in the group, an orphan. `stop` on the dead child ends it."""
    proc, grandchild = _spawn(tmp_path, "bash -c 'echo $$ > PIDFILE; exec sleep 60' & wait")
    try:
        os.kill(proc.pid, 9)
        proc.wait(5)
        assert proc.poll() == -9 and running(grandchild)  # an orphan now, still in the dead child's group
        assert os.getpgid(grandchild) == proc.pid
        stop(proc)
        assert gone_within(grandchild, 5.0), "the orphan outlived stop()"
    finally:
        if running(grandchild):
            os.kill(grandchild, 9)


def test_a_number_taken_again_is_not_swept(tmp_path: Path) -> None:
    """Once a dead child's group is empty its number is free; a live process holding it now (here: a
    new group leader given the number by hand) is not the child's, and `sweep_group` leaves it alone."""
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        sweep_group(other.pid)  # as if `other` had the number of a child reaped earlier
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
