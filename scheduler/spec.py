"""What to run and where: the `JobSpec` every backend accepts.

A spec is a plain, serialisable request (it is stored verbatim in the `jobs` table so a
job can be audited or re-submitted without the code that made it):

    JobSpec(name="arith-server", command=["swarm", "serve", "--model", "DIR"],
            time_limit_s=2 * 3600, cpus=4, mem_mb=8000)

`time_limit_s` is always set (default one hour): a job without a limit is how a
cluster allocation quietly burns for a week. Slurm counts limits in whole minutes, so
the Slurm backend rounds up; the local backend enforces the exact number of seconds.

A submission is found again after a crash by what the spec already holds: its
`name`, its log directory, and the `ROOST_JOB_ID` the manager puts in its `env`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from store.paths import data_dir

DEFAULT_TIME_LIMIT_S = 3600

# The job manager puts the job's row id into every job's environment under this name:
# a job can find its own record, and a backend can tell two submissions of the same
# name apart when it looks for a lost one (`Backend.find`).
ENV_JOB_ID = "ROOST_JOB_ID"

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


class JobSpec(BaseModel):
    """A command to run as one job, with its resources and limits."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=_NAME_PATTERN, description="job name; also names log files, so letters, digits, _ . - only"
    )
    command: list[str] = Field(min_length=1, description="argv of the job's main process")
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment variables (added to the submitter's)"
    )
    cwd: str | None = Field(default=None, description="working directory; None: the submitter's")
    time_limit_s: int = Field(
        default=DEFAULT_TIME_LIMIT_S, ge=1, description="wall-clock limit; the job is killed (TIMEOUT) past it"
    )
    cpus: int = Field(default=1, ge=1, description="CPUs per node (Slurm --cpus-per-task)")
    mem_mb: int | None = Field(default=None, ge=1, description="memory per node in MB; None: cluster default")
    gpus: int = Field(default=0, ge=0, description="GPUs per node")
    nodes: int = Field(default=1, ge=1, description="nodes (Slurm only; the command runs on the first)")
    partition: str | None = Field(default=None, description="Slurm partition; None: the default one")
    log_dir: str | None = Field(default=None, description="where stdout/stderr go; None: <data dir>/jobs")
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run (bash, in the job) before the command, e.g. starting a Ray head",
    )
    light: bool = Field(
        default=False,
        description="a job that mostly waits on another (a shared-base trial's client fleet, whose model work "
        "the study's server does): the local backend starts it without taking one of its slots "
        "(ROOST_LOCAL_MAX_JOBS, one per CPU by default); Slurm allocates `cpus` as for any job",
    )
    slurm_args: list[str] = Field(default_factory=list, description="extra sbatch options, e.g. ['--begin=now+60']")

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not key or not (key[0].isalpha() or key[0] == "_") or not all(c.isalnum() or c == "_" for c in key):
                raise ValueError(f"not a valid environment variable name: {key!r}")
        return env

    def resolved_log_dir(self) -> Path:
        """The absolute log directory (created by the backend at submit time)."""
        if self.log_dir:
            return Path(self.log_dir).expanduser().absolute()
        return data_dir() / "jobs"
