"""`RunConfig`: one `swarm train` run, a server and its client fleets, defined once.

`swarm train`'s options, `swarm train --config run.yaml`, the `OUT/run.yaml` each
run writes, and the researcher's knobs (researcher/experiment.py) all derive from
these fields. The server's settings are a whole `ServerConfig` (`server:`), whose
defaults for a training run differ from `swarm serve`'s in the few places named
in `train_server_defaults` (bigger batches, a learning rate tuned for the embedded
model, MLflow on, checkpoints at the end only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.engine.base import TrainConfig
from swarm.options import Flag, deep_merge
from swarm.server.config import ServerConfig
from swarm.tasks import get_task, list_tasks

#: `swarm train` chooses these itself (a free port, tokens, the run's folders, the step count).
ORCHESTRATED = frozenset({"server.host", "server.port", "server.public_url", "server.out_dir", "server.token",
                          "server.admin_token", "server.secret", "server.max_steps", "server.resume",
                          "server.model_name"})


def train_server_defaults() -> ServerConfig:
    """The server of a `swarm train` run, before any flag: tuned for the embedded model on a laptop."""
    return ServerConfig(batch_groups=16, checkpoint_every=0, mlflow=True, mlflow_experiment="swarm-train",
                        train=TrainConfig(lr=3e-4))


def parse_mix(task: str) -> dict[str, float]:
    """'arith' -> {arith: 1}; 'arith+guess' -> equal shares; 'arith=3+guess=1' -> normalised shares.

    ValueError naming the problem: an unknown task, a task twice, a bad or
    non-positive share, or shares given for some tasks but not others.
    """
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


class RunConfig(BaseModel):
    """A training run: what to train on, for how long, with which fleet, and the server's settings."""

    model_config = ConfigDict(extra="forbid")

    task: Annotated[str | None, Flag(default_text="arith, unless --workflow is given")] = Field(
        None, description="built-in task (arith | guess | ...), or a mix: arith+guess (equal shares of each "
                          "batch) or arith=0.75+guess=0.25")
    workflow: Annotated[str | None, Flag(studied=False)] = Field(
        None, description="your own agent: module:function(task, episode) -> reward (the current directory is "
                          "importable); with --task, it plays that task's dataset")
    dataset: Annotated[str | None, Flag(studied=False, default_text="the task's, else a `dataset` function "
                                                                    "beside the workflow")] = Field(
        None, description="module:function(seed, size) -> list of tasks for --workflow")
    out: Annotated[Path, Flag(studied=False)] = Field(
        Path("runs/train"), description="output directory (summary.json, run.yaml, server/, logs/)")
    steps: Annotated[int, Flag(studied=False)] = Field(300, ge=1, description="optimisation steps to run")
    clients: Annotated[int, Flag(study=(1, 8))] = Field(1, ge=1, description="client fleet processes per task")
    concurrency: Annotated[int, Flag(study=(1, 512))] = Field(
        128, ge=1, description="episodes in flight, over all clients")
    dataset_size: Annotated[int, Flag(studied=False)] = Field(100_000, ge=1, description="tasks drawn per fleet")
    group_call: Annotated[bool | None, Flag(default_text="on for built-in tasks that support it (arith)")] = Field(
        None, description="sample each group in one call (n = group size, a reward per choice) instead of "
                          "one episode per member: 1 HTTP call per group, the same GRPO samples. For one-call "
                          "workflows that honour `episode.choices` (arith); --no-group-call: an episode per member")
    timeout_s: Annotated[float, Flag(name="--timeout", studied=False)] = Field(
        3600.0, gt=0, description="give up after this many seconds")
    server: ServerConfig = Field(default_factory=train_server_defaults)

    @model_validator(mode="before")
    @classmethod
    def _server_defaults(cls, data: Any) -> Any:
        """A partial `server:` mapping completes from the run's defaults, not `swarm serve`'s."""
        if isinstance(data, dict) and isinstance(data.get("server"), dict):
            base = train_server_defaults().model_dump(exclude_unset=False)
            return {**data, "server": deep_merge(base, data["server"])}
        return data

    @field_validator("task")
    @classmethod
    def _task(cls, task: str | None) -> str | None:
        if task is not None:
            parse_mix(task)
        return task

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.server.group_size < 2:
            raise ValueError("server.group_size must be at least 2: a group baseline needs two episodes")
        if self.workflow is not None and self.task is not None and len(parse_mix(self.task)) > 1:
            raise ValueError("--workflow plays one dataset: give a single --task with it, not a mix")
        if self.workflow is None and self.dataset is not None:
            raise ValueError("--dataset goes with --workflow")
        if self.group_call and self.workflow is None:
            single = [t for t in self.mix if not get_task(t).group_call]
            if single:
                raise ValueError(f"--group-call: task {', '.join(single)} does not sample a group in one call "
                                 "(its workflow makes several calls or ignores episode.choices)")
        return self

    @property
    def grouped(self) -> bool:
        """Whether each group is one episode with one n-choice call (`group_call`, or its default)."""
        if self.group_call is not None:
            return self.group_call
        return self.workflow is None and all(get_task(t).group_call for t in self.mix)

    @property
    def name(self) -> str:
        """What the run trains on, for progress lines and run names."""
        if self.workflow is not None:
            return self.workflow.rpartition(":")[2] or self.workflow
        return self.task or "arith"

    @property
    def mix(self) -> dict[str, float]:
        """Built-in task -> share of each batch (empty for a workflow without --task)."""
        if self.workflow is not None:
            return {self.task: 1.0} if self.task else {}
        return parse_mix(self.task or "arith")


__all__ = ["ORCHESTRATED", "RunConfig", "parse_mix", "train_server_defaults"]
