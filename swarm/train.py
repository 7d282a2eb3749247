"""`swarm train`: one server and a client fleet, as separate processes, over loopback.

    swarm model init && swarm train --task arith
    swarm train --task arith+guess                # a task mix: equal shares of every batch
    swarm train --task arith=0.75+guess=0.25      # ... or these shares

The server (`swarm serve`) owns the model and trains it; the fleet
(`swarm client`, any number of processes) plays the task through the server's
OpenAI-compatible endpoint. This command only orchestrates: it picks a port and
tokens, writes the run's settings (`run.yaml`, from `RunConfig` in
swarm/train_config.py) and each process's own (`server.yaml`, `fleet-*.yaml`),
starts them with `--config`, shows progress from the server's metrics, stops
everything by PID when the target step is reached (or on Ctrl-C), and writes
`summary.json`. `swarm train --config OUT/run.yaml` repeats a run exactly.

A task mix runs one fleet per task and gives the server a quota per task family,
so every batch holds the tasks in the given shares however fast each fleet is
(the server enforces it; see docs/server-control.md). The metrics then carry
`reward_mean/<family>` per step, and `summary.json` a first/last reward per family.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from swarm.client.config import FleetConfig
from swarm.options import dump_config, write_config
from swarm.server.config import ServerConfig
from swarm.tasks import get_task
from swarm.train_config import RunConfig, parse_mix

console = Console(stderr=True)


def _family(task: str) -> str:
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


class MetricsTail:
    """The rows of a growing `metrics.jsonl`, read incrementally: each poll parses only the lines
    appended since the last (a long run's file is re-read whole only if it shrank, as a
    recovering server rewrites it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict] = []
        self._offset = 0

    def poll(self) -> list[dict]:
        try:
            with self.path.open("rb") as f:
                if f.seek(0, 2) < self._offset:
                    self.rows, self._offset = [], 0
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return self.rows
        end = data.rfind(b"\n") + 1  # a line being written right now waits for the next poll
        for line in data[:end].splitlines():
            try:
                self.rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        self._offset += end
        return self.rows


def _read_metrics(path: Path) -> list[dict]:
    return MetricsTail(path).poll()


def summarize(rows: list[dict], wall_s: float, spec: RunConfig, window: int = 5) -> dict:
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
    def median(key: str) -> float | None:  # from step 2: step 1 also waits for the clients to start
        vals = sorted(float(r[key]) for r in rows[1:] if isinstance(r.get(key), (int, float)))
        return round(vals[len(vals) // 2], 4) if vals else None

    server = spec.server
    return {
        "task": spec.task or (None if spec.workflow else "arith"),
        "workflow": spec.workflow,
        "model": str(server.model_dir),
        "config": {"steps": spec.steps, "group_size": server.group_size, "batch_groups": server.batch_groups,
                   "lr": server.train.lr, "advantage": str(server.train.advantage),
                   "loss_agg": str(server.train.loss_agg), "kl_coef": server.train.kl_coef, "seed": server.seed,
                   "clients": spec.clients, "concurrency": spec.concurrency, "temperature": server.temperature,
                   "merge": server.merge, "per_episode_norm": server.per_episode_norm,
                   "group_call": spec.grouped},
        "run_config": dump_config(spec),
        "steps": steps,
        "reward_first": reward_first,
        "reward_last": reward_last,
        "families": families,
        "timing": {"collection_s": median("wall_window_s"), "engine_busy_s": median("gen_busy_s"),
                   "train_s": median("wall_train_s")},  # per step, medians
        "wall_s": round(wall_s, 2),
    }


def server_config(spec: RunConfig, out: Path, port: int, resume: bool = False) -> ServerConfig:
    """The run's server settings with what `swarm train` orchestrates filled in."""
    update: dict = {"host": "127.0.0.1", "port": port, "out_dir": out / "server", "max_steps": spec.steps,
                    "mlflow_run_name": spec.server.mlflow_run_name or f"{spec.name}-{out.name}", "resume": resume}
    if spec.grouped:  # a group is one episode whose one call samples group_size choices
        update["group_size"] = 1
    mix = spec.mix
    if len(mix) > 1:  # one fleet per task; the server's quotas hold the shares in every batch
        update.update(quotas={_family(name): share for name, share in mix.items()}, quota_schedule=None)
    return spec.server.model_copy(update=update)


def fleet_configs(spec: RunConfig, url: str) -> list[tuple[str, FleetConfig]]:
    """One fleet per task of the mix and client process: (log name, its settings)."""
    mix: dict[str | None, float] = dict(spec.mix) or {None: 1.0}  # None: the workflow's own dataset
    out = []
    for name, share in mix.items():
        per_client = max(1, round(spec.concurrency * share) // spec.clients)
        for i in range(spec.clients):
            log_name = f"client{i}" if len(mix) == 1 else f"client-{name}-{i}"
            out.append((log_name, FleetConfig(url=url, task=name, workflow=spec.workflow, dataset=spec.dataset,
                                              n=1 if spec.grouped else spec.server.group_size,
                                              choices=spec.server.group_size if spec.grouped else 1,
                                              concurrency=per_client,
                                              seed=spec.server.seed * 1000 + i, dataset_size=spec.dataset_size)))
    return out


RUN_FILE = "run.yaml"
#: what a run writes into its folder (and `--fresh` removes; nothing else there is touched)
RUN_ENTRIES = ("server", "logs", "summary.json", RUN_FILE, "server.yaml")


def previous_run(out: Path) -> list[str]:
    """The traces of an earlier run in `out` (empty when there is none)."""
    out = Path(out)
    found = [name for name in RUN_ENTRIES if (out / name).exists()]
    return found + sorted(p.name for p in out.glob("fleet-*.yaml")) if out.is_dir() else []


def clear_run(out: Path) -> None:
    """Remove an earlier run's files from `out`, and only those."""
    out = Path(out)
    for name in RUN_ENTRIES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for path in out.glob("fleet-*.yaml"):
        path.unlink()


def run(spec: RunConfig, resume: bool = False) -> dict:
    """Train until the server has done `spec.steps` steps (counting an earlier run's when resuming)."""
    out = spec.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not resume and previous_run(out):
        raise RuntimeError(f"{out} holds an earlier run: resume it or clear it first")
    done = len(_read_metrics(out / "server" / "metrics.jsonl")) if resume else 0
    if done >= spec.steps:
        raise RuntimeError(f"the run in {out} already has {done} steps; ask for more with --steps")
    write_config(out / RUN_FILE, spec)
    port, token, admin = free_port(), secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    url = f"http://127.0.0.1:{port}"
    server_file = write_config(out / "server.yaml", server_config(spec, out, port, resume))
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROOST_TOKEN": token, "ROOST_ADMIN_TOKEN": admin}
    t0 = time.monotonic()
    procs: list[subprocess.Popen] = []
    # SIGTERM (a scheduler's cancel) must still run the cleanup below: stop children by PID
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server = subprocess.Popen(_swarm("serve", "--config", str(server_file)),
                                  stdout=open(logs / "server.log", "w"),
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(server)
        # a vLLM server takes a minute or two to start on a loaded CPU; the torch engine seconds
        _wait_healthy(url, token, server, logs / "server.log", timeout=900.0 if spec.server.engine == "vllm" else 180.0)
        for log_name, fleet in fleet_configs(spec, url):
            fleet_file = write_config(out / f"fleet-{log_name}.yaml", fleet)
            procs.append(subprocess.Popen(_swarm("client", "--config", str(fleet_file)),
                                          stdout=open(logs / f"{log_name}.log", "w"),
                                          stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _follow(spec, url, token, server, out / "server" / "metrics.jsonl", t0, procs[1:], done)
    finally:
        for p in reversed(procs):
            _stop(p)
        signal.signal(signal.SIGTERM, previous)
    wall = time.monotonic() - t0
    summary = summarize(_read_metrics(out / "server" / "metrics.jsonl"), wall, spec)
    run_file = out / "server" / "mlflow_run.json"
    if run_file.exists():
        summary["mlflow"] = json.loads(run_file.read_text())
        model_uri = log_final_model(summary["mlflow"], out / "server" / "checkpoints" / "latest", out / RUN_FILE)
        if model_uri:
            summary["mlflow"]["model_uri"] = model_uri
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def log_final_model(mlflow_run: dict, checkpoint: Path, run_file: Path) -> str | None:
    """Log the trained model (transformers flavour) and the run's config into the run's MLflow run.

    Returns the model URI, or None (with a warning) when there is no HF checkpoint
    (the fake engine) or MLflow refuses: the run itself has succeeded either way.
    """
    if not (checkpoint / "config.json").exists():
        return None
    try:
        import mlflow  # lazy: importing MLflow takes seconds
        import transformers  # lazy: only needed to hand MLflow the model

        mlflow.set_tracking_uri(mlflow_run["tracking_uri"])
        with mlflow.start_run(run_id=mlflow_run["run_id"]):
            mlflow.log_artifact(str(run_file))
            model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
            tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
            info = mlflow.transformers.log_model(
                transformers_model={"model": model, "tokenizer": tokenizer}, name="model", task="text-generation",
                pip_requirements=["torch", "transformers"], model_config={"max_new_tokens": 64})
        return str(info.model_uri)
    except Exception as exc:  # noqa: BLE001 - tracking must never fail a finished run
        console.print(f"[yellow]warning[/yellow]: could not log the model to MLflow: {exc}")
        return None


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
        time.sleep(0.05)
    raise TimeoutError(f"server at {url} not healthy after {timeout:.0f}s; see {log}")


def _info(row: dict) -> str:
    per = {k.partition("/")[2]: v for k, v in row.items() if k.startswith("reward_mean/")}
    text = f"reward {row.get('reward_mean', 0):.3f}"
    if len(per) > 1:
        text += " (" + ", ".join(f"{f} {v:.3f}" for f, v in sorted(per.items())) + ")"
    return text


def _follow(spec: RunConfig, url: str, token: str, server: subprocess.Popen, metrics: Path, t0: float,
            clients: list[subprocess.Popen], shown: int = 0) -> None:
    """Print each new metrics row (rows of an earlier part of a resumed run are not shown again)."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task(f"training {spec.name}", total=spec.steps, info="")
        tail = MetricsTail(metrics)
        while True:
            rows = tail.poll()
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
