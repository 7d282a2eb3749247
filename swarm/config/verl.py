"""`VerlSettings`: the verl engine's own knobs, nested in `ServerConfig` as `verl`.

Pure pydantic (no verl, no torch) so `ServerConfig` can carry them on a machine
without verl. Everything Roost already names (lr, clip, KL, advantage, loss
aggregation, batch and group sizes, temperature, checkpoints) comes from the
server's own fields through `swarm.engine.verl.config`; only what exists for verl
alone lives here: the cluster layout, the trainer mode and the memory split.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from swarm.config.options import Flag


class VerlMode(StrEnum):
    """verl V1 trainer mode (`trainer.v1.trainer_mode`); docs/verl.md, "Trainer mode", says why colocate_async."""

    colocate_async = "colocate_async"
    sync = "sync"


class VerlStrategy(StrEnum):
    """verl actor engine (`actor_rollout_ref.actor.strategy`)."""

    fsdp2 = "fsdp2"
    fsdp = "fsdp"


class VerlSettings(BaseModel):
    """Cluster layout and verl-only knobs of `swarm serve --engine verl`."""

    model_config = ConfigDict(extra="forbid")
    cli_panel: ClassVar[str] = "engine: verl"  # the --help panel of its fields (swarm/config/options.py)

    nodes: Annotated[int, Flag(name="--verl-nodes", studied=False)] = Field(
        1, ge=1, description="verl: nodes of the Ray cluster (trainer.nnodes)"
    )
    gpus_per_node: Annotated[int, Flag(name="--verl-gpus-per-node", studied=False)] = Field(
        8, ge=1, description="verl: GPUs per node (trainer.n_gpus_per_node)"
    )
    rollout_tp: Annotated[int, Flag(name="--verl-rollout-tp", studied=False)] = Field(
        1, ge=1, description="verl: vLLM tensor-parallel size per rollout replica"
    )
    gpu_memory_utilization: Annotated[float, Flag(name="--verl-gpu-memory", studied=False)] = Field(
        0.6, gt=0.0, le=1.0, description="verl: share of GPU memory vLLM takes while awake"
    )
    mode: Annotated[VerlMode, Flag(name="--verl-mode", studied=False)] = Field(
        VerlMode.colocate_async, description="verl: V1 trainer mode (colocate_async parks requests during a step)"
    )
    strategy: Annotated[VerlStrategy, Flag(name="--verl-strategy", studied=False)] = Field(
        VerlStrategy.fsdp2, description="verl: actor training engine"
    )
    max_prompt_tokens: Annotated[int, Flag(name="--verl-max-prompt-tokens", studied=False)] = Field(
        4096, ge=1, description="verl: longest prompt part of a sample (data.max_prompt_length)"
    )
    max_response_tokens: Annotated[int, Flag(name="--verl-max-response-tokens", studied=False)] = Field(
        8192, ge=1, description="verl: longest response part of a sample (data.max_response_length)"
    )
    max_off_policy: Annotated[int, Flag(name="--verl-max-off-policy", studied=False)] = Field(
        2, ge=1, description="verl: groups older than this many steps are dropped (colocate_async)"
    )
    param_offload: Annotated[bool, Flag(name="--verl-param-offload", studied=False)] = Field(
        False, description="verl: offload FSDP parameters to CPU between phases"
    )
    ray_address: Annotated[
        str | None, Flag(name="--verl-ray-address", studied=False, default_text="RAY_ADDRESS, else a local Ray")
    ] = Field(None, description="verl: Ray cluster to attach to (the Slurm job starts one and sets RAY_ADDRESS)")


__all__ = ["VerlMode", "VerlSettings", "VerlStrategy"]
