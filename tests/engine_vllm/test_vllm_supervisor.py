"""The vllm engine's process supervisor alone, over a small real child server instead of vLLM.

The child is a Python script serving `/health` on loopback (with its pid, and the pid of
a child of its own, so a test can check that stopping kills the whole group). Killing it
by PID must bring a new one up, through the watchdog or an explicit `recover`, with the
drain gate held meanwhile and `on_start` run after every start.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
from procs import running

from swarm.engine.vllm.errors import ServerStartError
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.supervisor import ServerProcess, Supervisor

HEALTH_SERVER = """
import json, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

delay, port = float(sys.argv[1]), int(sys.argv[2])
if delay < 0:
    sys.exit("refusing to start")
time.sleep(delay)
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # in our process group


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"pid": __import__("os").getpid(), "child": sleeper.pid}).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


print("serving on", port, flush=True)
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


class HealthServer(ServerProcess):
    """The script above as a supervised server; `delay` seconds before it listens (< 0: it exits at once)."""

    label = "health-server"

    def __init__(self, tmp_path: Path, delay: float = 0.0, start_timeout_s: float = 30.0) -> None:
        super().__init__(tmp_path / "server.log", start_timeout_s=start_timeout_s)
        self.script = tmp_path / "health_server.py"
        self.script.write_text(HEALTH_SERVER)
        self.delay = delay

    def command(self) -> list[str]:
        return [sys.executable, str(self.script), str(self.delay), str(self.port)]


def _wait(condition, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.fixture
def started(tmp_path):
    """A supervised health server, started; its watchdog looks every 0.1 s. Closed after the test."""
    gate = DrainGate()
    starts: list[tuple[int | None, bool]] = []  # (pid, gate held) at each on_start
    sup = Supervisor(HealthServer(tmp_path), gate, watch_s=0.1)
    sup.on_start = lambda: starts.append((sup.process.pid, gate.draining))
    sup.start()
    yield sup, starts
    sup.close()


def test_the_watchdog_restarts_a_server_killed_by_pid(started):
    sup, starts = started
    assert sup.healthy() and starts == [(sup.process.pid, False)]
    first, url = sup.process.pid, sup.url
    os.kill(first, signal.SIGKILL)
    _wait(lambda: sup.restarts == 1 and sup.healthy() and not sup.gate.draining)
    second = sup.process.pid
    assert second != first and starts == [(first, False), (second, True)]  # restarted with the gate held
    assert httpx.get(sup.url + "/health").json()["pid"] == second
    assert sup.url != url  # port 0: a fresh port (the dead server's may linger in TIME_WAIT)


def test_recover_restarts_only_a_dead_server_and_close_kills_the_group(started):
    sup, starts = started
    sup.watch_s = 3600.0  # once its current 0.1 s look ends, the watchdog sleeps past this test:
    time.sleep(0.3)  # `recover` on demand alone restarts below
    sup.recover("a request found it dead")
    assert sup.restarts == 0 and len(starts) == 1  # healthy: nothing to do
    health = httpx.get(sup.url + "/health").json()
    os.killpg(sup.process.pid, signal.SIGKILL)
    _wait(lambda: not sup.alive())
    sup.recover("a request found it dead")
    assert sup.restarts == 1 and sup.healthy() and not sup.gate.draining and starts[-1][1]
    assert not running(health["pid"]) and not running(health["child"])
    health = httpx.get(sup.url + "/health").json()
    sup.close()
    assert not sup.alive() and not running(health["pid"])
    _wait(lambda: not running(health["child"]))  # the group went with it
    sup.recover("after close")
    assert sup.restarts == 1


def test_a_server_that_exits_or_stays_unhealthy_is_a_start_error(tmp_path):
    with pytest.raises(ServerStartError, match="exited with 1 while starting(.|\n)*refusing to start"):
        HealthServer(tmp_path, delay=-1).start()
    slow = HealthServer(tmp_path, delay=60, start_timeout_s=1.0)
    with pytest.raises(ServerStartError, match="not healthy after 1s"):
        slow.start()
    assert slow.proc is None  # stopped, not left behind


def test_a_port_taken_before_the_child_binds_it_is_traded_for_another(tmp_path):
    """The port is found free before the child binds it (vLLM says no port it bound); a process that takes
    it meanwhile costs a start, not the server. A port the user fixed is theirs: the error is said."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = HealthServer(tmp_path)
        server.port = port  # as if another process took the port `free_port` found
        try:
            server.start()
            assert server.healthy() and server.port != port and server.starts == 2
            assert "Address already in use" in server.log_path.read_text()
        finally:
            server.stop()
        (tmp_path / "fixed").mkdir()
        fixed = HealthServer(tmp_path / "fixed")
        fixed.fixed_port = fixed.port = port
        with pytest.raises(ServerStartError, match="Address already in use"):
            fixed.start()
        assert fixed.starts == 1


def test_an_earlier_starts_taken_port_does_not_retry_another_failure(tmp_path):
    """The log is appended to across starts: an earlier start's "Address already in use" still in its last
    lines must not make a server that fails for another reason start again on another port."""
    crashing = HealthServer(tmp_path, delay=-1)  # exits at once, not for its port
    crashing.log_path.write_text("==== start 1: an earlier server\nOSError: [Errno 98] Address already in use\n")
    with pytest.raises(ServerStartError, match="exited"):
        crashing.start()
    assert crashing.starts == 1
    assert "Address already in use" not in crashing.this_start_log()
