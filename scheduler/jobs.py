"""Platform job specs: swarm servers, client fleets, and trials (one server + its fleets).

    trial = make_trial("study3-arm1-seed0", model="/models/tiny", out_dir="/runs/t1",
                       task="arith", clients=2, server_args=["--max-steps", "20"])
    jobs = submit_trial(manager, trial, backend="slurm", trial_id=7)
    manager.cancel_group(trial.group_key)          # stops server and fleets together

The server job runs `swarm serve --port 0 --out DIR` under the `scheduler.register
serve` supervisor, which writes the URL into the store's `swarm_servers` table once
`/swarm/v1/status` answers and heartbeats it (see scheduler/register.py for why a
supervisor). A fleet job runs `scheduler.register client`, which looks the URL up in
the store when the job *starts* (so fleets may be queued before their server is up)
and runs N `swarm client` processes, each on its own dataset slice (seed*1000+i).

The worker token travels in the environment (ROOST_TOKEN), not on the command line.
With `engine="verl"` the server job starts a Ray cluster inside its allocation first
(head on the first node, workers on the others via srun) and exports RAY_ADDRESS.
"""

from __future__ import annotations

import secrets
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.manager import JobManager
from scheduler.records import JobRecord
from scheduler.spec import DEFAULT_TIME_LIMIT_S, JobSpec

SWARM_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def swarm_argv() -> list[str]:
    """How to call the `swarm` CLI of this installation (the venv's script if present)."""
    script = Path(sys.executable).parent / "swarm"
    if script.exists():
        return [str(script)]
    found = shutil.which("swarm")
    return [found] if found else [sys.executable, "-c", "from swarm.cli import main; main()"]


def _register(mode: str) -> list[str]:
    return [sys.executable, "-m", "scheduler.register", mode]


def ray_setup(nodes: int, cpus: int, gpus: int) -> list[str]:
    """Shell lines that start a Ray cluster over the job's nodes and export RAY_ADDRESS."""
    lines = [
        'RAY_HEAD_NODE=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" | head -n1)',
        'RAY_HEAD_IP=$(getent hosts "$RAY_HEAD_NODE" | awk \'{print $1}\' | head -n1)',
        'RAY_PORT=$((20000 + ${SLURM_JOB_ID:-$$} % 20000))',
        'export RAY_ADDRESS="${RAY_HEAD_IP:-127.0.0.1}:$RAY_PORT"',
        f"ray start --head --node-ip-address=\"${{RAY_HEAD_IP:-127.0.0.1}}\" --port=$RAY_PORT "
        f"--num-cpus={cpus} --num-gpus={gpus} --disable-usage-stats",
        "trap 'ray stop --force >/dev/null 2>&1 || true' EXIT",
    ]
    if nodes > 1:
        lines.append(
            f'srun --nodes={nodes - 1} --ntasks={nodes - 1} --exclude="$RAY_HEAD_NODE" '
            f'ray start --address="$RAY_ADDRESS" --num-cpus={cpus} --num-gpus={gpus} --block &')
        lines.append("sleep 10  # let the workers join before the server asks Ray for resources")
    return lines


def swarm_server_job(
    name: str, *, model: str | Path, out_dir: str | Path, token: str, server_name: str | None = None,
    engine: str = "torch", host: str = "127.0.0.1", admin_token: str | None = None,
    server_args: Sequence[str] = (), db_url: str | None = None, heartbeat_s: float = 10.0,
    time_limit_s: int = DEFAULT_TIME_LIMIT_S, cpus: int = 1, mem_mb: int | None = None, gpus: int = 0,
    nodes: int = 1, partition: str | None = None, log_dir: str | None = None,
    env: dict[str, str] | None = None,
) -> JobSpec:
    """A job serving `model` for training; its URL lands in `swarm_servers` under `server_name`.

    `host="0.0.0.0"` for clients on other nodes (the registered URL then names this
    node). `server_args` go to `swarm serve` as they are (e.g. --group-size, --max-steps).
    """
    server_name = server_name or name
    out = str(Path(out_dir).absolute())
    sup = [*_register("serve"), "--name", server_name, "--out", out, "--model", str(model),
           "--heartbeat", str(heartbeat_s)]
    if db_url:
        sup += ["--db", db_url]
    serve = [*swarm_argv(), "serve", "--model", str(model), "--host", host, "--port", "0",
             "--out", out, "--engine", engine, *server_args]
    job_env = {**SWARM_ENV, "ROOST_TOKEN": token, **(env or {})}
    if admin_token:
        job_env["ROOST_ADMIN_TOKEN"] = admin_token
    return JobSpec(name=name, command=[*sup, "--", *serve], env=job_env, time_limit_s=time_limit_s,
                   cpus=cpus, mem_mb=mem_mb, gpus=gpus, nodes=nodes, partition=partition,
                   log_dir=log_dir, setup=ray_setup(nodes, cpus, gpus) if engine == "verl" else [])


def client_fleet_job(
    name: str, *, server_name: str, token: str, task: str | None = None, workflow: str | None = None,
    dataset: str | None = None, clients: int = 1, group_size: int = 8,
    concurrency: int = 8, seed: int = 0, dataset_size: int = 256, client_args: Sequence[str] = (),
    db_url: str | None = None, wait_s: float = 600.0, time_limit_s: int = DEFAULT_TIME_LIMIT_S,
    cpus: int = 1, mem_mb: int | None = None, partition: str | None = None, log_dir: str | None = None,
    env: dict[str, str] | None = None,
) -> JobSpec:
    """A job running `clients` `swarm client` processes against the server named `server_name`.

    Plays a built-in `task`, or a `workflow` ("module:function") over a `dataset`
    ("module:function"). `concurrency` is per client. Client i plays the dataset of
    seed `seed*1000+i`.
    """
    if (task is None) == (workflow is None):
        raise ValueError("give exactly one of task= or workflow=")
    what = ["--task", task] if task is not None else ["--workflow", str(workflow)]
    if dataset is not None:
        what += ["--dataset", dataset]
    sup = [*_register("client"), "--name", server_name, "--clients", str(clients), "--seed", str(seed),
           "--wait", str(wait_s)]
    if db_url:
        sup += ["--db", db_url]
    cmd = [*swarm_argv(), "client", "--url", "{url}", *what, "--n", str(group_size),
           "--concurrency", str(concurrency), "--seed", "{seed}", "--dataset-size", str(dataset_size),
           *client_args]
    return JobSpec(name=name, command=[*sup, "--", *cmd], env={**SWARM_ENV, "ROOST_TOKEN": token, **(env or {})},
                   time_limit_s=time_limit_s, cpus=cpus, mem_mb=mem_mb, partition=partition, log_dir=log_dir)


@dataclass
class Trial:
    """One training run as jobs: a server and ≥ 1 client fleets sharing `group_key`."""

    group_key: str
    server: JobSpec
    fleets: list[JobSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.fleets:
            raise ValueError("a trial needs at least one client fleet")


def make_trial(group_key: str, *, model: str | Path, out_dir: str | Path, task: str | None = None,
               workflow: str | None = None, dataset: str | None = None, clients: int = 1,
               fleets: int = 1, group_size: int = 8, batch_groups: int = 4, concurrency: int = 8,
               seed: int = 0, dataset_size: int = 256, engine: str = "torch",
               server_args: Sequence[str] = (), db_url: str | None = None,
               time_limit_s: int = DEFAULT_TIME_LIMIT_S, server_cpus: int = 1,
               server_mem_mb: int | None = None, gpus: int = 0,
               nodes: int = 1, partition: str | None = None, log_dir: str | None = None,
               host: str = "127.0.0.1", token: str | None = None) -> Trial:
    """A trial with sensible pairing: same token, group size and seed on both sides."""
    token = token or secrets.token_urlsafe(16)
    server_name = f"{group_key}-server"
    server = swarm_server_job(
        server_name, model=model, out_dir=out_dir, token=token, engine=engine, host=host,
        server_args=["--group-size", str(group_size), "--batch-groups", str(batch_groups),
                     "--seed", str(seed), *server_args],
        db_url=db_url, time_limit_s=time_limit_s, cpus=server_cpus, mem_mb=server_mem_mb, gpus=gpus, nodes=nodes,
        partition=partition, log_dir=log_dir)
    fleet_specs = [client_fleet_job(
        f"{group_key}-fleet{k}", server_name=server_name, task=task, workflow=workflow, dataset=dataset,
        token=token, clients=clients,
        group_size=group_size, concurrency=concurrency, seed=seed * 100 + k, dataset_size=dataset_size,
        db_url=db_url, time_limit_s=time_limit_s, partition=partition, log_dir=log_dir)
        for k in range(fleets)]
    return Trial(group_key=group_key, server=server, fleets=fleet_specs)


def submit_trial(manager: JobManager, trial: Trial, backend: str = "local",
                 trial_id: int | None = None) -> list[JobRecord]:
    """Submit the server, then the fleets; on any failure cancel what was submitted."""
    records: list[JobRecord] = []
    try:
        for spec in (trial.server, *trial.fleets):
            records.append(manager.submit(spec, backend=backend, trial_id=trial_id, group_key=trial.group_key))
    except Exception:
        manager.cancel_group(trial.group_key)
        raise
    return records
