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
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.config.fleet import FleetConfig
from swarm.config.lora import LoraSettings
from swarm.config.options import Flag, deep_merge, dump_config
from swarm.config.policies import check_name
from swarm.config.server import ServerConfig
from swarm.config.train import TrainConfig
from swarm.run_layout import RUN_FILE
from swarm.tasks import get_task, list_tasks

#: the record in a run file of what the processes ran with (`run_file_text`); ignored on input
RAN = "ran"
#: the LoRA rank of `--shared-base` policies when the run gives none (policies on one base are adapters)
SHARED_BASE_RANK = 8
#: `swarm train` chooses these itself (a free port, tokens, the run's folders, the step count).
ORCHESTRATED = frozenset(
    {
        "server.host",
        "server.port",
        "server.ssl_certfile",
        "server.ssl_keyfile",
        "server.public_url",
        "server.out_dir",
        "server.token",
        "server.admin_token",
        "server.secret",
        "server.max_steps",
        "server.resume",
        "server.model_name",
    }
)


def train_server_defaults() -> ServerConfig:
    """The server of a `swarm train` run, before any flag: tuned for the embedded model on a laptop."""
    return ServerConfig(
        batch_groups=16, checkpoint_every=0, mlflow=True, mlflow_experiment="swarm-train", train=TrainConfig(lr=3e-4)
    )


def parse_mix(task: str) -> dict[str, float]:
    """'arith' -> {arith: 1}; 'arith+guess' -> equal shares; 'arith=3+guess=1' -> normalised shares.

    ValueError naming the problem: an unknown task, a task twice, a bad or
    non-positive share, or shares given for some tasks but not others.
    """
    parts = [p.strip() for p in task.split("+")]
    if not all(parts):
        raise ValueError(f"empty task name in {task!r}")
    named = [p.partition("=") for p in parts]
    mix: dict[str, float] = {}
    for name, sep, share in named:  # each task and share first: "arith=abc" is a bad share, not a missing one
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
    with_share = [sep == "=" for _, sep, _ in named]
    if any(with_share) and not all(with_share):
        raise ValueError(f"give a share for every task of the mix or for none: {task!r}")
    total = sum(mix.values())
    return {k: v / total for k, v in mix.items()}


class RunConfig(BaseModel):
    """A training run: what to train on, for how long, with which fleet, and the server's settings."""

    model_config = ConfigDict(extra="forbid")
    cli_panel: ClassVar[str] = "run"  # the --help panel of its fields (swarm/config/options.py)

    task: Annotated[str | None, Flag(default_text="arith, unless --workflow is given", panel="task and fleet")] = Field(
        None,
        description="built-in task (arith | guess | ...), or a mix: arith+guess (equal shares of each "
        "batch) or arith=0.75+guess=0.25 (shares are relative: arith=3+guess=1 is the same mix)",
    )
    workflow: Annotated[str | None, Flag(studied=False, panel="task and fleet")] = Field(
        None,
        description="your own agent: module:function(task, episode) -> reward (the current directory is "
        "importable); with --task, it plays that task's dataset",
    )
    dataset: Annotated[
        str | None,
        Flag(
            studied=False,
            panel="task and fleet",
            default_text="the task's, else a `dataset` function beside the workflow",
        ),
    ] = Field(None, description="module:function(seed, size) -> list of tasks for --workflow")
    out: Annotated[Path, Flag(studied=False)] = Field(
        Path("runs/train"), description="output directory (summary.json, run.yaml, server/, logs/)"
    )
    steps: Annotated[int, Flag(studied=False)] = Field(300, ge=1, description="optimisation steps to run")
    clients: Annotated[int, Flag(study=(1, 8), panel="task and fleet")] = Field(
        1, ge=1, description="client fleet processes per task"
    )
    concurrency: Annotated[int, Flag(study=(1, 512), panel="task and fleet")] = Field(
        128, ge=1, description="episodes in flight, over all clients"
    )
    dataset_size: Annotated[int, Flag(studied=False, panel="task and fleet")] = Field(
        100_000, ge=1, description="tasks drawn per fleet"
    )
    failure_streak: Annotated[int, Flag(studied=False, panel="task and fleet")] = Field(
        200, ge=0, description="failures in a row that stop the run (0: never)"
    )
    group_call: Annotated[
        bool | None, Flag(default_text="on for built-in tasks that support it (arith)", panel="task and fleet")
    ] = Field(
        None,
        description="sample each group in one call (n = group size, a reward per choice) instead of "
        "one episode per member: 1 HTTP call per group, the same GRPO samples. For one-call "
        "workflows that honour `episode.choices` (arith); --no-group-call: an episode per member",
    )
    timeout_s: Annotated[float, Flag(name="--timeout", studied=False)] = Field(
        3600.0, gt=0, description="give up after this many seconds"
    )
    shared_base: Annotated[bool, Flag(studied=False, panel="task and fleet")] = Field(
        False,
        description="a team task (duet): every role a LoRA policy of ONE server on one base model "
        "(a policy per role; --lora-rank, 8 unless given), played as team episodes; each role trains on its own",
    )
    team: Annotated[str | None, Flag(studied=False, panel="task and fleet")] = Field(
        None,
        description="ROLE=MODEL[,ROLE=MODEL...]: train a team (--task duet, or a --workflow whose module names its "
        "ROLES), each role its own model: a model directory, a preset name (swarm model init --preset) or "
        "`embedded`. Roles on one model share one server as LoRA policies; each other model gets its own "
        "server (docs/teams.md)",
    )
    attach: Annotated[Path | None, Flag(studied=False, panel="task and fleet")] = Field(
        None,
        description="the out folder of a running `swarm serve --policy ...` (LoRA policies on a shared base): "
        "this run is one more policy of that server (added by its admin API, removed at the end; the --lr and "
        "other step knobs, group and batch shape, LoRA, temperature and seed are the policy's), and only the "
        "client fleet runs here. The base model and engine must be the server's",
    )
    policy: Annotated[
        str | None, Flag(studied=False, panel="task and fleet", default_text="the --out folder's name")
    ] = Field(None, description="with --attach: the name of this run's policy on the server")
    server: ServerConfig = Field(default_factory=train_server_defaults)

    @model_validator(mode="before")
    @classmethod
    def _server_defaults(cls, data: Any) -> Any:
        """A partial `server:` mapping completes from the run's defaults, not `swarm serve`'s. A run
        file's `ran:` record is derived from the other fields (`run_file_text`): never read back."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != RAN}
        if isinstance(data, dict) and isinstance(data.get("server"), dict):
            base = train_server_defaults().model_dump(exclude_unset=False)
            return {**data, "server": deep_merge(base, data["server"])}
        return data

    @field_validator("attach", mode="before")
    @classmethod
    def _attach(cls, attach: Any) -> Any:
        if attach is not None and str(attach).startswith(("http:/", "https:/")):  # a Path folds "//" into "/"
            raise ValueError(
                "the out folder of a running `swarm serve`, not a URL: the run reads the server's URL and tokens there"
            )
        return attach

    @field_validator("task")
    @classmethod
    def _task(cls, task: str | None) -> str | None:
        if task is not None:
            parse_mix(task)
        return task

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.server.teacher and (self.shared_base or self.team):  # the server refused it after the run began
            raise ValueError(
                f"--teacher: a run of several policies ({'--shared-base' if self.shared_base else '--team'}) "
                "cannot distill yet; distill one model, without it"
            )
        if self.server.group_size < 2:
            raise ValueError("--group-size must be at least 2: a group baseline needs two episodes")
        if self.workflow is not None and self.task is not None and len(parse_mix(self.task)) > 1:
            raise ValueError("--workflow plays one dataset: give a single --task with it, not a mix")
        if self.workflow is None and self.dataset is not None:
            raise ValueError("--dataset goes with --workflow")
        if self.shared_base:
            if self.workflow is not None or len(self.mix) != 1 or not get_task(next(iter(self.mix))).roles:
                teams = ", ".join(t for t in list_tasks() if get_task(t).roles)
                raise ValueError(f"--shared-base trains the roles of one team task ({teams}) as policies of one server")
            if self.server.engine not in ("torch", "vllm", "fake"):
                raise ValueError("--shared-base: several policies on one base run in the torch and vllm engines")
        if self.team is not None and (self.shared_base or self.attach is not None):
            raise ValueError("--team starts a server per model itself: not with --shared-base or --attach")
        if self.attach is not None and self.shared_base:
            raise ValueError("--attach runs one policy on a server of policies; --shared-base starts its own")
        if self.policy is not None:
            if self.attach is None:
                raise ValueError("--policy names this run's policy on the server of --attach: give --attach too")
            check_name(self.policy)
        if self.server.deterministic and self.clients > 1:
            raise ValueError(
                "--deterministic: one client process per task (--clients 1; raise --concurrency instead): "
                "claims of several processes interleave by timing"
            )
        if self.server.deterministic and (self.team is not None or self.shared_base or self.attach is not None):
            raise ValueError("--deterministic: one policy on a server of its own (not --team, --shared-base, --attach)")
        if self.group_call and self.workflow is None:
            single = [t for t in self.mix if not get_task(t).group_call]
            if single:
                raise ValueError(
                    f"--group-call: task {', '.join(single)} does not sample a group in one call "
                    "(its workflow makes several calls or ignores episode.choices)"
                )
        return self

    @property
    def roles(self) -> tuple[str, ...]:
        """The policies of a `--shared-base` run (its team task's roles); () otherwise."""
        return get_task(next(iter(self.mix))).roles if self.shared_base else ()

    @property
    def trained_lora(self) -> LoraSettings:
        """The LoRA settings the run's server trains with: `--shared-base` roles are adapters (rank
        `SHARED_BASE_RANK` unless given) where the engine runs policies on one base. Both the server's start
        and the `--resume` check before it read this, so the two never disagree."""
        lora = self.server.lora
        if self.shared_base and not lora.enabled and self.server.engine in ("torch", "vllm"):
            return lora.model_copy(update={"rank": SHARED_BASE_RANK})
        return lora

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


#: the server fields `swarm train` sets on every start (`run.yaml` shows this run's values; a repeat sets them anew)
CHOSEN_BY_TRAIN = ("host", "port", "ssl_certfile", "ssl_keyfile", "out_dir", "max_steps", "resume")
#: what `run.yaml` records of each fleet `swarm train` derived from the run (the rest: fleet-*.yaml)
FLEET_RECORD = ("url", "task", "workflow", "dataset", "n", "choices", "concurrency", "seed")


def sibling(out: Path, n: int) -> Path:
    """Where the n-th run of `out`'s settings goes: runs/train -> runs/train-2, runs/train-3, ..."""
    return out.with_name(f"{out.name}-{n}")


def tracking_params(spec: RunConfig) -> dict[str, str]:
    """The run's own MLflow parameters, beside the server's settings (which the server logs itself, as
    it ran them: its group size 1 under the group call): what was trained on and by which fleets."""
    params = {
        "task": spec.task or (None if spec.workflow else "arith"),
        "workflow": spec.workflow,
        "dataset": spec.dataset,
        "group_call": spec.grouped,
        "choices": spec.server.group_size if spec.grouped else 1,
        "clients": spec.clients,
        "concurrency": spec.concurrency,
        "dataset_size": spec.dataset_size,
    }
    return {k: str(v) for k, v in params.items() if v is not None}


def run_file_text(spec: RunConfig, server: ServerConfig, fleets: dict[str, FleetConfig]) -> str:
    """`run.yaml`: the run's settings as they ran, so that reading it shows what ran and
    `swarm train --config run.yaml` repeats the run.

    `spec` fills its orchestrated server fields (port, out_dir, ...) with what `server` (the
    server's settings as started) used: they are shown, and chosen afresh on a repeat. Where the
    processes ran with a value derived from the settings (the server's group size 1 under the group
    call, its MLflow run name, a mix's quotas; each fleet's url, n, choices...), `ran:` records it;
    `RunConfig` drops `ran:` when the file is read.
    """
    taken = dump_config(server)
    recorded = dump_config(spec)
    for key in CHOSEN_BY_TRAIN:
        recorded["server"][key] = taken[key]
    ran = {
        "server": {k: v for k, v in taken.items() if recorded["server"].get(k) != v},
        "fleets": {
            name: {k: v for k, v in dump_config(fleet).items() if k in FLEET_RECORD and v is not None}
            for name, fleet in fleets.items()
        },
    }
    out = Path(recorded["out"])
    header = f"""\
# RunConfig of a `swarm train` run: the settings it ran with (secrets left out: the tokens are made
# anew for every run, the signing secret is in server/secrets.json).
#
# Repeat it:  swarm train --config {out / "run.yaml"}
#   This file names its own folder (out: {out}), so the repeat goes to a fresh sibling folder:
#   {sibling(out, 2)} (or -3, -4, ...: the first that holds no run), printed when it starts. Add
#   --out DIR to choose the folder, --resume to continue this run instead (to --steps in all),
#   --fresh to replace it.
# Recorded as they ran, chosen afresh on a repeat (swarm train orchestrates them): server.host
#   (127.0.0.1), server.port (a repeat picks a free port again: the port below is this run's, never
#   reserved), server.out_dir (<out>/server), server.max_steps (= steps), server.resume (--resume).
# ran: what the processes were started with where it differs from the settings above, derived
#   from them and ignored when this file is read: the server's group size is 1 under group_call
#   (a group is one call of server.group_size choices), its MLflow run name, a task mix's quotas;
#   each fleet's url, task, n, choices, concurrency and seed. Every setting: server.yaml, fleet-*.yaml.
"""
    return header + yaml.safe_dump({**recorded, RAN: ran}, sort_keys=False)


def write_run_file(out: Path, spec: RunConfig, server: ServerConfig, fleets: dict[str, FleetConfig]) -> Path:
    """`out/run.yaml` (`run_file_text`), replaced whole: a run killed while writing it leaves the old one.

    Written before the server starts (no fleets yet: their URL is the port the server binds), so a first
    run whose server never started can be resumed, and again with the fleets once it has said its URL.
    A start that fails before its server is up puts an earlier run's file back (swarm/train.py)."""
    path, tmp = out / RUN_FILE, out / f".{RUN_FILE}.tmp"
    tmp.write_text(run_file_text(spec, server, fleets))
    tmp.replace(path)
    return path


__all__ = [
    "CHOSEN_BY_TRAIN",
    "FLEET_RECORD",
    "ORCHESTRATED",
    "RAN",
    "RunConfig",
    "SHARED_BASE_RANK",
    "parse_mix",
    "run_file_text",
    "sibling",
    "tracking_params",
    "write_run_file",
    "train_server_defaults",
]
