"""`FleetConfig`: the settings of one client fleet, defined once.

`swarm client`'s options are derived from these fields (swarm/config/options.py);
`swarm client --config fleet.yaml` reads them from a file, and `swarm train`
writes one such file per fleet it starts (`OUT/fleet-<task>-<i>.yaml`). Light on
purpose: pydantic only, so a client install needs no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from swarm.config.options import Flag


class FleetConfig(BaseModel):
    """Which server, which workflow over which dataset, and how hard to push."""

    model_config = ConfigDict(extra="forbid")
    cli_panel: ClassVar[str] = "task and fleet"  # the --help panel of its fields (swarm/config/options.py)

    url: Annotated[str, Flag(envvar="ROOST_URL")] = Field("http://127.0.0.1:8000", description="swarm server URL")
    token: Annotated[str | None, Flag(envvar="ROOST_TOKEN")] = Field(None, description="worker token")
    policy: Annotated[str | None, Flag(studied=False, default_text="the server's first")] = Field(
        None, description="the policy this fleet's episodes train, on a server of several (swarm serve --policy)"
    )
    team: Annotated[str | None, Flag(studied=False)] = Field(
        None,
        description="ROLE,ROLE,...: play a team task with one episode per role, each claimed for the policy "
        "of that name on the server (swarm serve --policy ROLE ...); ROLE=URL: that role's episodes on the "
        "server at URL (its policy or model named ROLE: swarm train --team); the workflow gets a TeamEpisode",
    )
    workflow: str | None = Field(None, description="module:function(task, episode) -> reward")
    task: str | None = Field(None, description="built-in task (arith, guess, ...)")
    dataset: str | None = Field(None, description="module:function(seed, size) -> list of tasks")
    n: Annotated[int, Flag(name="--n", short="-n")] = Field(
        8, ge=1, description="episodes per task (the server's group size)"
    )
    choices: int = Field(
        1,
        ge=1,
        le=128,
        description="choices per call: k > 1 samples a group in one call "
        "(the workflow asks for n=k and returns a reward per choice; the server's group "
        "size is then 1)",
    )
    concurrency: Annotated[int, Flag(short="-c")] = Field(8, ge=1, description="episodes in flight")
    dataset_size: int = Field(64, ge=1, description="tasks drawn from the dataset")
    seed: int = Field(0, description="dataset seed")
    deterministic: Annotated[bool, Flag(studied=False)] = Field(
        False,
        description="claim in hand-out order, one claim at a time, so the server's batches hold the dataset's "
        "tasks in its order whatever the timing (a `swarm serve --deterministic` server's fleet)",
    )
    max_episodes: int | None = Field(None, ge=1, description="stop after this many episodes")
    epochs: Annotated[int | None, Flag(default_text="until stopped")] = Field(
        None, ge=1, description="passes over the dataset"
    )
    max_attempts: int = Field(3, ge=1, description="tries per job when a workflow fails")
    failure_streak: int = Field(
        200,
        ge=0,
        description="stop the fleet (exit 3) after this many workflow failures in a row, no episode finished "
        "between them: a workflow that fails on every task; 0: never",
    )
    retries: int = Field(6, ge=0, description="retries of a request on connection errors")
    reconnect_s: float = Field(
        120.0, ge=0.0, description="once connected, keep reconnecting this long (server restarts)"
    )
    state: Annotated[Path | None, Flag(default_text="ROOST_HOME/client-state/<key>.json")] = Field(
        None,
        description="dataset cursor file, so a restart continues where it stopped (by default one per url, "
        "workflow, dataset, seed and policy)",
    )


__all__ = ["FleetConfig"]
