"""Acknowledged means trained: finishes sent in batches and committed in groups survive a `kill -9`.

A real `swarm serve` process; twelve episodes finish at the same moment from one
client, so the SDK coalesces their finishes into batch requests and the server
commits them together (group commit). The server is SIGKILLed the instant the
last acknowledgement arrives. After a restart on the same out dir, one more group
completes the window, and every acknowledged episode is trained by that step.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from http_wait import wait_answering  # tests/kit, on sys.path

from swarm.children import free_port
from swarm.client import SwarmClient

SERVE = "import typer; from swarm.server.cli import serve_command; typer.run(serve_command)"
TOKEN = "ack-crash-token"
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def _serve(args: list[str], log: Path, url: str) -> subprocess.Popen:
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    try:
        wait_answering(f"{url}/health", proc, log)
    except RuntimeError:
        _kill(proc)
        raise
    return proc


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _rows(out: Path) -> dict[str, tuple]:
    db = sqlite3.connect(out / "buffer.sqlite")
    try:
        return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, state, trained_step FROM episodes")}
    finally:
        db.close()


def _play_together(client: SwarmClient, tasks: list[str]) -> list[str]:
    """Play one episode per task on its own thread; all finish at once. Returns the acknowledged ids."""
    barrier = threading.Barrier(len(tasks))
    acked: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(task: str) -> None:
        try:
            ep = client.claim(task)
            ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
            barrier.wait(30)
            result = ep.finish(1.0)
            with lock:
                acked.append(result.episode_id)
        except BaseException as exc:  # reported below, with the thread's own error
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return acked


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_batched_acknowledged_finishes_survive_sigkill(tmp_path: Path, model_dir: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "out"
    args = [
        "--engine",
        "fake",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--out",
        str(out),
        "--group-size",
        "4",
        "--batch-groups",
        "4",
        "--checkpoint-every",
        "0",
        "--token",
        TOKEN,
        "--admin-token",
        "adm",
        "--secret",
        "fixed",
        "--log-level",
        "warning",
        "--max-tokens",
        "8",
    ]
    server = _serve(args, tmp_path / "serve0.log", url)
    try:
        with SwarmClient(url, TOKEN) as client:
            # three complete groups: one short of the window's four, so nothing trains before the kill
            acked = _play_together(client, [f"t{i // 4}" for i in range(12)])
            _kill(server)  # the instant the last acknowledgement is in
            assert client._finishes.items == 12 and client._finishes.sent < 12  # finishes went in batches
        assert len(acked) == 12
        rows = _rows(out)
        assert all(rows[i] == ("buffered", None) for i in acked)  # on disk, untrained

        server = _serve(args, tmp_path / "serve1.log", url)
        with SwarmClient(url, TOKEN) as client:
            assert client.status().counters["episodes_replayed"] == 12
            last = _play_together(client, ["t3"] * 4)  # the fourth group completes the window
            deadline = time.monotonic() + 30
            while client.status().step < 1:
                assert time.monotonic() < deadline, "the window did not train"
                time.sleep(0.1)
        deadline = time.monotonic() + 30
        while any(_rows(out)[i][0] != "trained" for i in acked + last):  # rows are marked as the step ends
            assert time.monotonic() < deadline, _rows(out)
            time.sleep(0.1)
        assert {_rows(out)[i] for i in acked + last} == {("trained", 1)}
    finally:
        _kill(server)
