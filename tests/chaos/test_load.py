"""Load: 64 clients, 64 concurrent episodes, through a real `swarm serve` process on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from http_wait import wait_answering  # tests/kit, on sys.path

from swarm.children import free_port
from swarm.client import SwarmClient

SERVE = "import typer; from swarm.server.cli import serve_command; typer.run(serve_command)"
CLIENTS = 64
ROUNDS = 2


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(180)
def test_64_concurrent_clients(tmp_path: Path, model_dir: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        "--engine",
        "fake",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--out",
        str(tmp_path / "out"),
        "--group-size",
        "8",
        "--batch-groups",
        "8",
        "--checkpoint-every",
        "0",
        "--token",
        "tok",
        "--admin-token",
        "adm",
        "--log-level",
        "warning",
        "--max-tokens",
        "16",
    ]
    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE, *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    try:
        wait_answering(f"{url}/health", server, log)
        # 64 slots per window (8 tasks x 8): every client holds an episode at the same time
        barrier = threading.Barrier(CLIENTS)
        errors: list[str] = []
        finished: list[str] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            with SwarmClient(url, "tok", timeout=60) as client:
                for r in range(ROUNDS):
                    try:
                        with client.episode(f"task-{r}-{i // 8}") as ep:
                            barrier.wait(60) if r == 0 else None  # all 64 open at once
                            for turn in range(2):
                                ep.openai.chat.completions.create(
                                    model=ep.model,
                                    max_tokens=16,
                                    messages=[{"role": "user", "content": f"client {i} turn {turn}"}],
                                )
                            ep.finish(float(i % 2))
                        with lock:
                            finished.append(ep.id)
                    except Exception as exc:  # collected: the assertion below shows them
                        with lock:
                            errors.append(f"client {i} round {r}: {type(exc).__name__}: {exc}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.monotonic() - t0
        assert not errors, errors[:5]
        assert len(set(finished)) == CLIENTS * ROUNDS
        status = {}
        while time.monotonic() - t0 < 120:
            status = httpx.get(f"{url}/swarm/v1/status", headers={"Authorization": "Bearer tok"}).json()
            if status["step"] == ROUNDS:
                break
            time.sleep(0.1)
        c = status["counters"]
        assert status["step"] == ROUNDS and c["finished"] == CLIENTS * ROUNDS
        assert c.get("http_5xx", 0) == 0 and c.get("expired", 0) == 0
        assert c["buffer_trained"] == CLIENTS * ROUNDS
        print(
            f"\nLOAD {CLIENTS} clients x {ROUNDS} rounds: {elapsed:.1f}s, "
            f"{CLIENTS * ROUNDS / elapsed:.1f} episodes/s, {c['calls']} calls"
        )
        assert "HTTP-5XX" not in log.read_text()
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(10)
