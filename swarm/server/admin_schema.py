"""Bodies of the live-control admin routes (`/swarm/v1/admin/config`), and which knob is which.

    TRAIN_KEYS   training knobs: apply from the next optimisation step that starts
    WINDOW_KEYS  window knobs: apply from the next on-policy window (see `control.py`)

`LiveConfigUpdate` is partial (only the fields present change) and strict
(unknown fields are refused, so a typo is a 400, not a silent no-op).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from swarm.algorithms.choices import Advantage, LossAgg
from swarm.config.quotas import QuotaPhase, check_quotas, check_schedule
from swarm.config.server import ServerConfig
from swarm.config.train import TrainConfig
from swarm.protocol import Count, Number


def start_time_settings() -> frozenset[str]:
    """The server's and its training's settings by field name (those of `LiveConfigUpdate` aside)."""
    return frozenset(ServerConfig.model_fields) | frozenset(TrainConfig.model_fields)


TRAIN_KEYS = ("lr", "kl_coef", "entropy_coef", "clip_eps", "max_grad_norm", "advantage", "loss_agg", "ppo_epochs")
WINDOW_KEYS = ("temperature", "default_temperature", "batch_groups", "quotas", "quota_schedule")
NULLABLE = {"temperature", "quotas", "quota_schedule"}


class LiveConfigUpdate(BaseModel):
    """A partial update: only the fields present change. Unknown fields are refused (typos)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    lr: Number | None = Field(None, gt=0.0, le=1.0, description="learning rate (next step)")
    kl_coef: Number | None = Field(None, ge=0.0, le=100.0, description="KL coefficient (next step)")
    entropy_coef: Number | None = Field(None, ge=-10.0, le=10.0, description="entropy bonus (next step)")
    clip_eps: Number | None = Field(None, gt=0.0, le=10.0, description="PPO clip epsilon (next step)")
    max_grad_norm: Number | None = Field(None, gt=0.0, le=1e6, description="gradient clip (next step)")
    advantage: Advantage | None = Field(None, description="group advantage estimator (next step)")
    loss_agg: LossAgg | None = Field(None, description="loss aggregation (next step)")
    ppo_epochs: Count | None = Field(None, ge=1, le=64, description="updates per step over its batch (next step)")
    temperature: Number | None = Field(
        None, ge=0.0, le=2.0, description="force this temperature on every call; null: stop forcing"
    )
    default_temperature: Number | None = Field(None, ge=0.0, le=2.0, description="temperature of calls that name none")
    batch_groups: Count | None = Field(None, ge=1, le=100_000, description="B: groups per step")
    quotas: dict[str, Number] | None = Field(None, description="family -> share; null: no quotas")
    quota_schedule: list[QuotaPhase] | None = Field(None, description="quotas over steps; null: none")

    @model_validator(mode="before")
    @classmethod
    def _start_time_settings(cls, data: Any) -> Any:
        """A setting of the server that is not live (`distill_coef`, `group_size`) is said as such: the
        unknown-field message offered the nearest live name (`kl_coef`), another knob altogether."""
        if isinstance(data, dict):
            fixed = sorted(k for k in data if k not in cls.model_fields and k in start_time_settings())
            if fixed:
                raise PydanticCustomError(
                    "start_time_setting",
                    "{keys}: set when the server starts (swarm serve --{flag} ..., or its config file), not on a "
                    "running server; the live settings: " + ", ".join(cls.model_fields),
                    {"keys": ", ".join(fixed), "flag": fixed[0].replace("_", "-")},
                )
        return data

    @model_validator(mode="after")
    def _check(self) -> LiveConfigUpdate:
        given = self.model_fields_set
        if not given:
            raise ValueError("name at least one setting to change")
        for key in given - NULLABLE:
            if getattr(self, key) is None:
                raise ValueError(f"{key} cannot be null")
        if self.quotas is not None:
            check_quotas(self.quotas)
        if self.quota_schedule is not None:
            check_schedule(self.quota_schedule)
        if self.quotas is not None and self.quota_schedule is not None:
            raise ValueError("give quotas or quota_schedule, not both")
        return self

    def changes(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.model_fields_set}
        if "quotas" in out or "quota_schedule" in out:  # one replaces the other
            out.setdefault("quotas", None)
            out.setdefault("quota_schedule", None)
        return out


class LiveConfigResponse(BaseModel):
    model_config = ConfigDict(extra="allow")

    live: dict[str, Any] = Field(description="values in force now")
    pending: dict[str, Any] = Field(description="window settings that apply when the next window opens")
    paused: bool
    step: int
    window: int
    quotas: dict[str, Any] = Field(description="quotas, active split, slots and used slots of this window")
    changed: dict[str, Any] | None = Field(None, description="(POST) what this request changed: old, new")
