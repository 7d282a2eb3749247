"""`ServerConfig`: every knob of a swarm server, with help text, in one pydantic model.

The `swarm serve` options map one to one onto these fields; a config can also be
loaded from JSON/YAML by the scheduler (`ServerConfig.model_validate(data)`).
Training knobs live in `train` (the engine's `TrainConfig`, live-editable later).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from swarm.engine.base import TrainConfig


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
