"""The episode path's own cost: a real server on the fake engine, one client process.

    python bench/throughput.py                        # 2,000 one-call episodes, 64 in flight
    python bench/throughput.py --episodes 5000 --concurrency 128 --open 1000 --json out.json

The fake engine answers at once, so everything measured is Roost's overhead around
generation: the claim, the OpenAI-compatible chat call (rendering, tokenizing,
recording), the finish (timeline merge, durable buffer) and the client SDK
(the `openai` SDK call included). It prints

* episodes/s and requests/s end to end;
* server and client CPU milliseconds per episode (from /proc, the measured part only);
* the latency the server adds to one chat call over calling the engine directly
  (p50/p99, sequential calls, same prompt);
* with `--open` episodes claimed and held open: claim p50/p99, the chat call's
  latency then, and the server's RSS.

Everything runs on loopback; the server and the client are separate processes, each
stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from swarm.client import SwarmClient
from swarm.engine.base import GenerateRequest, SamplingParams
from swarm.engine.fake import FakeEngine
from swarm.model.build import build_untrained

console = Console()
TICK = os.sysconf("SC_CLK_TCK")
MESSAGES = [{"role": "user", "content": "What is 12+30?"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def start_server(model: Path, out: Path, token: str, batch_groups: int, group_size: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, "-m", "swarm", "serve", "--engine", "fake", "--model", str(model), "--port", str(port),
            "--out", str(out), "--group-size", str(group_size), "--batch-groups", str(batch_groups),
            "--no-mlflow", "--log-level", "warning", "--checkpoint-every", "0", "--no-log-rollouts"]
    env = {**os.environ, "ROOST_TOKEN": token, "ROOST_ADMIN_TOKEN": token + "-admin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=open(out.with_suffix(".log"), "w"),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {out.with_suffix('.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/swarm/v1/status", headers={"Authorization": f"Bearer {token}"},
                         timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("server not healthy")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


CLIENT = textwrap.dedent("""
    import json, resource, sys, time
    from swarm.client import SwarmClient, run_fleet

    url, token, episodes, concurrency, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    MESSAGES = [{"role": "user", "content": "What is 12+30?"}]

    def workflow(task, episode):
        episode.openai.chat.completions.create(model=episode.model, messages=MESSAGES, max_tokens=8)
        return 1.0

    dataset = [{"task_id": f"t{i}"} for i in range(episodes // n + 1)]
    with SwarmClient(url, token) as client:
        client.status()
        def cpu():
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime
        c0, t0 = cpu(), time.monotonic()
        stats = run_fleet(client, workflow, dataset, n=n, concurrency=concurrency, epochs=1, max_episodes=episodes)
        wall, used = time.monotonic() - t0, cpu() - c0
    print(json.dumps({"finished": stats.finished, "failed": stats.failed, "wall_s": wall, "cpu_s": used}))
""")


def run_fleet_process(url: str, token: str, episodes: int, concurrency: int, n: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CLIENT, url, token, str(episodes), str(concurrency), str(n)],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def chat_latency(url: str, token: str, calls: int) -> list[float]:
    """Seconds per chat call through the server (one open episode, sequential calls)."""
    with SwarmClient(url, token) as client, client.episode(task_id="latency") as ep:
        oa = ep.openai
        oa.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=8)  # warm
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            oa.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=8)
            out.append(time.perf_counter() - t0)
        ep.abort()
    return out


def engine_latency(model: Path, calls: int) -> list[float]:
    """Seconds per `engine.generate` of the same rendered prompt, in-process: the floor."""
    engine = FakeEngine(model)
    text = engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    request = GenerateRequest(ids, SamplingParams(max_tokens=8))

    async def go() -> list[float]:
        await engine.generate(request)
        out = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await engine.generate(request)
            out.append(time.perf_counter() - t0)
        return out

    return asyncio.run(go())


def open_episodes(url: str, token: str, count: int) -> tuple[list[float], list]:
    """Claim `count` episodes one after another and keep them open: per-claim latency."""
    client = SwarmClient(url, token)
    held, times = [], []
    for i in range(count):
        t0 = time.perf_counter()
        held.append(client.claim(task_id=f"open-{i // 8}"))
        times.append(time.perf_counter() - t0)
    return times, [client, held]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-groups", type=int, default=16)
    ap.add_argument("--open", type=int, default=1000, help="episodes held open for the claim/RSS measurement")
    ap.add_argument("--calls", type=int, default=300, help="sequential chat calls for the latency percentiles")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    token = "bench-" + secrets.token_hex(8)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = build_untrained(tmp_path / "model", seed=0)
        proc, url = start_server(model, tmp_path / "server", token, args.batch_groups, args.group_size)
        try:
            s0 = cpu_s(proc.pid)
            fleet = run_fleet_process(url, token, args.episodes, args.concurrency, args.group_size)
            server_cpu = cpu_s(proc.pid) - s0
            episodes = fleet["finished"]
            results["fleet"] = {
                "episodes": episodes, "failed": fleet["failed"], "wall_s": round(fleet["wall_s"], 3),
                "episodes_per_s": round(episodes / fleet["wall_s"], 1),
                "requests_per_s": round(3 * episodes / fleet["wall_s"], 1),  # claim + chat + finish
                "server_cpu_ms_per_episode": round(1000 * server_cpu / max(1, episodes), 3),
                "client_cpu_ms_per_episode": round(1000 * fleet["cpu_s"] / max(1, episodes), 3),
            }
            http = chat_latency(url, token, args.calls)
        finally:
            stop(proc)
        direct = engine_latency(model, args.calls)
        results["latency_ms"] = {
            "chat_p50": round(1000 * pct(http, 0.5), 3), "chat_p99": round(1000 * pct(http, 0.99), 3),
            "engine_p50": round(1000 * pct(direct, 0.5), 3), "engine_p99": round(1000 * pct(direct, 0.99), 3),
            "added_p50": round(1000 * (pct(http, 0.5) - pct(direct, 0.5)), 3),
            "added_p99": round(1000 * (pct(http, 0.99) - pct(direct, 0.99)), 3),
        }
        if args.open:
            groups = -(-args.open // args.group_size)
            proc, url = start_server(model, tmp_path / "server-open", token, groups + 1, args.group_size)
            try:
                rss0 = rss_mb(proc.pid)
                claims, _keep = open_episodes(url, token, args.open)
                held_http = chat_latency(url, token, min(args.calls, 100))
                results["open"] = {
                    "episodes": args.open, "claim_p50_ms": round(1000 * pct(claims, 0.5), 3),
                    "claim_p99_ms": round(1000 * pct(claims, 0.99), 3),
                    "chat_p50_ms": round(1000 * pct(held_http, 0.5), 3),
                    "chat_p99_ms": round(1000 * pct(held_http, 0.99), 3),
                    "rss_mb_before": round(rss0, 1), "rss_mb_after": round(rss_mb(proc.pid), 1),
                }
            finally:
                stop(proc)
    table = Table(title="episode path (fake engine)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for section, values in results.items():
        for key, value in values.items():
            table.add_row(f"{section}.{key}", str(value))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
