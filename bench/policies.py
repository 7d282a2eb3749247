"""k LoRA policies on one server against k single-policy servers, side by side.

    python bench/policies.py                                  # k = 1, 2, 4, 8 (~8 min on 2 cores)
    python bench/policies.py --ks 1,2,4 --seconds 30 --json out.json
    python bench/policies.py --agent-ms 500                   # agents that spend 0.5 s outside the server
    python bench/policies.py --max-b-k 4                      # B (k servers) only up to k = 4
    python bench/policies.py --device cuda                    # every server on the one GPU

Why: a team of roles, a study's trials or several users' runs each want their own policy.
`swarm serve --policy p0 --policy p1 ...` trains them as LoRA adapters over one shared base
model (docs/policies.md): one process, one copy of the weights, one port. The alternative is one
server per policy, each with its own copy of the model, its own torch, its own event loop. This
bench puts a number on both sides of that trade, on the embedded model (ROOST_HOME/models/
tiny-qwen2, or `--model`), the torch engine and `--lora-rank 8` on both sides (like with like):

* A (k policies, one server): one `swarm serve --policy p0 ... --policy p{k-1}`, one fleet per
  policy (`SwarmClient(url, token, model="p{i}")`);
* B (k servers): k `swarm serve` processes without `--policy`, one fleet each.

The fleets are threads of this process (`run_fleet` over the `arith` task's dataset, one chat call
of `--max-tokens` per episode): lighter than k `swarm client` processes (one interpreter and one
import of the SDK instead of k), and the same for A and B. Each run warms up until every policy
made `--warmup-steps` steps (imports, allocator, optimizer state), then measures for `--seconds`
(or until every policy made `--steps` more steps). It reports, per configuration:

* server RSS (VmRSS summed over every server process and its children, MiB, read at the end of
  the window) and PSS (the same, with pages shared between processes, such as libtorch's code,
  split among them: the honest sum for B);
* episodes/s (the servers' `finished` counters over the window), steps/min per policy (from the
  step times in each policy's metrics.jsonl: steps in the window less one over the time between
  the first and the last of them) and in total;
* CPU used by the servers, by the fleets (this process) and by anything else on the machine (a
  run that shares it is flagged) as a share of every core, and each step's mean `wall_train_s`
  (its forward/backward and its wait for the engine's lock, which generation holds per forward),
  and the servers' CPU milliseconds per step (every policy's steps together);

then the ratios the design targets: RSS(A, k) / RSS(B, 1) (one server of k policies against one
single-policy server: target <= 1.2) and steps/min(A, k) / (k x steps/min(B, 1)) (target >= 0.8
until the cores run out). `--max-b-k` caps the B side (8 servers each load torch and the model:
~3.7 GB RSS, ~25 s to start on two cores; the default run, B at k = 8 included, takes ~8 minutes
there); the output says which k it skipped. `--agent-ms` gives each episode agent time outside
the server (a tool call, an environment step) before its call: with it one policy leaves its
server mostly idle, the case several policies on one base are for.

Everything runs on loopback; every server is started in its own session and stopped by its
process group (its PID) at the end, on failure and on Ctrl-C too. docs/policies-bench.md has the
figures of a run and what they say.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _models import embedded_or_untrained  # bench/ is not a package: the script's folder is on the path
from rich.console import Console
from rich.table import Table

from swarm import children
from swarm.client import SwarmClient, run_fleet
from swarm.run_layout import SERVER_FILE
from swarm.tasks import arith, completion_text

console = Console(width=max(170, Console().width))  # the tables' columns on one line, piped too
TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def group_pids(pgid: int) -> list[int]:
    """Every live process of the process group `pgid` (a server and whatever it started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def memory_mib(pids: list[int]) -> tuple[float, float]:
    """(RSS, PSS) summed over `pids`, MiB."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return rss / 1024, pss / 1024


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` (their threads included)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def machine_cpu_s() -> float:
    """CPU seconds every core spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    out: Path
    policies: list[str | None]  # None: a single-policy server (no --policy)

    def metrics_file(self, policy: str | None) -> Path:
        return self.out / "policies" / policy / "metrics.jsonl" if policy else self.out / "metrics.jsonl"


def start_server(model: Path, out: Path, token: str, policies: list[str], args: argparse.Namespace) -> Server:
    """A `swarm serve` on loopback in its own session (so it and its children stop as one group)."""
    cmd = [
        sys.executable,
        "-m",
        "swarm",
        "serve",
        "--engine",
        "torch",
        "--device",
        args.device,
        "--lora-rank",
        str(args.lora_rank),
        "--model",
        str(model),
        "--port",
        "0",  # the kernel's pick, read back from server.json (a port found free could be taken first)
        "--out",
        str(out),
        "--token",
        token,
        "--admin-token",
        token + "-admin",
        "--group-size",
        str(args.group_size),
        "--batch-groups",
        str(args.batch_groups),
        "--max-tokens",
        str(args.max_tokens),
        "--no-mlflow",
        "--log-level",
        "warning",
        "--checkpoint-every",
        "0",
        "--no-checkpoint-on-stop",
        "--no-log-rollouts",
        "--no-resume",
    ]
    for name in policies:
        cmd += ["--policy", name]
    out.parent.mkdir(parents=True, exist_ok=True)
    log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    return Server(proc, "", out, list(policies) or [None])  # its URL once it has bound its port


def wait_healthy(server: Server, token: str, timeout_s: float = 300.0) -> None:
    """`swarm train`'s own wait for a server it started: its URL, then its health."""
    log = server.out.with_suffix(".log")
    server.url = children.wait_serving(server.out / SERVER_FILE, token, server.proc, log, timeout=timeout_s)


def stop_server(server: Server) -> None:
    """SIGTERM to the server's process group (its PID), SIGKILL if it lingers."""
    children.stop(server.proc, grace=30.0)


def make_workflow(max_tokens: int, agent_ms: float = 0.0):
    """`arith`'s workflow with `max_tokens` of our choosing: one chat call, exact-match reward.

    `agent_ms` > 0: the agent first spends that long elsewhere (a tool, an environment), as real
    agents do; the server is idle for it, so one policy no longer keeps a server busy.
    """

    def workflow(task: dict, episode) -> float:
        if agent_ms:
            time.sleep(agent_ms / 1000)
        response = episode.openai.chat.completions.create(
            model=episode.model,
            messages=[{"role": "user", "content": task["question"]}],
            max_tokens=max_tokens,
            temperature=1.0,
        )
        return arith.reward(completion_text(response), task["answer"])

    return workflow


@dataclass
class Fleet:
    """One policy's fleet: `run_fleet` in a thread of this process, stopped by its event."""

    url: str
    token: str
    policy: str | None
    seed: int
    args: argparse.Namespace
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    finished: int = 0

    def start(self) -> None:
        self.client = SwarmClient(self.url, self.token, model=self.policy)
        self.thread = threading.Thread(target=self._run, name=f"fleet-{self.policy}-{self.seed}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            stats = run_fleet(
                self.client,
                make_workflow(self.args.max_tokens, self.args.agent_ms),
                arith.dataset(seed=self.seed, size=256),
                n=self.args.group_size,
                concurrency=self.args.concurrency,
                stop=self.stop,
            )
            self.finished = stats.finished
        except BaseException as exc:  # reported by the run, which stops at once
            self.error = exc

    def halt(self) -> None:
        self.stop.set()

    def join(self) -> None:
        if hasattr(self, "thread"):
            self.thread.join(15)
        if hasattr(self, "client"):
            self.client.close()


def step_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a row being written
            continue
    return out


def finished_count(server: Server, policy: str | None, token: str) -> int:
    params = {"policy": policy} if policy else {}
    r = httpx.get(
        f"{server.url}/swarm/v1/status", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    r.raise_for_status()
    return int(r.json()["counters"].get("finished", 0))


def measure(label: str, k: int, servers: list[Server], token: str, args: argparse.Namespace) -> dict:
    """Fleets on every policy of `servers`: warm up, measure a window, read memory at its end."""
    pairs = [(s, p) for s in servers for p in s.policies]
    fleets = [Fleet(s.url, token, p, seed=i, args=args) for i, (s, p) in enumerate(pairs)]
    try:
        for f in fleets:
            f.start()
        deadline = time.monotonic() + args.warmup_timeout
        while min(len(step_records(s.metrics_file(p))) for s, p in pairs) < args.warmup_steps:
            if errors := [f.error for f in fleets if f.error]:
                raise RuntimeError(f"{label}: a fleet failed: {errors[0]!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label}: not every policy made {args.warmup_steps} steps in warm-up")
            time.sleep(0.5)
        pgids = [s.proc.pid for s in servers]
        t0 = time.time()
        fin0 = [finished_count(s, p, token) for s, p in pairs]
        srv0 = cpu_s([pid for g in pgids for pid in group_pids(g)])
        me0 = own_cpu_s()
        all0 = machine_cpu_s()
        end = t0 + args.seconds
        while time.time() < end:
            if errors := [f.error for f in fleets if f.error]:
                raise RuntimeError(f"{label}: a fleet failed: {errors[0]!r}")
            if args.steps and all(
                sum(r["time"] >= t0 for r in step_records(s.metrics_file(p))) >= args.steps for s, p in pairs
            ):
                break
            time.sleep(0.5)
        t1 = time.time()
        wall = t1 - t0
        fin1 = [finished_count(s, p, token) for s, p in pairs]
        pids = [pid for g in pgids for pid in group_pids(g)]
        srv_cpu = cpu_s(pids) - srv0
        me_cpu = own_cpu_s() - me0
        other_cpu = machine_cpu_s() - all0 - srv_cpu - me_cpu  # anything else on the machine: a noisy run
        rss, pss = memory_mib(pids)
    finally:
        for f in fleets:
            f.halt()
        for f in fleets:
            f.join()
    per_policy = []
    for (s, p), a, b in zip(pairs, fin0, fin1, strict=True):
        rows = [r for r in step_records(s.metrics_file(p)) if t0 <= r["time"] <= t1]
        times = [r["time"] for r in rows]
        if len(rows) >= 3:  # steps between the first and the last in the window: no quantization at its edges
            spm = 60 * (len(rows) - 1) / (times[-1] - times[0])
        else:
            spm = 60 * len(rows) / wall
        per_policy.append(
            {
                "policy": p or "(single)",
                "steps": len(rows),
                "steps_per_min": round(spm, 2),
                "episodes": b - a,
                "train_s_mean": round(sum(r.get("wall_train_s", 0.0) for r in rows) / max(1, len(rows)), 4),
                "gate_s_mean": round(sum(r.get("wall_gate_s", 0.0) for r in rows) / max(1, len(rows)), 4),
            }
        )
    spms = [p["steps_per_min"] for p in per_policy]
    episodes = sum(p["episodes"] for p in per_policy)
    return {
        "setup": label,
        "k": k,
        "servers": len(servers),
        "wall_s": round(wall, 2),
        "rss_mib": round(rss, 1),
        "pss_mib": round(pss, 1),
        "episodes_per_s": round(episodes / wall, 2),
        "steps_per_min_total": round(sum(spms), 2),
        "steps_per_min_policy_mean": round(sum(spms) / len(spms), 2),
        "steps_per_min_policy_min": round(min(spms), 2),
        "steps_per_min_policy_max": round(max(spms), 2),
        "train_s_per_step": round(sum(p["train_s_mean"] for p in per_policy) / len(per_policy), 4),
        "server_cpu_share": round(srv_cpu / wall / CORES, 3),
        "fleet_cpu_share": round(me_cpu / wall / CORES, 3),
        "other_cpu_share": round(max(0.0, other_cpu) / wall / CORES, 3),
        "server_cpu_ms_per_step": round(1000 * srv_cpu / max(1, sum(p["steps"] for p in per_policy)), 1),
        "policies": per_policy,
    }


def run_setup(
    label: str, k: int, model: Path, tmp: Path, token: str, args: argparse.Namespace, servers: list[Server]
) -> dict:
    """Start A (one server, k policies) or B (k servers), measure, stop them (by PID, always)."""
    base = tmp / f"{label}-{k}"
    if label == "A":
        servers.append(start_server(model, base / "server", token, [f"p{i}" for i in range(k)], args))
    else:
        for i in range(k):
            servers.append(start_server(model, base / f"server{i}", token, [], args))
    t = time.monotonic()
    try:
        for s in servers:
            wait_healthy(s, token)
        started_s = time.monotonic() - t
        console.print(f"[dim]{label} k={k}: {len(servers)} server(s) up in {started_s:.1f}s; measuring[/]")
        row = measure(label, k, servers, token, args)
        row["start_s"] = round(started_s, 1)
        return row
    finally:
        for s in servers:
            stop_server(s)
        servers.clear()


def ratios(rows: dict[tuple[str, int], dict], ks: list[int]) -> list[dict]:
    one = rows[("B", 1)]
    out = []
    for k in ks:
        a, b = rows.get(("A", k)), rows.get(("B", k))
        r: dict = {"k": k}
        if a:
            r["rss_A_over_one_server"] = round(a["rss_mib"] / one["rss_mib"], 3)
            r["pss_A_over_one_server"] = round(a["pss_mib"] / one["pss_mib"], 3)
            r["steps_A_over_k_one"] = round(a["steps_per_min_total"] / (k * one["steps_per_min_total"]), 3)
            r["episodes_A_over_k_one"] = round(a["episodes_per_s"] / (k * one["episodes_per_s"]), 3)
        if b:
            r["rss_B_over_one_server"] = round(b["rss_mib"] / one["rss_mib"], 3)
            r["pss_B_over_one_server"] = round(b["pss_mib"] / one["pss_mib"], 3)
            r["steps_B_over_k_one"] = round(b["steps_per_min_total"] / (k * one["steps_per_min_total"]), 3)
        if a and b:
            r["rss_A_over_B"] = round(a["rss_mib"] / b["rss_mib"], 3)
            r["pss_A_over_B"] = round(a["pss_mib"] / b["pss_mib"], 3)
            r["steps_A_over_B"] = round(a["steps_per_min_total"] / b["steps_per_min_total"], 3)
        out.append(r)
    return out


def fmt(value: float | None, target: tuple[str, float] | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.2f}"
    if target is not None:
        op, bound = target
        ok = value <= bound if op == "<=" else value >= bound
        text = f"[green]{text}[/]" if ok else f"[red]{text}[/]"
    return text


def print_tables(rows: dict[tuple[str, int], dict], ks: list[int], skipped: list[int], max_b_k: int) -> None:
    table = Table(title=f"k policies: A = one server of k LoRA policies, B = k single-policy servers ({CORES} cores)")
    for col in (
        "k",
        "setup",
        "procs",
        "RSS MiB",
        "PSS MiB",
        "episodes/s",
        "steps/min per policy (min-max)",
        "steps/min total",
        "train s/step",
        "server CPU ms/step",
        "CPU server",
        "CPU fleets",
        "CPU other",
    ):
        table.add_column(col, justify="right")
    for (label, k), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        table.add_row(
            str(k),
            label,
            str(r["servers"]),
            f"{r['rss_mib']:.0f}",
            f"{r['pss_mib']:.0f}",
            f"{r['episodes_per_s']:.1f}",
            f"{r['steps_per_min_policy_mean']:.1f} ({r['steps_per_min_policy_min']:.1f}-"
            f"{r['steps_per_min_policy_max']:.1f})",
            f"{r['steps_per_min_total']:.1f}",
            f"{r['train_s_per_step']:.3f}",
            f"{r['server_cpu_ms_per_step']:.0f}",
            f"{100 * r['server_cpu_share']:.0f}%",
            f"{100 * r['fleet_cpu_share']:.0f}%",
            f"{100 * r['other_cpu_share']:.0f}%",
        )
    console.print(table)
    if noisy := [f"{label} k={k}" for (label, k), r in rows.items() if r["other_cpu_share"] > 0.1]:
        console.print(
            f"[yellow]other processes used over 10% of the cores during {', '.join(noisy)}: "
            "those rows are slower than a quiet machine's[/]"
        )
    ratio = Table(title="ratios (one server = B at k=1; targets: RSS A/one <= 1.2, steps A/(k x one) >= 0.8)")
    for col in (
        "k",
        "RSS A / one",
        "PSS A / one",
        "RSS B / one",
        "PSS B / one",
        "steps A / (k x one)",
        "steps B / (k x one)",
        "steps A / B",
        "PSS A / B",
    ):
        ratio.add_column(col, justify="right")
    for r in ratios(rows, ks):
        ratio.add_row(
            str(r["k"]),
            fmt(r.get("rss_A_over_one_server"), ("<=", 1.2)),
            fmt(r.get("pss_A_over_one_server"), ("<=", 1.2)),
            fmt(r.get("rss_B_over_one_server")),
            fmt(r.get("pss_B_over_one_server")),
            fmt(r.get("steps_A_over_k_one"), (">=", 0.8)),
            fmt(r.get("steps_B_over_k_one")),
            fmt(r.get("steps_A_over_B")),
            fmt(r.get("pss_A_over_B")),
        )
    console.print(ratio)
    if skipped:
        console.print(
            f"B skipped for k = {', '.join(map(str, skipped))} (over --max-b-k {max_b_k}: each of its servers would "
            "load torch and the model again); the A/one ratios above need only B at k = 1"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", default="1,2,4,8", help="comma-separated policy counts")
    ap.add_argument("--max-b-k", type=int, default=8, help="run B (k separate servers) only up to this k")
    ap.add_argument("--seconds", type=float, default=45.0, help="measured window per configuration")
    ap.add_argument("--steps", type=int, default=0, help="end a window early once every policy made this many steps")
    ap.add_argument("--warmup-steps", type=int, default=2, help="steps every policy makes before the window opens")
    ap.add_argument("--warmup-timeout", type=float, default=240.0)
    ap.add_argument("--model", type=Path, default=None, help="default: the embedded model (else a random tiny one)")
    ap.add_argument("--device", default="cpu", help="the servers' device (cuda: every server shares the one GPU)")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch-groups", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument(
        "--agent-ms",
        type=float,
        default=0.0,
        help="each episode's agent time outside the server before its call (a tool, an environment)",
    )
    ap.add_argument("--concurrency", type=int, default=0, help="episodes in flight per fleet (0: 2 windows' worth)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and ratios here")
    args = ap.parse_args()
    ks = sorted({int(k) for k in args.ks.split(",") if k.strip()})
    if not ks or ks[0] < 1:
        raise SystemExit("--ks: positive integers")
    args.concurrency = args.concurrency or 2 * args.group_size * args.batch_groups
    token = "bench-" + secrets.token_hex(8)
    servers: list[Server] = []  # whatever is running, so the finally below stops it
    rows: dict[tuple[str, int], dict] = {}
    skipped = [k for k in ks if k > args.max_b_k]
    with tempfile.TemporaryDirectory(prefix="roost-policies-bench-") as tmp:
        tmp_path = Path(tmp)
        model = embedded_or_untrained(tmp_path, args.model, lambda line: console.print(f"[yellow]{line}[/]"))
        console.print(
            f"model {model}, torch engine on {args.device}, LoRA rank {args.lora_rank}, group {args.group_size} x "
            f"{args.batch_groups}, max_tokens {args.max_tokens}, {args.concurrency} in flight per fleet, "
            f"{args.agent_ms:.0f} ms agent time per episode, "
            f"{args.seconds:.0f}s windows after {args.warmup_steps} warm-up steps, {CORES} cores"
        )
        plan = [("B", 1)] + [
            (label, k) for k in ks for label in ("A", "B") if not (label == "B" and (k == 1 or k > args.max_b_k))
        ]
        try:
            for label, k in plan:
                row = run_setup(label, k, model, tmp_path, token, args, servers)
                rows[(label, k)] = row
                console.print(
                    f"[dim]{label} k={k}: RSS {row['rss_mib']:.0f} MiB, {row['episodes_per_s']:.1f} episodes/s, "
                    f"{row['steps_per_min_total']:.1f} steps/min[/]"
                )
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; stopping the servers[/]")
        finally:
            for s in servers:
                stop_server(s)
    if ("B", 1) not in rows:
        raise SystemExit("no baseline measured")
    print_tables(rows, ks, skipped, args.max_b_k)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "settings": {
                        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"
                    }
                    | {"cores": CORES, "b_skipped_for_k": skipped},
                    "rows": [rows[key] for key in sorted(rows, key=lambda key: (key[1], key[0]))],
                    "ratios": ratios(rows, ks),
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
