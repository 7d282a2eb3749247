"""Shared machinery of the chaos tests: real `swarm serve` and `swarm client` processes, and
readers of what a run leaves on disk (not a test module).

    Cluster      one server (restartable on the same port and out dir) and numbered client
                 slots, each a `swarm client` process running `chaos_agent.py`; every process
                 it starts is killed by PID in `teardown`
    read_acks    what the clients were told was durable (`ack*.log`, written after each ack)
    buffer_rows  the server's durable buffer (`buffer.sqlite`): id -> (state, trained_step, ...)
    metric_rows  `metrics.jsonl` in file order; `surviving_steps` keeps the last row per step
    count_5xx    the `HTTP-5XX` log marker (survives a `kill -9`, unlike the status counter)
    rss_kb       a process's resident set from /proc/PID/status

Durability is judged from the server's files, never from its memory: the server is
SIGKILLed in these runs, and only what it wrote survives.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from swarm.children import free_port

HERE = Path(__file__).parent
SERVE = "import typer; from swarm.server.cli import serve_command; typer.run(serve_command)"
CLIENT = "import typer; from swarm.client.cli import client_command; typer.run(client_command)"
TOKEN = "chaos-token"
ADMIN = "chaos-admin"
ACKED_STATES = {"trained", "dropped_stale", "buffered"}  # what an acknowledged row may be at the end


class Cluster:
    """The processes of one run: `serve_args` are the server's own flags beyond the fixed ones
    (engine, model, port, out, tokens, log level); clients in slot `s` use dataset seed `seeds[s]`."""

    def __init__(
        self,
        tmp: Path,
        model_dir: Path,
        serve_args: list[str],
        seeds: list[int],
        concurrency: int,
        engine: str = "fake",
        client_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        slot_args: dict[int, list[str]] | None = None,
    ) -> None:
        self.tmp = tmp
        self.out = tmp / "out"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.serve_args = [
            "--engine",
            engine,
            "--model",
            str(model_dir),
            "--port",
            str(self.port),
            "--out",
            str(self.out),
            "--token",
            TOKEN,
            "--admin-token",
            ADMIN,
            "--log-level",
            "warning",
            *serve_args,
        ]
        self.seeds = seeds
        self.concurrency = concurrency
        self.client_args = client_args or []
        self.slot_args = slot_args or {}  # a slot's own client flags (e.g. the policy it plays)
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            **(env or {}),
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        self.server: subprocess.Popen | None = None
        self.server_logs: list[Path] = []
        self.clients: dict[int, subprocess.Popen] = {}
        self.all: list[subprocess.Popen] = []
        self.events: Counter[str] = Counter()
        # one client for the harness's polling (health, status several times a second for minutes): a new one
        # per request builds a TLS context (~20 ms of CPU, for plain HTTP too), a third of the harness's CPU
        self.http = httpx.Client()

    # -- processes ------------------------------------------------------------------------
    def _spawn(self, code: str, args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        with open(log, "w") as f:
            p = subprocess.Popen(
                [sys.executable, "-c", code, *args], stdout=f, stderr=subprocess.STDOUT, env=env or self.env
            )
        self.all.append(p)
        return p

    def start_server(self, timeout_s: float = 120) -> float:
        """Start the server and wait until it answers /health; returns the seconds that took."""
        t0 = time.monotonic()
        log = self.tmp / f"serve{len(self.server_logs)}.log"
        self.server_logs.append(log)
        self.server = self._spawn(SERVE, self.serve_args, log)
        while time.monotonic() - t0 < timeout_s:
            assert self.server.poll() is None, "server died at start:\n" + log.read_text()[-3000:]
            try:
                if self.http.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("server did not start:\n" + log.read_text()[-3000:])

    def kill_server(self) -> None:
        assert self.server is not None
        self.kill(self.server)
        self.events["server_sigkills"] += 1

    def start_client(self, slot: int) -> None:
        n = self.events[f"client{slot}_starts"]
        self.events[f"client{slot}_starts"] += 1
        env = {**self.env, "CHAOS_ACK_LOG": str(self.tmp / f"ack{slot}.log"), "ROOST_HOME": str(self.tmp / "home")}
        args = [
            "--url",
            self.url,
            "--token",
            TOKEN,
            "--workflow",
            "chaos_agent:play",
            "--dataset",
            "chaos_agent:dataset",
            "--dataset-size",
            "5000",
            "--seed",
            str(self.seeds[slot]),
            "--n",
            "4",
            "--concurrency",
            str(self.concurrency),
            "--quiet",
            "--state",
            str(self.tmp / f"cursor{slot}.json"),
            "--reconnect-s",
            "60",
            *self.client_args,
            *self.slot_args.get(slot, []),
        ]
        self.clients[slot] = self._spawn(CLIENT, args, self.tmp / f"client{slot}-{n}.log", env)

    @staticmethod
    def kill(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        if p.poll() is None:
            os.kill(p.pid, sig)
            if sig == signal.SIGKILL:
                p.wait(10)

    def status(self, policy: str | None = None) -> dict:
        try:
            r = self.http.get(
                f"{self.url}/swarm/v1/status",
                params={"policy": policy} if policy else None,
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=2,
            )
            return r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def stop_server(self, timeout_s: float = 60) -> int:
        """Ask the server to stop (it writes a last checkpoint) and wait for it; returns its exit code."""
        assert self.server is not None
        self.http.post(f"{self.url}/swarm/v1/admin/stop", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        return self.server.wait(timeout_s)

    def stop_clients(self) -> None:
        for p in self.clients.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a frozen one dies too
                self.kill(p)

    def teardown(self) -> None:
        self.http.close()
        for p in self.all:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                self.kill(p)


# -- what a run leaves on disk --------------------------------------------------------------------
def read_acks(tmp: Path, pattern: str = "ack*.log") -> dict[str, dict]:
    """Every acknowledged episode the clients logged: id -> its ack line (pid, epoch, task, group)."""
    acks: dict[str, dict] = {}
    for log in tmp.glob(pattern):
        for line in log.read_text().splitlines():
            if line.strip():
                a = json.loads(line)
                acks[a["episode_id"]] = a
    return acks


def buffer_rows(out: Path) -> dict[str, tuple]:
    """id -> (state, trained_step, epoch, payload) of every row of the durable buffer."""
    db = sqlite3.connect(out / "buffer.sqlite")
    try:
        return {r[0]: r[1:] for r in db.execute("SELECT id, state, trained_step, epoch, payload FROM episodes")}
    finally:
        db.close()


def metric_rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def surviving_steps(rows: list[dict], last_step: int | None = None) -> dict[int, dict]:
    """The last row of each step number (a restart re-trains the steps it rolled back), up to
    `last_step` (rows of lost steps beyond the final one are not in the final model)."""
    steps: dict[int, dict] = {}
    for rec in rows:
        if last_step is None or rec["step"] <= last_step:
            steps[rec["step"]] = rec
    return steps


def count_5xx(logs: list[Path]) -> int:
    return sum(log.read_text().count("HTTP-5XX") for log in logs)


def check_acknowledged(acks: dict[str, dict], rows: dict[str, tuple]) -> Counter[str]:
    """Assert every acknowledged episode is in the buffer in a state the server's rules allow;
    returns the count of acknowledged episodes per state."""
    missing = sorted(set(acks) - set(rows))
    assert not missing, f"{len(missing)} acknowledged episode(s) not in the buffer: {missing[:5]}"
    states = Counter(rows[i][0] for i in acks)
    assert set(states) <= ACKED_STATES, f"acknowledged episodes in unexpected states: {states}"
    return states


def check_trained_once(rows: dict[str, tuple], steps: dict[int, dict]) -> int:
    """Every trained row is in exactly one surviving step: the steps' episode counts add up to the
    trained rows, and each row names one of those steps. Returns the trained row count."""
    trained = {i: r for i, r in rows.items() if r[0] == "trained"}
    assert all(r[1] in steps for r in trained.values()), "a trained row names a step that did not survive"
    assert sum(s["episodes"] for s in steps.values()) == len(trained), (
        f"steps count {sum(s['episodes'] for s in steps.values())} episodes, the buffer {len(trained)} trained rows"
    )
    return len(trained)


MARKER = re.compile(r"\[pid=(\d+) epoch=(\d+) ep=([0-9a-f]+)\]")


def check_fencing(out: Path, rows: dict[str, tuple], acks: dict[str, dict], tokenizer: Any) -> tuple[int, int, int]:
    """Every marker in a trained episode's tokens is its finishing holder's (chaos_agent.py writes `[pid=P
    epoch=E ep=ID]` into each call): no token of a fenced holder (a stale epoch, another episode) was
    trained. Returns (markers checked, trained rows read from rollouts.jsonl, trained rows not verifiable).

    A checkpoint compacts the buffer rows it holds (their token ids go), so those are read from the
    rollout log; a kill -9 between the buffer's commit and the log's append leaves a trained row with
    neither: the caller bounds how many (the finishes in flight at its server kills)."""
    calls: dict[str, list[list[int]]] = {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        rec = json.loads(line)
        calls[rec["episode_id"]] = [c["prompt_ids"] + c["completion_ids"] for c in rec["calls"]]
    markers = compacted = unverified = 0
    for eid, (state, _, epoch, payload) in rows.items():
        if state != "trained":
            continue
        stored = json.loads(payload)
        if "samples" in stored:
            token_lists = [sample["input_ids"] for sample in stored["samples"]]
        elif eid in calls:
            compacted += 1
            token_lists = calls[eid]
        else:
            unverified += 1
            continue
        seen: set[tuple[str, str, str]] = set()
        for ids in token_lists:
            seen |= set(MARKER.findall(tokenizer.decode(ids)))
        assert seen, f"trained episode {eid} carries no marker"
        for pid, ep_epoch, ep_id in seen:
            assert ep_id == eid and int(ep_epoch) == epoch, f"fenced call in {eid}: {seen}"
            if eid in acks:
                assert int(pid) == acks[eid]["pid"]
        markers += len(seen)
    return markers, compacted, unverified


def rss_kb(pid: int) -> int | None:
    """VmRSS of a live process in KiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None
