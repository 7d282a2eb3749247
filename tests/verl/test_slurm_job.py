"""The Slurm job that hosts `swarm serve --engine verl` on N nodes (scheduler.verl); no verl needed."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from pydantic import ValidationError

# the scheduler needs the store's tables (sqlmodel): this test runs in the main venv, not .venv-verl
pytest.importorskip("sqlmodel", reason="scheduler's dependencies are in the main venv, where this test runs")

from scheduler.slurm import render_script
from scheduler.verl import VerlJob, verl_job, verl_trial_shape

ARGV = ["swarm", "serve", "--engine", "verl", "--verl-nodes", "2", "--verl-gpus-per-node", "8"]


def test_job_starts_ray_on_every_node_then_serves(tmp_path) -> None:
    spec = verl_job(
        VerlJob(
            name="swarm-verl",
            serve_argv=ARGV,
            nodes=2,
            gpus_per_node=8,
            cpus_per_node=64,
            log_dir=str(tmp_path),
            network_interface="ib0",
        )
    )
    script = render_script(spec)
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert 'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))' in script  # an array, not one string
    assert "ray start --head" in script and '--address="$head_ip:6379"' in script
    assert script.index("export RAY_ADDRESS=") < script.index("swarm serve --engine verl")
    assert "NCCL_SOCKET_IFNAME=ib0" in script
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    shape = verl_trial_shape("trial-1", spec)
    assert shape.jobs[0].command == ARGV


def test_too_few_cpus_or_a_mismatched_argv_is_refused() -> None:
    with pytest.raises(ValidationError, match="verl reserves 3 CPUs per GPU"):
        VerlJob(name="j", serve_argv=ARGV, nodes=2, gpus_per_node=8, cpus_per_node=16)
    with pytest.raises(ValidationError, match="--verl-nodes 2 but the job has 4"):
        VerlJob(name="j", serve_argv=ARGV, nodes=4, gpus_per_node=8, cpus_per_node=64)
