"""Chaos: a real training run while clients are SIGKILLed (and one is frozen into a zombie) and
the server is SIGKILLed once and restarted.

    swarm serve (subprocess, FakeEngine)  <-  3 x `swarm client` (subprocesses, chaos_agent.py)
    every 2-4 s: SIGKILL a random client, restart it (its cursor file resumes it)
    once:        SIGSTOP a client for longer than the lease, then SIGCONT (a zombie)
    once:        SIGKILL the server mid-run, restart it on the same port and out dir

Then, from the server's durable buffer (`buffer.sqlite`), its metrics and the clients'
acknowledgement logs: training reached `max_steps`; every acknowledged episode is in the
buffer and trained, dropped as stale (counted), or still buffered when training ended;
every trained row is in exactly one surviving step; no trained token came from a call
of a fenced holder (stale epoch); and the server never answered a 5xx.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
SERVE = "import typer; from swarm.server.cli import serve_command; typer.run(serve_command)"
CLIENT = "import typer; from swarm.client.cli import client_command; typer.run(client_command)"
MARKER = re.compile(r"\[pid=(\d+) epoch=(\d+) ep=([0-9a-f]+)\]")
TOKEN = "chaos-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Chaos:
    """The processes of one chaos run; everything it starts is killed by PID in `teardown`."""

    def __init__(self, tmp: Path, model_dir: Path, engine: str, max_steps: int, lease_s: float,
                 seeds: list[int], concurrency: int, extra: list[str] | None = None) -> None:
        self.tmp = tmp
        self.out = tmp / "out"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.serve_args = [
            "--engine", engine, "--model", str(model_dir), "--port", str(self.port), "--out", str(self.out),
            "--group-size", "4", "--batch-groups", "2", "--checkpoint-every", "2", "--max-steps", str(max_steps),
            "--token", TOKEN, "--admin-token", "chaos-admin", "--lease-seconds", str(lease_s),
            "--group-stall-s", str(3 * lease_s), "--max-staleness", "0", "--log-level", "warning",
            "--max-tokens", "8", *(extra or [])]
        self.seeds = seeds
        self.concurrency = concurrency
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1",
                    "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        self.server: subprocess.Popen | None = None
        self.server_logs: list[Path] = []
        self.clients: dict[int, subprocess.Popen] = {}
        self.all: list[subprocess.Popen] = []
        self.events: Counter[str] = Counter()

    # -- processes ------------------------------------------------------------------------
    def _spawn(self, code: str, args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        with open(log, "w") as f:
            p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=f, stderr=subprocess.STDOUT,
                                 env=env or self.env)
        self.all.append(p)
        return p

    def start_server(self) -> None:
        log = self.tmp / f"serve{len(self.server_logs)}.log"
        self.server_logs.append(log)
        self.server = self._spawn(SERVE, self.serve_args, log)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.server.poll() is None, "server died at start:\n" + log.read_text()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("server did not start:\n" + log.read_text())

    def start_client(self, slot: int) -> None:
        n = self.events[f"client{slot}_starts"]
        self.events[f"client{slot}_starts"] += 1
        env = {**self.env, "CHAOS_ACK_LOG": str(self.tmp / f"ack{slot}.log"),
               "ROOST_HOME": str(self.tmp / "home")}
        args = ["--url", self.url, "--token", TOKEN, "--workflow", "chaos_agent:play",
                "--dataset", "chaos_agent:dataset", "--dataset-size", "2000", "--seed", str(self.seeds[slot]),
                "--n", "4", "--concurrency", str(self.concurrency), "--quiet",
                "--state", str(self.tmp / f"cursor{slot}.json"), "--reconnect-s", "60"]
        self.clients[slot] = self._spawn(CLIENT, args, self.tmp / f"client{slot}-{n}.log", env)

    @staticmethod
    def kill(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        if p.poll() is None:
            os.kill(p.pid, sig)
            if sig == signal.SIGKILL:
                p.wait(10)

    def status(self) -> dict:
        try:
            r = httpx.get(f"{self.url}/swarm/v1/status", headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=2)
            return r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def teardown(self) -> None:
        for p in self.all:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                self.kill(p)

    # -- the run ----------------------------------------------------------------------------
    def run(self, max_steps: int, lease_s: float, budget_s: float, seed: int = 0) -> int:
        rng = random.Random(seed)
        self.start_server()
        for slot in range(len(self.seeds)):
            self.start_client(slot)
        t_end = time.monotonic() + budget_s
        next_kill = time.monotonic() + rng.uniform(2, 4)
        frozen: tuple[int, float] | None = None
        server_killed = zombie_done = False
        assert self.server is not None
        while self.server.poll() is None:
            assert time.monotonic() < t_end, f"no progress in {budget_s}s: {self.status()}"
            now = time.monotonic()
            st = self.status()
            step = int(st.get("step", 0))
            # kill the server after an odd step (checkpoints are every 2: that step is lost and its
            # episodes are replayed) while the next window holds finished episodes (dropped as stale)
            mid_window = step % 2 == 1 and any(g["finished"] for g in st.get("groups", []))
            if not server_killed and step >= max_steps // 2 and (mid_window or step >= max_steps // 2 + 3):
                self.kill(self.server)
                self.events["server_sigkills"] += 1
                server_killed = True
                time.sleep(0.5)
                self.start_server()
                continue
            if not zombie_done and step >= 2:
                slot = 0
                if self.clients[slot].poll() is None:
                    os.kill(self.clients[slot].pid, signal.SIGSTOP)  # its leases lapse: a zombie
                    frozen = (slot, now + lease_s + 2.0)
                    self.events["client_sigstops"] += 1
                zombie_done = True
            if frozen is not None and now >= frozen[1]:
                os.kill(self.clients[frozen[0]].pid, signal.SIGCONT)
                frozen = None
            if now >= next_kill:
                slots = [s for s in self.clients if frozen is None or s != frozen[0]]
                slot = rng.choice(slots)
                self.kill(self.clients[slot])
                self.events["client_sigkills"] += 1
                self.start_client(slot)
                next_kill = now + rng.uniform(2, 4)
            for slot, p in self.clients.items():  # a client that gave up (e.g. during the restart)
                if p.poll() not in (None, 0) and self.server.poll() is None and (frozen is None or frozen[0] != slot):
                    self.events["client_exits"] += 1
                    self.start_client(slot)
            time.sleep(0.2)
        return self.server.wait()


def _analyse(chaos: Chaos, model_dir: Path, max_steps: int) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    acks: dict[str, dict] = {}
    for log in chaos.tmp.glob("ack*.log"):
        for line in log.read_text().splitlines():
            a = json.loads(line)
            acks[a["episode_id"]] = a
    db = sqlite3.connect(chaos.out / "buffer.sqlite")
    rows = {r[0]: r[1:] for r in db.execute(
        "SELECT id, state, trained_step, epoch, payload FROM episodes")}
    db.close()
    # 1. every acknowledged episode is in the durable buffer, and accounted for
    missing = sorted(set(acks) - set(rows))
    assert not missing, f"acknowledged but not in the buffer: {missing[:5]}"
    acked_states = Counter(rows[i][0] for i in acks)
    assert set(acked_states) <= {"trained", "dropped_stale", "buffered"}, acked_states
    # 2. every trained row is in exactly one surviving step (the last record of each step number)
    steps: dict[int, dict] = {}
    for line in (chaos.out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        steps[rec["step"]] = rec
    assert max(steps) == max_steps and sorted(steps) == list(range(1, max_steps + 1))
    trained = {i: r for i, r in rows.items() if r[0] == "trained"}
    assert sum(steps[s]["episodes"] for s in steps) == len(trained)
    assert all(1 <= r[1] <= max_steps for r in trained.values())
    # 3. fencing: every marker in trained tokens is the finishing holder's (its epoch, its episode)
    # a checkpoint compacts the rows it holds (their token ids go); rollouts.jsonl keeps every call
    calls: dict[str, list[list[int]]] = {}
    for line in (chaos.out / "rollouts.jsonl").read_text().splitlines():
        rec = json.loads(line)
        calls[rec["episode_id"]] = [c["prompt_ids"] + c["completion_ids"] for c in rec["calls"]]
    markers = compacted = 0
    for eid, (_, _, epoch, payload) in trained.items():
        seen = set()
        stored = json.loads(payload)
        if "samples" in stored:
            token_lists = [s["input_ids"] for s in stored["samples"]]
        else:
            compacted += 1
            token_lists = calls[eid]
        for ids in token_lists:
            seen |= set(MARKER.findall(tok.decode(ids)))
        assert seen, f"trained episode {eid} carries no marker"
        for pid, ep_epoch, ep_id in seen:
            assert ep_id == eid and int(ep_epoch) == epoch, f"fenced call in {eid}: {seen}"
            if eid in acks:
                assert int(pid) == acks[eid]["pid"]
        markers += len(seen)
    # 4. the server never answered a 5xx
    fivexx = sum(log.read_text().count("HTTP-5XX") for log in chaos.server_logs)
    assert fivexx == 0, "5xx answered: " + "".join(l.read_text()[-2000:] for l in chaos.server_logs)
    state = json.loads((chaos.out / "checkpoints" / "latest" / "server_state.json").read_text())
    counters = state.get("counters", {})
    return {
        "steps": max(steps), "acknowledged": len(acks), "buffer_rows": len(rows),
        "acked_trained": acked_states["trained"], "acked_dropped_stale": acked_states["dropped_stale"],
        "acked_buffered_at_end": acked_states["buffered"], "trained_rows": len(trained),
        "all_states": dict(Counter(r[0] for r in rows.values())), "http_5xx": fivexx,
        "markers_checked": markers, "trained_rows_compacted": compacted, **dict(chaos.events),
        "server_counters": {k: counters.get(k, 0) for k in (
            "expired", "episodes_replayed", "episodes_rolled_back", "dropped_stale", "slots_abandoned",
            "calls_dropped", "resumes", "finished")},
    }


def _chaos_run(tmp_path: Path, model_dir: Path, engine: str, max_steps: int, budget_s: float,
               extra: list[str] | None = None) -> dict:
    lease_s = 2.0
    chaos = Chaos(tmp_path, model_dir, engine, max_steps, lease_s, seeds=[0, 0, 1], concurrency=3,
                  extra=extra)
    try:
        rc = chaos.run(max_steps, lease_s, budget_s)
        assert rc == 0, chaos.server_logs[-1].read_text()[-3000:]
        time.sleep(0.5)
    finally:
        chaos.teardown()
    summary = _analyse(chaos, model_dir, max_steps)
    print("\nCHAOS SUMMARY " + json.dumps(summary, sort_keys=True))
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_chaos_fake_engine(tmp_path: Path, model_dir: Path) -> None:
    s = _chaos_run(tmp_path, model_dir, "fake", max_steps=16, budget_s=200)
    assert s["server_sigkills"] == 1 and s["client_sigkills"] >= 3 and s["client_sigstops"] == 1
    assert s["acknowledged"] >= 16 * 8 * 0.8
    assert s["trained_rows_compacted"] > 0  # checkpoints compacted the buffer, across the kill too


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(420)
def test_chaos_torch_engine(tmp_path: Path, model_dir: Path) -> None:
    """The same chaos with the real torch engine (random tiny Qwen2 on CPU): fewer steps."""
    s = _chaos_run(tmp_path, model_dir, "torch", max_steps=6, budget_s=300, extra=["--device", "cpu"])
    assert s["server_sigkills"] == 1 and s["client_sigkills"] >= 2
