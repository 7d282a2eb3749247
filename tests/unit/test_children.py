"""`swarm.children.stop`: a child and everything it started end, by process group, never by name;
`signals_interrupt`, by which a driver stops them on SIGTERM and SIGHUP; and `wait_announced`, by
which it learns the port a server bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import gone_within, running

from swarm.children import signals_interrupt, stop, sweep_group, wait_announced


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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signals_interrupt_turns_sigterm_and_sighup_into_ctrl_c_and_restores_them(sig: signal.Signals) -> None:
    """What `swarm train`, `swarm client` and a foreground `researcher study` stop by: a KeyboardInterrupt
    inside (their `finally` stops children and says how to go on), the previous handlers after."""
    outer = signal.signal(sig, signal.SIG_DFL)  # as from a terminal, also under nohup (SIGHUP ignored)
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_interrupt():
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises as soon as the signal is taken
        assert signal.getsignal(sig) is signal.SIG_DFL
    finally:
        signal.signal(sig, outer)


def test_an_ignored_sighup_stays_ignored() -> None:
    """Under `nohup` the user asked for hangups to be ignored: the context leaves SIGHUP alone."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with signals_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGHUP, previous)


def _announcer(server_file: Path, log: Path, delay: float, code: int | None = None) -> subprocess.Popen:
    """A stand-in server: after `delay` s it writes its own URL and pid to `server_file` (half first, as a
    reader may see a file being written), or, given `code`, exits with it instead."""
    script = f"import json, os, sys, time; time.sleep({delay}); p = {str(server_file)!r}\n" + (
        f"print('bind failed'); sys.exit({code})"
        if code is not None
        else "t = json.dumps({'url': 'http://127.0.0.1:4321', 'pid': os.getpid()})\n"
        "open(p, 'w').write(t[:9]); time.sleep(0.3); open(p, 'w').write(t); time.sleep(60)"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=log.open("w"), stderr=subprocess.STDOUT)


def test_wait_announced_waits_past_an_earlier_servers_file_and_a_half_written_one(tmp_path: Path) -> None:
    server_file, log = tmp_path / "server.json", tmp_path / "server.log"
    server_file.write_text(json.dumps({"url": "http://127.0.0.1:1111", "pid": 1}))  # the last run's server
    proc = _announcer(server_file, log, delay=0.3)
    try:
        assert wait_announced(server_file, proc, log, timeout=30) == "http://127.0.0.1:4321"
    finally:
        proc.kill()
        proc.wait()


def test_wait_announced_says_when_the_server_died_first_and_shows_its_log(tmp_path: Path) -> None:
    server_file, log = tmp_path / "server.json", tmp_path / "server.log"
    proc = _announcer(server_file, log, delay=0.1, code=3)
    with pytest.raises(RuntimeError, match=r"server exited with code 3; see .*server\.log:\n(.|\n)*bind failed"):
        wait_announced(server_file, proc, log, timeout=30)


def test_wait_announced_gives_up_after_its_timeout(tmp_path: Path) -> None:
    server_file, log = tmp_path / "server.json", tmp_path / "server.log"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(TimeoutError, match="did not say which port it bound in 1s"):
            wait_announced(server_file, proc, log, timeout=1)
    finally:
        proc.kill()
        proc.wait()
