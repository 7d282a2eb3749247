"""Keep one HTTP server child process alive: start it, check its health, watch it, restart it.

vLLM dies sometimes (a crash, a kill, OOM, and a failed in-place reload leaves it
unusable), and the swarm server must go on serving. `ServerProcess` is one child
server on loopback, started in a session of its own (so stopping it kills its whole
group: vLLM forks an engine-core process) and counted as started once `/health`
answers. `Supervisor` keeps one running: a watchdog thread, or the next request or
weight sync that finds it gone, restarts it (holding the drain gate, so no request
is sent meanwhile), and `on_start` runs after every start (the engine relabels the
served weights' version there). Neither knows what the server is: server.py says how
to run vLLM, and the tests supervise a small Python server the same way.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from swarm import children
from swarm.engine.vllm.errors import ServerStartError
from swarm.engine.vllm.gate import DrainGate
from swarm.tls import tls_context

log = logging.getLogger("swarm.engine.vllm")


def control_client() -> httpx.Client:
    """One client for a server's control calls (health, the publisher's routes), kept for its lifetime.

    `httpx.get`/`httpx.post` build a client per call, and with it a TLS context (the CA bundle
    loaded: ~25 ms, 10 % of a full sync's trainer side, docs/scale.md) that plain-HTTP loopback never
    uses; this one takes the process's (swarm/tls.py). Thread-safe. Idle connections are dropped after
    1 s, before the server's keep-alive timeout (uvicorn's 5 s) can close one under a request being
    sent on it."""
    return httpx.Client(timeout=120, limits=httpx.Limits(keepalive_expiry=1.0), verify=tls_context())


#: how a child that could not bind its port says so (Python's `OSError` for EADDRINUSE, vLLM's and uvicorn's)
PORT_TAKEN = "Address already in use"
#: starts of a child whose port was taken under it before the error is the caller's
PORT_TRIES = 3
#: the line each start writes to the log before its child's output (then the start's number and command)
START_MARKER = "\n==== start "


class ServerProcess:
    """One child HTTP server on 127.0.0.1 (`command()` started with `env()`); restartable.

    `port` 0 picks a free port, and a new one on each restart (the dead server's may
    linger in TIME_WAIT), so read `url` each time.
    """

    label = "server"

    def __init__(self, log_path: Path, *, port: int = 0, start_timeout_s: float = 300.0) -> None:
        self.log_path = Path(log_path)
        self.fixed_port = port
        self.port = port or children.free_port()
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._http: httpx.Client | None = None  # the health checks' (`control_client`), made on first use
        self._http_lock = threading.Lock()

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout_s: float = 10.0) -> bool:
        """Running, and `/health` answers 200."""
        if not self.alive():
            return False
        with self._http_lock:
            if self._http is None:
                self._http = control_client()
            http = self._http
        try:
            return http.get(self.url + "/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def close_client(self) -> None:
        """Close the health checks' client (a later check makes a new one)."""
        with self._http_lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()

    def start(self) -> None:
        """Start and wait until `/health` answers; `ServerStartError` (with the log's tail) otherwise.

        The port is found free before the child binds it (vLLM takes no port 0 and says which it bound),
        so another process can take it meanwhile, on a busy machine an outgoing connection's ephemeral
        port: a child that dies of "Address already in use" is started again on another port (a fixed
        `port` is the user's, and the error is theirs)."""
        for attempt in range(1, PORT_TRIES + 1):
            try:
                self._start_once()
                return
            except ServerStartError as exc:
                if self.fixed_port or attempt == PORT_TRIES or PORT_TAKEN not in self.this_start_log():
                    raise
                log.warning("%s: port %s was taken before it bound it: another port (%s)", self.label, self.port, exc)
                self.stop()  # what the dead child started goes (vLLM's engine core); the next start picks a port

    def _start_once(self) -> None:
        if self.alive():
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.starts and not self.fixed_port:
            self.port = children.free_port()  # the dead server's port may linger in TIME_WAIT
        with open(self.log_path, "ab") as out:
            out.write(f"{START_MARKER}{self.starts + 1}: {' '.join(self.command())}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.command(),
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.starts += 1
        log.info("%s starting on %s (pid %s; its log: %s)", self.label, self.url, self.pid, self.log_path)
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerStartError(
                    f"{self.label} exited with {self.proc.returncode} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self.healthy(timeout_s=2.0):
                log.info("%s pid %s healthy on %s after %.1fs", self.label, self.pid, self.url, time.monotonic() - t0)
                return
            time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"{self.label} not healthy after {self.start_timeout_s:.0f}s; log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group (our own session: the server and its children), SIGKILL what is
        left after `grace_s`, and what outlives the server."""
        proc, self.proc = self.proc, None
        if proc is not None:
            children.stop(proc, grace_s)

    def this_start_log(self) -> str:
        """What the last start wrote to the log (after its marker line): an earlier start's lines, such as
        its own "Address already in use", say nothing about this one."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[text.rfind(START_MARKER) :] if START_MARKER in text else text

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Supervisor:
    """Keeps `process` serving: health, restart on death (watchdog or on demand), `restarts` counted.

    `lock` serialises the exclusive work on the server (a restart, a weight sync); it is
    re-entrant so that a sync that fails can restart under it.
    """

    def __init__(
        self,
        process: ServerProcess,
        gate: DrainGate,
        *,
        on_start: Callable[[], None] = lambda: None,
        watch_s: float = 2.0,
    ) -> None:
        self.process = process
        self.gate = gate
        self.on_start = on_start
        self.watch_s = watch_s
        self.lock = threading.RLock()
        self.restarts = 0
        #: a restart is under way (a router sends no new request here meanwhile: swarm/engine/vllm/replicas.py)
        self.restarting = False
        self._closing = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def alive(self) -> bool:
        return self.process.alive()

    def healthy(self) -> bool:
        return self.process.healthy()

    def start(self) -> None:
        """Start the process, run `on_start`, and watch it from then on."""
        with self.lock:
            self.process.start()
            self.on_start()
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name=f"roost-{self.process.label}-watchdog", daemon=True
            )
            self._watchdog.start()

    def recover(self, reason: str) -> None:
        """Restart the process unless it is healthy (another thread already did) or closing."""
        if self.closing:
            return
        with self.lock:
            if self.closing or self.healthy():
                return
            self.gate.hold()
            try:
                self.restart(reason)
            finally:
                self.gate.reopen()

    def restart(self, reason: str) -> None:
        """Stop and start the process now, then `on_start` (the caller holds the gate)."""
        with self.lock:
            self.restarts += 1
            self.restarting = True
            try:
                log.warning("restarting %s (%s)", self.process.label, reason)
                self.process.stop()
                self.process.start()
                self.on_start()
            finally:
                self.restarting = False

    def _watch(self) -> None:
        while not self._closing.wait(self.watch_s):
            if not self.process.alive() and not self.closing:
                try:
                    self.recover(f"process exited with {self.process.proc and self.process.proc.poll()}")
                except Exception:  # noqa: BLE001 - the watchdog must live on; the next request retries
                    log.exception("restarting %s failed", self.process.label)

    def close(self) -> None:
        """Stop watching and stop the process (after any sync or restart under way)."""
        self._closing.set()
        with self.lock:
            self.process.stop()
            self.process.close_client()
