"""A real swarm server on loopback, in a thread: for tests, benchmarks and CI scripts.

    with running_server(ServerConfig(engine="fake", model_dir=d, out_dir=tmp), FakeEngine(d)) as srv:
        SwarmClient(srv.url, srv.token) ...

Production code, not test code: `bench/` and `.ci/` use it outside pytest, so it imports
no test framework and no private client class. It sits on top of the server and
imports it only inside the functions that serve, so `wait_until` and `RunningServer`
load nothing heavy. The server binds its socket before the thread starts (no
free-port race) and is shut down (and joined) on exit, also when the caller fails.
For a server in its own process, see `tests/server/test_checkpoint.py` (started with
Popen, killed by PID). The pytest fixtures built on this live in `tests/kit/`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarm.config.server import ServerConfig
    from swarm.engine.base import Engine
    from swarm.server.state import Swarm


@dataclass
class RunningServer:
    url: str
    token: str
    admin_token: str
    app: Any
    swarm: Swarm
    thread: threading.Thread
    server: Any

    @property
    def engine(self) -> Engine:
        return self.swarm.engine

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


@contextmanager
def running_server(
    config: ServerConfig, engine: Engine, timeout: float = 30.0, port: int = 0
) -> Iterator[RunningServer]:
    """`port` 0 picks a free one; a fixed port lets a test restart a server where clients expect it."""
    import uvicorn  # lazy: only callers that serve need the ASGI server

    from swarm.server.app import create_app  # lazy: FastAPI and the server, only when one is started
    from swarm.server.http_protocol import json_error_protocol  # lazy: subclasses uvicorn's protocols

    config = config.with_secrets()
    app = create_app(config, engine)
    swarm: Swarm = app.state.swarm
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, port))
    sock.listen(256)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", access_log=False, timeout_graceful_shutdown=5, http=json_error_protocol()
        )
    )
    from swarm.server.policy_routes import wire_stop  # lazy: as create_app above

    def stop() -> None:
        server.should_exit = True

    policies = app.state.policies
    wire_stop(list(policies), lambda: list(policies), stop)  # the last policy to stop stops the server
    app.state.stop_server = stop
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    running = RunningServer(
        f"http://{config.host}:{port}", config.token or "", config.admin_token or "", app, swarm, thread, server
    )
    try:
        yield running
    finally:
        running.stop()
        sock.close()


def wait_until(cond: Callable[[], Any], timeout: float = 10.0) -> None:
    """Poll `cond()` every 20 ms until it is true; AssertionError after `timeout` seconds (fails a test)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= end:
            raise AssertionError("timed out")  # not `assert`: still raised under `python -O`
        time.sleep(0.02)


def tiny_model_dir(base: Path) -> Path:
    """A tokenizer + random tiny Qwen2 under `base/tiny-model` (built once per base)."""
    from swarm.model.build import build_untrained  # lazy: building imports torch and transformers

    out = Path(base) / "tiny-model"
    if not (out / "config.json").exists():
        tmp = Path(base) / f".tiny-model-{time.time_ns()}"
        build_untrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():
                raise
    return out
