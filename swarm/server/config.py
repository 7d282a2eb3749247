"""`ServerConfig`: every knob of a swarm server, with help text, in one pydantic model.

The `swarm serve` options map one to one onto these fields; a config can also be
loaded from JSON/YAML by the scheduler (`ServerConfig.model_validate(data)`).
Training knobs live in `train` (the engine's `TrainConfig`, live-editable later).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.engine.base import TrainConfig
from swarm.server.quotas import QuotaPhase, check_quotas, check_schedule


def _default_model_dir() -> Path:
    from swarm.paths import default_model_dir

    return default_model_dir()


def _default_out_dir() -> Path:
    from swarm.paths import data_dir

    return data_dir() / "runs" / "serve"


class ServerConfig(BaseModel):
    """A swarm server: which model, how episodes become batches, where state goes."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(8000, ge=0, le=65535, description="0 picks a free port (printed at start)")
    public_url: str | None = Field(None, description="URL clients reach this server by (behind a proxy); "
                                                     "default: the URL the claim came in on")
    model_dir: Path = Field(default_factory=_default_model_dir, description="Hugging Face model dir")
    model_name: str | None = Field(None, description="name served on /v1/models; default: dir name")
    engine: str = Field("torch", description="torch | fake")
    device: str | None = Field(None, description="torch device; default cuda if available else cpu")
    seed: int = 0

    group_size: int = Field(8, ge=1, description="n: episodes per task_id in a group (GRPO baseline)")
    batch_groups: int = Field(4, ge=1, description="B: complete groups per optimisation step")
    max_steps: int | None = Field(None, ge=1, description="stop the server after this many steps")
    checkpoint_every: int = Field(10, ge=0, description="k: checkpoint every k steps (0: never)")
    checkpoint_on_stop: bool = Field(True, description="write a last checkpoint when stopping")
    keep_checkpoints: int | None = Field(None, ge=1, description="keep only the newest N checkpoints")
    out_dir: Path = Field(default_factory=_default_out_dir, description="metrics, checkpoints")
    resume: bool = Field(True, description="resume from out_dir/checkpoints/latest when present")

    token: str | None = Field(None, description="worker token (Bearer) for claims and status")
    admin_token: str | None = Field(None, description="admin token for /swarm/v1/admin/*")
    secret: str | None = Field(None, description="HMAC secret for episode keys; random if unset")

    train: TrainConfig = Field(default_factory=TrainConfig)
    merge: bool = Field(True, description="merge an episode's prefix-sharing calls into one sample")
    per_episode_norm: bool = Field(False, description="an episode's samples share a total loss weight of 1")
    continuity: Literal["exact", "retokenize"] = Field(
        "exact", description="exact: reuse generated ids in later prompts; retokenize: render afresh")
    temperature: float | None = Field(None, ge=0.0, le=2.0,
                                      description="force this sampling temperature on every call")
    default_temperature: float = Field(1.0, ge=0.0, le=2.0,
                                       description="sampling temperature of a call that names none")
    quotas: dict[str, float] | None = Field(
        None, description="share of the B groups of a batch per task family, e.g. {math: 0.4, code: 0.6}; "
                          "unnamed families share `other` (see swarm/server/quotas.py)")
    quota_schedule: list[QuotaPhase] | None = Field(
        None, description="quotas over steps: [{from_step: 0, quotas: {...}}, {from_step: 50, ...}]")
    log_rollouts: bool = Field(True, description="append finished episodes to out_dir/rollouts.jsonl")
    mlflow: bool = Field(False, description="also log params, per-step metrics and checkpoints to MLflow")
    mlflow_experiment: str = Field("swarm", description="MLflow experiment name")
    mlflow_run_name: str | None = Field(None, description="MLflow run name; default: the out_dir name")
    mlflow_parent_run_id: str | None = Field(None, description="nest the run under this one (a study)")

    default_max_tokens: int = Field(256, ge=1, description="when a request names no max_tokens")
    max_tokens_limit: int = Field(4096, ge=1, description="largest max_tokens a request may ask")
    max_body_bytes: int = Field(8 << 20, ge=1024, description="larger request bodies get 413")
    lease_seconds: float = Field(600.0, gt=0, description="episode lease (extended by heartbeats)")
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After sent with 429s")
    stop_grace_s: float = Field(1.0, ge=0, description="answer 503 'stopping' this long before exit")
    closed_episodes_kept: int = Field(100_000, ge=1, description="finished ids kept for idempotency")
    # robustness (leases.py, recovery.py): what survives dead clients, hung engines and kill -9
    group_stall_s: float | None = Field(
        300.0, gt=0, description="a group whose free slots nobody claims for this long completes smaller "
                                 "(a vanished client cannot hold a window forever); None: wait forever")
    durable_buffer: bool = Field(True, description="persist each finished episode (out_dir/buffer.sqlite, "
                                                   "WAL, synchronous=FULL) before acknowledging it")
    quota_borrow_s: float | None = Field(
        30.0, gt=0, description="once a window is this old, a family over its quota may take a slot another "
                                "family left unclaimed (a dead fleet cannot stall training); None: never")
    compact_buffer: bool = Field(True, description="after each checkpoint, drop the token ids of buffered "
                                                   "rows no restart can replay (keeps the buffer bounded)")
    max_staleness: int = Field(1, ge=0, description="after a restart, buffered episodes more than this many "
                                                    "policy versions away are dropped (dropped_stale)")
    failed_group_policy: Literal["drop", "keep"] = Field(
        "drop", description="a group with a failed episode: drop it, or keep training the rest (>= 2 left)")
    generate_timeout_s: float | None = Field(300.0, gt=0, description="an engine call running longer gets "
                                                                      "a 504 JSON error; None: no limit")

    @field_validator("quotas")
    @classmethod
    def _quotas(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return None if value is None else check_quotas(value)

    @field_validator("quota_schedule")
    @classmethod
    def _schedule(cls, value: list[QuotaPhase] | None) -> list[QuotaPhase] | None:
        return None if value is None else check_schedule(value)

    @model_validator(mode="after")
    def _one_quota_source(self) -> ServerConfig:
        if self.quotas is not None and self.quota_schedule is not None:
            raise ValueError("give quotas or quota_schedule, not both")
        return self

    def with_secrets(self) -> ServerConfig:
        """A copy with every missing token/secret generated (printed once by `serve`)."""
        return self.model_copy(update={
            "token": self.token or "swt-" + secrets.token_urlsafe(24),
            "admin_token": self.admin_token or "swa-" + secrets.token_urlsafe(24),
            "secret": self.secret or secrets.token_hex(32),
        })

    @property
    def served_model_name(self) -> str:
        return self.model_name or Path(self.model_dir).name or "roost"
