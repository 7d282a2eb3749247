"""A Slurm job that hosts `swarm serve --engine verl` on N nodes, Ray started inside the job.

    spec = verl_job(VerlJob(name="swarm-verl", serve_argv=["swarm", "serve", "--engine", "verl",
                                                          "--verl-nodes", "2", "--verl-gpus-per-node", "8"],
                            nodes=2, gpus_per_node=8, cpus_per_node=64))
    shape = verl_trial_shape("trial-7", spec)          # submit_trial(manager, shape, backend="slurm")

The batch script runs on the allocation's first node. Its `setup` (docs/verl.md, "Ray and Slurm":
verl's documented "Ray on Slurm" recipe with its two known bugs fixed):

1. nodes from `scontrol show hostnames` split into an array (`nodes=($(...))`, not the
   quoted form of verl's example, which makes one element of all names);
2. `ray start --head` on this node at a fixed port, then one `srun --overlap -w NODE
   ray start --address HEAD:PORT --block` per other node, in the background;
3. wait until Ray reports all N nodes alive, then export `RAY_ADDRESS`, which the verl
   engine attaches to (it never starts its own Ray inside a job).

`--cpus-per-task` must leave verl 3 CPUs per GPU (its placement bundles) plus room for
TransferQueue, the TaskRunner and the swarm server: checked here. The scheduler never
imports `swarm`: the caller passes the serve argv as plain data.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler.spec import DEFAULT_TIME_LIMIT_S, JobSpec
from scheduler.trial import TrialShape

CPUS_PER_GPU = 3  # verl: max_colocate_count CPUs reserved per GPU bundle
SPARE_CPUS = 4  # TransferQueue storage units, TaskRunner, reward workers, the swarm server


class VerlJob(BaseModel):
    """What a verl swarm-server job needs: its argv, the cluster shape, the Ray ports."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Slurm job name")
    serve_argv: list[str] = Field(min_length=1, description="the `swarm serve --engine verl ...` argv")
    nodes: int = Field(1, ge=1, description="nodes; must equal the server's --verl-nodes")
    gpus_per_node: int = Field(8, ge=1, description="GPUs per node; must equal --verl-gpus-per-node")
    cpus_per_node: int = Field(64, ge=1, description="CPUs per node (Slurm --cpus-per-task)")
    mem_mb: int | None = Field(None, ge=1, description="memory per node in MB")
    time_limit_s: int = Field(DEFAULT_TIME_LIMIT_S, ge=1, description="wall-clock limit")
    partition: str | None = Field(None, description="Slurm partition")
    ray_port: int = Field(6379, ge=1, le=65535, description="Ray head port (GCS)")
    ray_wait_s: int = Field(300, ge=1, description="how long to wait for every node to join Ray")
    network_interface: str | None = Field(None, description="e.g. ib0: NCCL/GLOO_SOCKET_IFNAME")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    log_dir: str | None = Field(None, description="log directory; None: <data dir>/jobs")
    cwd: str | None = Field(None, description="working directory")

    @model_validator(mode="after")
    def _enough_cpus(self) -> VerlJob:
        need = CPUS_PER_GPU * self.gpus_per_node + SPARE_CPUS
        if self.cpus_per_node < need:
            raise ValueError(
                f"cpus_per_node {self.cpus_per_node} < {need}: verl reserves {CPUS_PER_GPU} CPUs per "
                f"GPU and needs {SPARE_CPUS} more for TransferQueue, its TaskRunner and the server"
            )
        argv = self.serve_argv
        for flag, want in (("--verl-nodes", self.nodes), ("--verl-gpus-per-node", self.gpus_per_node)):
            if flag in argv and argv.index(flag) + 1 < len(argv) and argv[argv.index(flag) + 1] != str(want):
                raise ValueError(f"serve_argv says {flag} {argv[argv.index(flag) + 1]} but the job has {want}")
        return self


def ray_setup(job: VerlJob) -> list[str]:
    """Bash lines (run on the first node, inside the allocation) that bring up Ray on every node."""
    port, cpus, gpus = job.ray_port, job.cpus_per_node, job.gpus_per_node
    lines = [
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        "head=${nodes[0]}",
        "head_ip=$(srun --overlap --nodes=1 --ntasks=1 -w \"$head\" hostname --ip-address | awk '{print $1}')",
        f'ray start --head --node-ip-address="$head_ip" --port={port} --num-cpus={cpus} --num-gpus={gpus} '
        "--disable-usage-stats",
        'for node in "${nodes[@]:1}"; do',
        f'  srun --overlap --nodes=1 --ntasks=1 -w "$node" ray start --address="$head_ip:{port}" '
        f"--num-cpus={cpus} --num-gpus={gpus} --block --disable-usage-stats &",
        "done",
        f'export RAY_ADDRESS="$head_ip:{port}"',
        f"deadline=$((SECONDS + {job.ray_wait_s}))",
        "until [ \"$(python3 -c 'import ray; ray.init(); "
        'print(sum(n["Alive"] for n in ray.nodes()))\' 2>/dev/null | tail -n1)" = "${#nodes[@]}" ]; do',
        '  if [ "$SECONDS" -ge "$deadline" ]; then echo "ray: not every node joined" >&2; exit 1; fi',
        "  sleep 5",
        "done",
        'echo "ray: ${#nodes[@]} nodes up at $RAY_ADDRESS"',
    ]
    if job.network_interface:
        iface = shlex.quote(job.network_interface)
        lines[:0] = [f"export NCCL_SOCKET_IFNAME={iface} GLOO_SOCKET_IFNAME={iface}"]
    return lines


def verl_job(job: VerlJob) -> JobSpec:
    """The `JobSpec` of one verl swarm-server job (submit with the Slurm backend)."""
    return JobSpec(
        name=job.name,
        command=list(job.serve_argv),
        env=dict(job.env),
        cwd=job.cwd,
        time_limit_s=job.time_limit_s,
        cpus=job.cpus_per_node,
        mem_mb=job.mem_mb,
        gpus=job.gpus_per_node,
        nodes=job.nodes,
        partition=job.partition,
        log_dir=job.log_dir,
        setup=ray_setup(job),
    )


def verl_trial_shape(key: str, spec: JobSpec) -> TrialShape:
    """A trial whose one job is the verl server (client fleets, if any, are added by the caller)."""
    return TrialShape(key=key, jobs=[spec])


__all__ = ["VerlJob", "ray_setup", "verl_job", "verl_trial_shape"]
