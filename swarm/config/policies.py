"""`PolicySpec`: one named policy of a server that trains several LoRA adapters on one base model.

    swarm serve --lora-rank 8 --policy planner --policy executor     # same settings, two policies
    # or, in a --config file:
    policies:
      - {name: planner, train: {lr: 1.0e-4}}
      - {name: executor, lora: {rank: 16}, group_size: 8}

A spec names what may differ between policies of one server: the adapter (`lora`), the
step's knobs (`train`: lr, clip, KL, entropy, advantage, loss aggregation...), the group and
batch shape, the staleness bound, the sampling temperature and the seed. Anything left out is
the server's. What cannot differ (the base model, the engine, the timeline merge, the host and
tokens) is not a field here, so a spec cannot ask for it. `ServerConfig.for_policy` turns a spec
into the config of that policy's own `Swarm` (its own out folder, model name, windows, metrics).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.config.lora import LoraSettings

#: a policy's name is also its model name, its out folder's name and its MLflow run's suffix
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
RESERVED = frozenset({"default", "__base__", "policies"})


def check_name(name: str) -> str:
    """`name` if it can name a policy; ValueError saying what a name may be otherwise."""
    if not NAME.fullmatch(name) or name in RESERVED:
        raise ValueError(
            f"policy name {name!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or "
            f"digit (not {', '.join(sorted(RESERVED))})"
        )
    return name


class PolicySpec(BaseModel):
    """One policy of a shared base: its name and what it sets differently from the server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the policy's name: requests pick it as `model`, claims as `policy`")
    lora: LoraSettings | None = Field(
        None, description="its adapter: the fields given here over the server's --lora-* settings"
    )
    train: dict[str, Any] = Field(
        default_factory=dict, description="TrainConfig fields that differ from the server's (lr, kl_coef...)"
    )
    group_size: int | None = Field(None, ge=1, le=1024)
    batch_groups: int | None = Field(None, ge=1, le=4096)
    max_staleness: int | None = Field(None, ge=0)
    max_steps: int | None = Field(
        None, ge=1, description="this policy stops after so many steps (the server exits once every policy has stopped)"
    )
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    seed: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _only_what_may_differ(cls, data: Any) -> Any:
        """A setting that is the server's for every policy (its model, engine, merge...) named here is
        refused with that reason, not pydantic's bare "extra inputs are not permitted"."""
        if isinstance(data, dict):
            other = sorted(set(data) - set(cls.model_fields))
            if other:
                raise ValueError(
                    f"{', '.join(other)}: not a setting a policy can change (policies share the server's base "
                    f"model, engine, merge and the rest); a policy may set {', '.join(cls.model_fields)}"
                )
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_name(value)


def per_policy(path: tuple[str, ...]) -> bool:
    """Whether a `swarm train` setting (its path in `RunConfig`) can differ between policies of one
    server: the fleet's own (task, clients, concurrency...) and the server settings `PolicySpec` holds
    (`server.train.*`, `server.lora.*`, the group and batch shape, staleness, temperature, seed)."""
    if path[0] != "server":
        return path[0] not in ("attach", "policy", "shared_base")
    return len(path) > 1 and (path[1] in ("train", "lora") or path[1] in PolicySpec.model_fields)


__all__ = ["NAME", "RESERVED", "PolicySpec", "check_name", "per_policy"]
