"""`kill -9` mid-step keeps the work (issue 14, item 2).

    a real server process (fake engine, each step takes 0.4 s, checkpoint every 4 steps)
    2 x `swarm client` (subprocesses, chaos_agent.py: each acknowledged finish is logged)
    SIGKILL the server while step 6 or 7 trains (steps after 4 are lost), restart it on the same
    port and out dir, let it run to max_steps

Then: every acknowledged episode is in the buffer, trained exactly once (one trained step per
row, each step's episodes summing to the trained rows) or still buffered when training ended;
none dropped as stale (the default `replay_staleness` replays everything); the final counters
say `finished` == the buffer's rows; metrics.jsonl has each step once, the redone ones marked,
and the lost rows are in metrics.lost.jsonl.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from chaos_harness import buffer_rows, free_port, metric_rows

HERE = Path(__file__).parent
TOKEN = "crash-token"
MAX_STEPS = 10
SERVER = f"""
import sys
from pathlib import Path
from swarm.engine.fake import FakeEngine
from swarm.server.app import serve
from swarm.config.server import ServerConfig
model, port, out, token = sys.argv[1:5]
config = ServerConfig(engine="fake", model_dir=Path(model), port=int(port), out_dir=Path(out), group_size=2,
                      batch_groups=2, checkpoint_every=4, max_steps={MAX_STEPS}, token=token, admin_token="crash-admin",
                      default_max_tokens=8, group_stall_s=5, stop_grace_s=0.5)
serve(config, FakeEngine(Path(model), train_delay_s=0.4))
"""
CLIENT = "import typer; from swarm.client.cli import client_command; typer.run(client_command)"


def _status(url: str) -> dict:
    try:
        r = httpx.get(f"{url}/swarm/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2)
        return r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(180)
def test_kill_9_mid_step_keeps_every_acknowledged_episode(tmp_path: Path, model_dir: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "out"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "ROOST_HOME": str(tmp_path / "home"),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    procs: list[subprocess.Popen] = []

    def spawn(args: list[str], log: str, extra: dict | None = None) -> subprocess.Popen:
        with open(tmp_path / log, "w") as f:
            p = subprocess.Popen(
                [sys.executable, "-c", *args], stdout=f, stderr=subprocess.STDOUT, env={**env, **(extra or {})}
            )
        procs.append(p)
        return p

    def start_server(n: int) -> subprocess.Popen:
        p = spawn([SERVER, str(model_dir), str(port), str(out), TOKEN], f"serve{n}.log")
        deadline = time.monotonic() + 90
        while not _status(url):
            assert p.poll() is None and time.monotonic() < deadline, (tmp_path / f"serve{n}.log").read_text()
            time.sleep(0.1)
        return p

    try:
        server = start_server(0)
        for slot in range(2):
            spawn(
                [
                    CLIENT,
                    "--url",
                    url,
                    "--token",
                    TOKEN,
                    "--workflow",
                    "chaos_agent:play",
                    "--dataset",
                    "chaos_agent:dataset",
                    "--dataset-size",
                    "500",
                    "--seed",
                    str(slot),
                    "--n",
                    "2",
                    "--concurrency",
                    "2",
                    "--quiet",
                    "--state",
                    str(tmp_path / f"cursor{slot}.json"),
                    "--reconnect-s",
                    "60",
                ],
                f"client{slot}.log",
                {"CHAOS_ACK_LOG": str(tmp_path / f"ack{slot}.log")},
            )
        deadline = time.monotonic() + 90
        while True:  # kill mid-step, one or two steps after the checkpoint of step 4
            st = _status(url)
            if st.get("training") and st.get("step") in (5, 6):
                break
            assert time.monotonic() < deadline and server.poll() is None, st
            time.sleep(0.02)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        killed_at = st["step"]
        server = start_server(1)
        assert server.wait(120) == 0, (tmp_path / "serve1.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)

    acks = {json.loads(x)["episode_id"] for log in tmp_path.glob("ack*.log") for x in log.read_text().splitlines()}
    rows = buffer_rows(out)  # id -> (state, trained_step, ...)
    assert acks and not acks - set(rows), "acknowledged but not in the buffer"
    states = Counter(rows[i][0] for i in acks)
    assert set(states) <= {"trained", "buffered"}, states  # nothing dropped as stale, nothing skipped
    metrics = metric_rows(out)
    steps = [m["step"] for m in metrics]
    assert steps == list(range(1, MAX_STEPS + 1)), steps  # one row per step
    trained = [r for r in rows.values() if r[0] == "trained"]
    assert sum(m["episodes"] for m in metrics) == len(trained)  # each trained row in exactly one step
    assert Counter(r[1] for r in trained) == Counter({m["step"]: m["episodes"] for m in metrics})
    lost = [json.loads(x)["step"] for x in (out / "metrics.lost.jsonl").read_text().splitlines()]
    redone = [m["step"] for m in metrics if m.get("redone")]
    assert lost == list(range(5, killed_at + 1)) and redone == lost  # the steps after the checkpoint
    state = json.loads((out / "checkpoints" / "latest" / "server_state.json").read_text())
    assert state["counters"]["finished"] == len(rows)  # counters rebuilt from the buffer, then counted on
    assert state["counters"]["resumes"] == 1
    print(
        f"\nCRASH RECOVERY: killed during step {killed_at + 1}; {len(acks)} acknowledged, {len(rows)} rows, "
        f"states {dict(states)}, redone steps {redone}, replayed {state['counters'].get('episodes_replayed')}"
    )
