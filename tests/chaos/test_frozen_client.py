"""A frozen client never stops the others' training for longer than `group_stall_s` (issue 14, item 1).

    swarm serve (subprocess, fake engine, default 30 s lease, group_stall_s 3)
    frozen:  an SDK process (heartbeats on) claims one slot of group `f`, makes a call, is SIGSTOPped
    others:  this test finishes the other slot of `f` and a whole group `g`: the window waits on `f`

Within the stall bound (long before the 30 s lease could lapse) `f` is resolved (partial: it
trains with its finished member), step 1 trains and the others go on to step 2. After SIGCONT
the frozen process's finish gets 409 `stale_epoch`. Everything started is killed by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from chaos_harness import free_port

SERVE = "import typer; from swarm.server.cli import serve_command; typer.run(serve_command)"
TOKEN = "frozen-token"
STALL_S = 3.0
FROZEN = """
import json, os, sys, time
from swarm.client import SwarmClient
from swarm.client._retry import SwarmAPIError
url, token, ready, go, out = sys.argv[1:6]
client = SwarmClient(url, token, max_retries=0)
ep = client.claim("f")
ep.openai.chat.completions.create(model=ep.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
open(ready, "w").write(ep.id)
while not os.path.exists(go):
    time.sleep(0.05)
try:
    ep.finish(1.0)
    result = {"status": 200}
except SwarmAPIError as exc:
    result = {"status": exc.status_code, "code": exc.code}
open(out, "w").write(json.dumps(result))
"""


def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _play(url: str, task: str) -> None:
    ep = httpx.post(
        f"{url}/swarm/v1/episodes", json={"task_id": task, "wait_s": 10}, headers=_h(TOKEN), timeout=30
    ).json()
    httpx.post(
        f"{url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        timeout=30,
        json={"model": ep["model"], "max_tokens": 4, "messages": [{"role": "user", "content": task}]},
    )
    r = httpx.post(
        f"{url}/swarm/v1/episodes/{ep['episode_id']}/finish",
        json={"reward": 1.0},
        headers=_h(ep["api_key"]),
        timeout=30,
    )
    assert r.status_code == 200, r.text


def _step(url: str) -> int:
    return int(httpx.get(f"{url}/swarm/v1/status", headers=_h(TOKEN), timeout=5).json()["step"])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_sigstopped_client_holds_training_at_most_the_stall_bound(tmp_path: Path, model_dir: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs: list[subprocess.Popen] = []
    try:
        with open(tmp_path / "serve.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        SERVE,
                        "--engine",
                        "fake",
                        "--model",
                        str(model_dir),
                        "--port",
                        str(port),
                        "--out",
                        str(tmp_path / "out"),
                        "--group-size",
                        "2",
                        "--batch-groups",
                        "2",
                        "--group-stall-s",
                        str(STALL_S),
                        "--checkpoint-every",
                        "0",
                        "--token",
                        TOKEN,
                        "--admin-token",
                        "frozen-admin",
                        "--max-tokens",
                        "8",
                        "--log-level",
                        "warning",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        _wait(lambda: _healthy(url), 90, "the server")
        ready, go, out = tmp_path / "ready", tmp_path / "go", tmp_path / "result.json"
        with open(tmp_path / "frozen.log", "w") as log:
            frozen = subprocess.Popen(
                [sys.executable, "-c", FROZEN, url, TOKEN, str(ready), str(go), str(out)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        procs.append(frozen)
        _wait(ready.exists, 60, "the frozen client's claim")
        os.kill(frozen.pid, signal.SIGSTOP)
        for task in ("f", "g", "g"):  # the window now waits on f's frozen member only
            _play(url, task)
        waiting = time.monotonic()
        _wait(lambda: _step(url) >= 1, STALL_S + 10, "step 1 (the stall bound)")
        held = time.monotonic() - waiting
        assert held < STALL_S + 3, f"training was held {held:.1f}s"
        for task in ("h", "h", "i", "i"):  # the others' training goes on
            _play(url, task)
        _wait(lambda: _step(url) >= 2, 30, "step 2")
        status = httpx.get(f"{url}/swarm/v1/status", headers=_h(TOKEN), timeout=5).json()
        assert status["counters"]["groups_stalled"] == 1 and status["counters"]["episodes_fenced_stalled"] == 1
        assert status["counters"].get("expired", 0) == 0  # the 30 s lease never had to lapse
        os.kill(frozen.pid, signal.SIGCONT)
        go.write_text("go")
        _wait(out.exists, 30, "the frozen client's late finish")
        assert json.loads(out.read_text()) == {"status": 409, "code": "stale_epoch"}
        print(f"\nFROZEN CLIENT: training held {held:.2f}s with group_stall_s={STALL_S}")
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
