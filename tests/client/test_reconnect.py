"""Client robustness: reconnect across a server restart, lost episodes, the persisted dataset
cursor, and giving episodes back on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from swarm.children import free_port
from swarm.client import SwarmAPIError, SwarmClient, SwarmUnavailable
from swarm.client._cursor import JobCursor
from swarm.client.cli import client_command
from swarm.config.server import ServerConfig
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer, running_server


def _wait(cond, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_job_cursor_persists_and_replays_exactly_the_lost_jobs(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    c = JobCursor(dataset_size=3, n=2, epochs=1, path=path)
    jobs = [c.take() for _ in range(4)]
    assert jobs == [0, 1, 2, 3] and [c.task_index(j) for j in jobs] == [0, 0, 1, 1]
    c.done(0)
    c.done(2)
    # a restarted fleet (even with edited workflow code: the file knows only job numbers)
    c2 = JobCursor(dataset_size=3, n=2, epochs=1, path=path)
    assert [c2.take() for _ in range(5)] == [1, 3, 4, 5, None]
    for j in (1, 3, 4, 5):
        c2.done(j)
    assert json.loads(path.read_text())["pending"] == [] and JobCursor(3, 2, 1, path).take() is None


def test_client_reconnects_across_a_server_restart(model_dir: Path, tmp_path: Path, caplog) -> None:
    caplog.set_level("WARNING", logger="swarm.client._retry")
    port = free_port()
    config = ServerConfig(
        engine="fake",
        model_dir=model_dir,
        out_dir=tmp_path / "out",
        group_size=2,
        batch_groups=1,
        checkpoint_every=0,
        token="tok",
        admin_token="adm",
        secret="sec",
        stop_grace_s=0.1,
    )
    with ExitStack() as stack:
        srv: RunningServer = stack.enter_context(running_server(config, FakeEngine(model_dir), port=port))
        client = SwarmClient(srv.url, "tok", max_retries=1, backoff_s=0.05, max_backoff_s=0.3, reconnect_s=30)
        done = client.claim("t")
        done.openai.chat.completions.create(model=done.model, max_tokens=3, messages=[{"role": "user", "content": "x"}])
        done.finish(1.0)
        open_ep = client.claim("t")
        srv.stop()
        result: dict = {}

        def poll() -> None:
            t0 = time.monotonic()
            result["status"] = client.status()  # connection refused until the restart: retried
            result["waited"] = time.monotonic() - t0

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(1.0)
        srv2 = stack.enter_context(running_server(config, FakeEngine(model_dir), port=port))
        t.join(30)
        assert result["waited"] >= 0.8 and result["status"].groups[0].finished == 1
        said = [r.getMessage() for r in caplog.records]  # the outage said as it starts and ends, once each
        assert sum("unreachable (ConnectError); retrying for up to 30 s" in m for m in said) == 1, said
        assert sum("reachable again after" in m for m in said) == 1, said
        with pytest.raises(SwarmAPIError) as err:  # the open episode died with the old process
            open_ep.finish(1.0)
        assert err.value.status_code == 404 and open_ep.lost
        again = client.claim("t")  # ... and is simply re-played
        again.openai.chat.completions.create(
            model=again.model, max_tokens=3, messages=[{"role": "user", "content": "y"}]
        )
        again.finish(0.0)
        _wait(lambda: srv2.swarm.trainer.step == 1)


def test_never_connected_fails_fast() -> None:
    client = SwarmClient("http://127.0.0.1:9", "t", max_retries=1, backoff_s=0.01, reconnect_s=60)
    t0 = time.monotonic()
    with pytest.raises(SwarmUnavailable):
        client.status()
    assert time.monotonic() - t0 < 5  # reconnect_s applies only to a server reached before


def test_cli_resumes_from_its_cursor(server: RunningServer, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(client_command)
    state = tmp_path / "cursor.json"
    args = [
        "--url",
        server.url,
        "--token",
        server.token,
        "--task",
        "arith",
        "--n",
        "2",
        "--concurrency",
        "2",
        "--quiet",
        "--state",
        str(state),
    ]
    r = CliRunner().invoke(app, [*args, "--max-episodes", "4"])
    assert r.exit_code == 0, r.output
    assert json.loads(state.read_text())["next"] == 4
    r = CliRunner().invoke(app, [*args, "--max-episodes", "2"])
    assert r.exit_code == 0 and "resuming at job 4" in r.output, r.output
    tasks = sorted(e.task_id for e in server.swarm.registry.closed.values())
    assert tasks == ["arith-0-0"] * 2 + ["arith-0-1"] * 2 + ["arith-0-2"] * 2  # not from the start


SLOW_AGENT = """
import time
def dataset(seed, size):
    return [{'task_id': f's{seed}-{i}'} for i in range(size)]
def play(task, episode):
    for _ in range(600):   # a long agent: only the shutdown ends it
        episode.openai.chat.completions.create(model=episode.model, max_tokens=2,
            messages=[{'role': 'user', 'content': 'hm'}])
        time.sleep(0.05)
    return 1.0
"""


@pytest.mark.integration
def test_sigterm_gives_open_episodes_back(server: RunningServer, tmp_path: Path) -> None:
    (tmp_path / "slow_agent.py").write_text(SLOW_AGENT)
    state = tmp_path / "cursor.json"
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "ROOST_HOME": str(tmp_path / "home"),
    }
    code = "import typer; from swarm.client.cli import client_command; typer.run(client_command)"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "--url",
            server.url,
            "--token",
            server.token,
            "--workflow",
            "slow_agent:play",
            "--n",
            "2",
            "--concurrency",
            "2",
            "--quiet",
            "--state",
            str(state),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait(lambda: server.swarm.status().open_episodes == 2, timeout=60)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert server.swarm.status().open_episodes == 0, out.decode()
    assert server.swarm.counters["aborted"] == 2 and server.swarm.counters["expired"] == 0
    assert json.loads(state.read_text())["pending"] == [0, 1]  # a restart re-plays both


def test_async_client_heartbeats_and_fail(make_server) -> None:
    import asyncio

    import openai  # noqa: F401  (imported up front: a first import blocks the loop, and the beats)

    from swarm.client import AsyncSwarmClient

    # beats every 0.4 s against a 1.2 s lease: a loaded machine (two test workers) may delay one beat, not three
    srv = make_server(group_size=2, batch_groups=1, lease_seconds=1.2)

    async def go() -> None:
        async with AsyncSwarmClient(srv.url, srv.token) as client:
            ep = await client.claim("a")
            await asyncio.sleep(3.0)  # the background task renews the lease meanwhile (2.5 leases)
            await ep.async_openai.chat.completions.create(
                model=ep.model, max_tokens=3, messages=[{"role": "user", "content": "x"}]
            )
            await ep.finish(1.0)
            bad = await client.claim("a")
            await bad.fail("tool crashed")
            await ep.aclose()
            await bad.aclose()

    asyncio.run(go())
    assert srv.swarm.counters["expired"] == 0 and srv.swarm.counters["finished_failed"] == 1
