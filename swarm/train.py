"""`swarm train`: one server and a client fleet, as separate processes, over loopback.

    swarm model init && swarm train --task arith
    swarm train --task arith+guess                # a task mix: equal shares of every batch
    swarm train --task arith=0.75+guess=0.25      # ... or these shares

The server (`swarm serve`) owns the model and trains it; the fleet
(`swarm client`, any number of processes) plays the task through the server's
OpenAI-compatible endpoint. This command only orchestrates: it picks a port and
a token, starts both, shows progress from the server's status and metrics, stops
everything by PID when the target step is reached (or on Ctrl-C), and writes
`summary.json`.

A task mix runs one fleet per task and gives the server a quota per task family,
so every batch holds the tasks in the given shares however fast each fleet is
(the server enforces it; see docs/server-control.md). The metrics then carry
`reward_mean/<family>` per step, and `summary.json` a first/last reward per family.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


@dataclass
class TrainSpec:
    task: str = "arith"
    model: Path | None = None
    out: Path = Path("runs/train")
    steps: int = 100
    group_size: int = 8
    batch_groups: int = 16
    lr: float | None = 3e-4
    advantage: str = "grpo"
    loss_agg: str = "token-mean"
    kl_coef: float = 0.0
    clients: int = 1
    concurrency: int = 128
    seed: int = 0
    dataset_size: int = 100_000
    checkpoint_every: int = 0
    temperature: float | None = None
    merge: bool = True
    per_episode_norm: bool = False
    mlflow: bool = True
    mlflow_experiment: str = "swarm-train"
    mlflow_parent: str | None = None
    extra_server_args: list[str] = field(default_factory=list)
    timeout_s: float = 3600.0


def parse_mix(task: str) -> dict[str, float]:
    """'arith' -> {arith: 1}; 'arith+guess' -> equal shares; 'arith=3+guess=1' -> normalised shares.

    ValueError naming the problem: an unknown task, a task twice, a bad or
    non-positive share, or shares given for some tasks but not others.
    """
    from swarm.tasks import list_tasks

    parts = [p.strip() for p in task.split("+")]
    if not all(parts):
        raise ValueError(f"empty task name in {task!r}")
    named = [p.partition("=") for p in parts]
    with_share = [sep == "=" for _, sep, _ in named]
    if any(with_share) and not all(with_share):
        raise ValueError(f"give a share for every task of the mix or for none: {task!r}")
    mix: dict[str, float] = {}
    for name, sep, share in named:
        if name not in list_tasks():
            raise ValueError(f"unknown task {name!r}; built-in tasks: {', '.join(list_tasks())}")
        if name in mix:
            raise ValueError(f"task {name!r} appears twice in {task!r}")
        try:
            value = float(share) if sep else 1.0
        except ValueError:
            raise ValueError(f"share of {name!r} is not a number: {share!r}") from None
        if not value > 0 or value == float("inf"):
            raise ValueError(f"share of {name!r} must be a positive number, got {share!r}")
        mix[name] = value
    total = sum(mix.values())
    return {k: v / total for k, v in mix.items()}


def _family(task: str) -> str:
    from swarm.tasks import get_task

    return get_task(task).family


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _swarm(*args: str) -> list[str]:
    return [sys.executable, "-m", "swarm", *args]


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Terminate a child we started, by PID (its process group), escalating to SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written right now
    return rows


def summarize(rows: list[dict], wall_s: float, spec: TrainSpec, window: int = 5) -> dict:
    steps = [{k: v for k, v in r.items() if isinstance(v, (int, float, str)) or v is None} for r in rows]
    def first_last(key: str) -> tuple[float | None, float | None, int]:
        curve = [float(r[key]) for r in rows if r.get(key) is not None]
        head, tail = curve[:window], curve[-window:]
        return (sum(head) / len(head) if head else None), (sum(tail) / len(tail) if tail else None), len(curve)

    reward_first, reward_last, _ = first_last("reward_mean")
    families = {}
    for key in sorted({k for r in rows for k in r if k.startswith("reward_mean/")}):
        first, last, seen = first_last(key)
        families[key.partition("/")[2]] = {"reward_first": first, "reward_last": last, "steps_seen": seen}
    return {
        "task": spec.task,
        "model": str(spec.model) if spec.model else None,
        "config": {"steps": spec.steps, "group_size": spec.group_size, "batch_groups": spec.batch_groups,
                   "lr": spec.lr, "advantage": spec.advantage, "loss_agg": spec.loss_agg,
                   "kl_coef": spec.kl_coef, "seed": spec.seed,
                   "clients": spec.clients, "concurrency": spec.concurrency, "temperature": spec.temperature,
                   "merge": spec.merge, "per_episode_norm": spec.per_episode_norm},
        "steps": steps,
        "reward_first": reward_first,
        "reward_last": reward_last,
        "families": families,
        "wall_s": round(wall_s, 2),
    }


def run(spec: TrainSpec) -> dict:
    out = spec.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    port, token, admin = free_port(), secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    url = f"http://127.0.0.1:{port}"
    server_args = ["serve", "--port", str(port), "--out", str(out / "server"), "--token", token,
                   "--admin-token", admin, "--group-size", str(spec.group_size),
                   "--batch-groups", str(spec.batch_groups), "--max-steps", str(spec.steps),
                   "--advantage", spec.advantage, "--loss-agg", spec.loss_agg, "--kl-coef", str(spec.kl_coef),
                   "--seed", str(spec.seed),
                   "--checkpoint-every", str(spec.checkpoint_every)]
    if spec.model:
        server_args += ["--model", str(spec.model)]
    if spec.temperature is not None:
        server_args += ["--temperature", str(spec.temperature)]
    if not spec.merge:
        server_args += ["--no-merge"]
    if spec.per_episode_norm:
        server_args += ["--per-episode-norm"]
    if spec.mlflow:
        server_args += ["--mlflow", "--mlflow-experiment", spec.mlflow_experiment, "--mlflow-run-name",
                        f"{spec.task}-{out.name}"]
        if spec.mlflow_parent:
            server_args += ["--mlflow-parent", spec.mlflow_parent]
    if spec.lr is not None:
        server_args += ["--lr", str(spec.lr)]
    mix = parse_mix(spec.task)
    if len(mix) > 1:
        for name, share in mix.items():
            server_args += ["--quota", f"{_family(name)}={share!r}"]
    server_args += spec.extra_server_args
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROOST_TOKEN": token}
    t0 = time.monotonic()
    procs: list[subprocess.Popen] = []
    # SIGTERM (a scheduler's cancel) must still run the cleanup below: stop children by PID
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server = subprocess.Popen(_swarm(*server_args), stdout=open(logs / "server.log", "w"),
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(server)
        _wait_healthy(url, token, server, logs / "server.log")
        for name, share in mix.items():  # one fleet per task of the mix
            per_client = max(1, round(spec.concurrency * share) // spec.clients)
            for i in range(spec.clients):
                args = ["client", "--url", url, "--task", name, "--n", str(spec.group_size),
                        "--concurrency", str(per_client), "--seed", str(spec.seed * 1000 + i),
                        "--dataset-size", str(spec.dataset_size)]
                log_name = f"client{i}.log" if len(mix) == 1 else f"client-{name}-{i}.log"
                procs.append(subprocess.Popen(_swarm(*args), stdout=open(logs / log_name, "w"),
                                              stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _follow(spec, url, token, server, out / "server" / "metrics.jsonl", t0, procs[1:])
    finally:
        for p in reversed(procs):
            _stop(p)
        signal.signal(signal.SIGTERM, previous)
    wall = time.monotonic() - t0
    summary = summarize(_read_metrics(out / "server" / "metrics.jsonl"), wall, spec)
    run_file = out / "server" / "mlflow_run.json"
    if run_file.exists():
        summary["mlflow"] = json.loads(run_file.read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _wait_healthy(url: str, token: str, server: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with code {server.returncode}; see {log}:\n"
                               + log.read_text()[-2000:])
        try:
            r = httpx.get(f"{url}/swarm/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=2)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server at {url} not healthy after {timeout:.0f}s; see {log}")


def _info(row: dict) -> str:
    per = {k.partition("/")[2]: v for k, v in row.items() if k.startswith("reward_mean/")}
    text = f"reward {row.get('reward_mean', 0):.3f}"
    if len(per) > 1:
        text += " (" + ", ".join(f"{f} {v:.3f}" for f, v in sorted(per.items())) + ")"
    return text


def _follow(spec: TrainSpec, url: str, token: str, server: subprocess.Popen, metrics: Path, t0: float,
            clients: list[subprocess.Popen]) -> None:
    shown = 0
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task(f"training {spec.task}", total=spec.steps, info="")
        while True:
            rows = _read_metrics(metrics)
            for r in rows[shown:]:
                progress.console.print(
                    f"step {r.get('step')}: {_info(r)}  "
                    f"loss {r.get('loss', float('nan')):+.4f}  kl {r.get('kl', float('nan')):.4f}  "
                    f"entropy {r.get('entropy', float('nan')):.3f}  {r.get('tokens_per_s', 0):.0f} tok/s")
            shown = len(rows)
            info = _info(rows[-1]) if rows else "collecting…"
            progress.update(bar, completed=min(shown, spec.steps), info=info)
            if server.poll() is not None:
                if shown < spec.steps:
                    raise RuntimeError(f"server stopped after {shown} of {spec.steps} steps "
                                       f"(exit code {server.returncode}); see its log")
                return
            if shown >= spec.steps:
                server.wait(timeout=60)  # it exits by itself after --max-steps
                return
            if all(c.poll() is not None for c in clients):
                raise RuntimeError("every client process exited; see the client logs")
            if time.monotonic() - t0 > spec.timeout_s:
                raise TimeoutError(f"training did not reach {spec.steps} steps in {spec.timeout_s:.0f}s")
            time.sleep(0.5)
