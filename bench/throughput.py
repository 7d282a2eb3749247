"""The episode path's own cost: a real server on the fake engine, one client process.

    python bench/throughput.py                        # 2,000 one-call episodes, 64 in flight
    python bench/throughput.py --episodes 5000 --concurrency 128 --open 1000 --json out.json

The fake engine answers at once, so everything measured is Roost's overhead around
generation: the claim, the OpenAI-compatible chat call (rendering, tokenizing,
recording), the finish (timeline merge, durable buffer) and the client SDK
(the `openai` SDK call included). It prints

* episodes/s and requests/s end to end;
* server and client CPU milliseconds per episode (from /proc and getrusage, over the same
  window, after `--warmup` episodes: imports and pools are per process, not per episode);
* how many claims and finishes went per HTTP request (the SDK coalesces concurrent ones);
* the latency the server adds to one chat call over calling the engine directly
  (p50/p99, sequential calls, same prompt);
* with `--open` episodes claimed and held open: claim p50/p99, the chat call's
  latency then, and the server's RSS.

`--profile DIR` samples both processes with py-spy (GIL holder only, so it is CPU, not
waiting) while the fleet runs and prints their busiest functions; the collapsed stacks stay
in DIR (docs/throughput.md has the figures and what they led to).

Everything runs on loopback; the server and the client are separate processes, each
stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from swarm.children import wait_serving
from swarm.client import SwarmClient
from swarm.engine.base import GenerateRequest, SamplingParams
from swarm.engine.fake import FakeEngine
from swarm.model.build import build_untrained
from swarm.run_layout import SERVER_FILE

console = Console()
TICK = os.sysconf("SC_CLK_TCK")
MESSAGES = [{"role": "user", "content": "What is 12+30?"}]


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


def start_server(
    model: Path, out: Path, token: str, batch_groups: int, group_size: int
) -> tuple[subprocess.Popen, str]:
    args = [
        sys.executable,
        "-m",
        "swarm",
        "serve",
        "--engine",
        "fake",
        "--model",
        str(model),
        "--port",
        "0",  # the kernel's pick, read back from server.json (a port found free could be taken first)
        "--out",
        str(out),
        "--group-size",
        str(group_size),
        "--batch-groups",
        str(batch_groups),
        "--no-mlflow",
        "--log-level",
        "warning",
        "--checkpoint-every",
        "0",
        "--no-log-rollouts",
    ]
    env = {**os.environ, "ROOST_TOKEN": token, "ROOST_ADMIN_TOKEN": token + "-admin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=open(out.with_suffix(".log"), "w"), start_new_session=True
    )
    return proc, wait_serving(out / SERVER_FILE, token, proc, out.with_suffix(".log"), timeout=120)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def spy_args(out: Path) -> list[str]:
    """`py-spy record` writing collapsed stacks (active threads only) to `out`."""
    # this interpreter's venv first: `pip install py-spy` there puts it beside python, not on PATH
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    return [spy, "record", "--nonblocking", "--gil", "-r", "250", "-f", "raw", "-o", str(out)]


def attach_spy(pid: int, out: Path) -> subprocess.Popen:
    """Sample a running process; stop it with `detach_spy` (SIGINT makes py-spy write its file)."""
    return subprocess.Popen([*spy_args(out), "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def detach_spy(spy: subprocess.Popen) -> None:
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(5)


def top_costs(raw: Path, n: int = 25) -> list[tuple[str, float, float]]:
    """(function, self %, inclusive %) of the busiest functions in a py-spy raw profile."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f.split(" (")[0] + " (" + f.rpartition("/")[2].split(" (")[-1] for f in stack.split(";")]
        c = int(count)
        total += c
        own[frames[-1]] += c
        for f in set(frames):
            incl[f] += c
    return [(f, 100 * own[f] / max(1, total), 100 * incl[f] / max(1, total)) for f, _ in own.most_common(n)]


def print_profile(title: str, raw: Path, n: int) -> None:
    if not raw.exists():
        console.print(f"[yellow]{title}: no profile written[/]")
        return
    table = Table(title=f"{title}: top self time ({raw})")
    table.add_column("function")
    table.add_column("self %", justify="right")
    table.add_column("incl %", justify="right")
    for f, own, incl in top_costs(raw, n):
        table.add_row(f, f"{own:.1f}", f"{incl:.1f}")
    console.print(table)


CLIENT = textwrap.dedent("""
    import json, resource, sys, time
    from swarm.client import SwarmClient, run_fleet

    url, token, episodes, concurrency, n, server_pid, warmup = sys.argv[1:8]
    episodes, concurrency, n, warmup = int(episodes), int(concurrency), int(n), int(warmup)
    MESSAGES = [{"role": "user", "content": "What is 12+30?"}]
    TICK = __import__("os").sysconf("SC_CLK_TCK")

    def workflow(task, episode):
        episode.openai.chat.completions.create(model=episode.model, messages=MESSAGES, max_tokens=8)
        return 1.0

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def server_cpu():
        fields = open(f"/proc/{server_pid}/stat").read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    dataset = [{"task_id": f"t{i}"} for i in range((episodes + warmup) // n + 2)]
    with SwarmClient(url, token) as client:
        client.status()
        if warmup:  # imports (openai: ~1 s), pools, pydantic schemas: once per process, not per episode
            run_fleet(client, workflow, dataset[-(warmup // n + 1):], n=n, concurrency=concurrency, epochs=1,
                      max_episodes=warmup)
        kinds = [(k, getattr(client, "_" + k, None)) for k in ("claims", "finishes")]  # None: an SDK without
        kinds = [(k, c) for k, c in kinds if c is not None]                          # coalescing
        sent0 = {k: (c.sent, c.items) for k, c in kinds}
        c0, s0, t0 = cpu(), server_cpu(), time.monotonic()
        stats = run_fleet(client, workflow, dataset, n=n, concurrency=concurrency, epochs=1, max_episodes=episodes)
        wall, used, served = time.monotonic() - t0, cpu() - c0, server_cpu() - s0
        batches = {k: {"requests": c.sent - sent0[k][0], "items": c.items - sent0[k][1]} for k, c in kinds}
        for k in ("claims", "finishes"):
            batches.setdefault(k, {"requests": stats.finished, "items": stats.finished})
    print(json.dumps({"finished": stats.finished, "failed": stats.failed, "wall_s": wall, "cpu_s": used,
                      "server_cpu_s": served, "batches": batches}))
""")


def run_fleet_process(
    url: str,
    token: str,
    episodes: int,
    concurrency: int,
    n: int,
    server_pid: int,
    warmup: int,
    profile: Path | None = None,
) -> dict:
    """The fleet in its own process; it measures its own CPU and the server's over the same window."""
    args = [
        sys.executable,
        "-c",
        CLIENT,
        url,
        token,
        str(episodes),
        str(concurrency),
        str(n),
        str(server_pid),
        str(warmup),
    ]
    if profile is not None:
        args = [*spy_args(profile / "client.raw"), "--", *args]
    r = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


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
    ap.add_argument(
        "--warmup",
        type=int,
        default=64,
        help="episodes played before measuring (imports, pools and schemas are per process)",
    )
    ap.add_argument("--open", type=int, default=1000, help="episodes held open for the claim/RSS measurement")
    ap.add_argument("--calls", type=int, default=300, help="sequential chat calls for the latency percentiles")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="sample the server and the client with py-spy during the fleet run; "
        "collapsed stacks and the top costs go to this folder",
    )
    args = ap.parse_args()
    token = "bench-" + secrets.token_hex(8)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = build_untrained(tmp_path / "model", seed=0)
        proc, url = start_server(model, tmp_path / "server", token, args.batch_groups, args.group_size)
        try:
            spy = None
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = attach_spy(proc.pid, args.profile / "server.raw")
                time.sleep(1.0)  # attached before the fleet starts
            fleet = run_fleet_process(
                url, token, args.episodes, args.concurrency, args.group_size, proc.pid, args.warmup, args.profile
            )
            if spy is not None:
                detach_spy(spy)
            episodes = fleet["finished"]
            http_requests = episodes + sum(b["requests"] for b in fleet["batches"].values())  # chat + batches
            results["fleet"] = {
                "episodes": episodes,
                "failed": fleet["failed"],
                "wall_s": round(fleet["wall_s"], 3),
                "episodes_per_s": round(episodes / fleet["wall_s"], 1),
                "requests_per_s": round(3 * episodes / fleet["wall_s"], 1),  # claim + chat + finish
                "http_requests_per_s": round(http_requests / fleet["wall_s"], 1),
                "claims_per_request": round(
                    fleet["batches"]["claims"]["items"] / max(1, fleet["batches"]["claims"]["requests"]), 2
                ),
                "finishes_per_request": round(
                    fleet["batches"]["finishes"]["items"] / max(1, fleet["batches"]["finishes"]["requests"]), 2
                ),
                "server_cpu_ms_per_episode": round(1000 * fleet["server_cpu_s"] / max(1, episodes), 3),
                "client_cpu_ms_per_episode": round(1000 * fleet["cpu_s"] / max(1, episodes), 3),
            }
            http = chat_latency(url, token, args.calls)
        finally:
            stop(proc)
        direct = engine_latency(model, args.calls)
        results["latency_ms"] = {
            "chat_p50": round(1000 * pct(http, 0.5), 3),
            "chat_p99": round(1000 * pct(http, 0.99), 3),
            "engine_p50": round(1000 * pct(direct, 0.5), 3),
            "engine_p99": round(1000 * pct(direct, 0.99), 3),
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
                    "episodes": args.open,
                    "claim_p50_ms": round(1000 * pct(claims, 0.5), 3),
                    "claim_p99_ms": round(1000 * pct(claims, 0.99), 3),
                    "chat_p50_ms": round(1000 * pct(held_http, 0.5), 3),
                    "chat_p99_ms": round(1000 * pct(held_http, 0.99), 3),
                    "rss_mb_before": round(rss0, 1),
                    "rss_mb_after": round(rss_mb(proc.pid), 1),
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
    if args.profile is not None:
        print_profile("server", args.profile / "server.raw", 30)
        print_profile("client", args.profile / "client.raw", 30)


if __name__ == "__main__":
    main()
