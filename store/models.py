"""The tables: what Roost records about studies, trials, jobs and servers.

One row per thing the platform must remember across process restarts:

    Study ─┬─ Hypothesis
           └─ Trial (arm × seed, config) ─┬─ Job (local pid / Slurm id)  ─── SwarmServer
                                          └─ RunSummary (final metrics, MLflow run id)

State columns are plain strings (not database enums) so adding a state never needs a
type migration on PostgreSQL; the allowed values live in the `StrEnum`s below, which
compare equal to the strings (`JobState.RUNNING == "RUNNING"`).

Every table derives from `StoreModel`, whose metadata (`StoreModel.metadata`, also
exported as `store.metadata`) holds only these tables, with a naming convention so
constraints have the same names on SQLite and PostgreSQL (needed by Alembic's batch
mode on SQLite). Change a table here, then add a migration:
`alembic revision --autogenerate -m "what changed"` from the repository root.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Column, ForeignKey, Index, Integer, MetaData, Text
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

from store.types import JSONType, UTCDateTime, utcnow

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StoreModel(SQLModel, registry=registry(metadata=metadata)):
    """Base of every store table; keeps them out of the global `SQLModel.metadata`."""


# ---------------------------------------------------------------- states


class JobState(StrEnum):
    """Lifecycle of a scheduler job (Slurm's vocabulary; local jobs map onto it)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_JOB_STATES


_TERMINAL_JOB_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})


class JobBackend(StrEnum):
    LOCAL = "local"
    SLURM = "slurm"


class ServerStatus(StrEnum):
    """A registered swarm server's status (see `SwarmServer`)."""

    STARTING = "STARTING"
    UP = "UP"
    DRAINING = "DRAINING"
    DOWN = "DOWN"
    STOPPED = "STOPPED"


class StudyStatus(StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class HypothesisStatus(StrEnum):
    OPEN = "OPEN"
    SUPPORTED = "SUPPORTED"
    REFUTED = "REFUTED"
    INCONCLUSIVE = "INCONCLUSIVE"


class TrialStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


# ---------------------------------------------------------------- helpers


def _ts(*, nullable: bool = True, index: bool = False, onupdate: bool = False) -> Any:
    """A UTC timestamp field; non-nullable ones default to now."""
    kwargs: dict[str, Any] = {}
    if onupdate:
        kwargs["sa_column_kwargs"] = {"onupdate": utcnow}
    if nullable:
        return Field(default=None, sa_type=UTCDateTime, nullable=True, index=index, **kwargs)
    return Field(default_factory=utcnow, sa_type=UTCDateTime, nullable=False, index=index, **kwargs)


def _json(*, nullable: bool = False) -> Any:
    if nullable:
        return Field(default=None, sa_type=JSONType, nullable=True)
    return Field(default_factory=dict, sa_type=JSONType, nullable=False)


def _fk(target: str, *, ondelete: str, index: bool = True) -> Any:
    return Field(
        default=None,
        sa_column=Column(Integer, ForeignKey(target, ondelete=ondelete), nullable=True, index=index),
    )


# ---------------------------------------------------------------- jobs and servers
# (the scheduler builds on these two: keep their fields stable)


class Job(StoreModel, table=True):
    """One process the scheduler launched (or will launch): a local pid or a Slurm job.

    `spec` is the full launch request (command, env, resources) so a job can be
    re-submitted or audited without the code that made it. `group_key` ties the
    jobs of one trial together (the trial's key): they are submitted once each by
    name within it, polled as one state and cancelled together.
    """

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_backend_external_id", "backend", "external_id"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(default="", max_length=255)
    backend: str = Field(default=JobBackend.LOCAL.value, max_length=16)
    external_id: str | None = Field(default=None, max_length=64)
    state: str = Field(default=JobState.PENDING.value, max_length=16, index=True)
    spec: dict[str, Any] = _json()
    exit_code: int | None = None
    reason: str | None = Field(default=None, sa_type=Text, description="why it failed or was cancelled")
    stdout_path: str | None = Field(default=None, max_length=1024)
    stderr_path: str | None = Field(default=None, max_length=1024)
    time_limit_s: int | None = None
    created_at: datetime = _ts(nullable=False)
    started_at: datetime | None = _ts()
    finished_at: datetime | None = _ts()
    updated_at: datetime = _ts(nullable=False, onupdate=True)
    trial_id: int | None = _fk("trials.id", ondelete="SET NULL")
    group_key: str | None = Field(default=None, max_length=255, index=True)


class SwarmServer(StoreModel, table=True):
    """A swarm server registered by name: its URL, model, status and last heartbeat.

    Meant for a server and its client fleets running as separate jobs (clients look
    the URL up by name; a stale heartbeat means the server is gone). No part of Roost
    writes it today: trials run `swarm train`, which keeps server and clients in one
    job on loopback. The table stays so existing databases need no migration.
    """

    __tablename__ = "swarm_servers"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(default="", max_length=255, index=True)
    url: str | None = Field(default=None, max_length=1024)
    model: str = Field(default="", max_length=1024)
    status: str = Field(default=ServerStatus.STARTING.value, max_length=16, index=True)
    last_heartbeat: datetime | None = _ts()
    job_id: int | None = _fk("jobs.id", ondelete="SET NULL")
    created_at: datetime = _ts(nullable=False)
    updated_at: datetime = _ts(nullable=False, onupdate=True)


# ---------------------------------------------------------------- research records


class Study(StoreModel, table=True):
    """A research question pursued over many trials; one MLflow parent run."""

    __tablename__ = "studies"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=255, unique=True)
    question: str = Field(default="", sa_type=Text)
    status: str = Field(default=StudyStatus.ACTIVE.value, max_length=16, index=True)
    config: dict[str, Any] = _json()
    mlflow_experiment_id: str | None = Field(default=None, max_length=64)
    mlflow_run_id: str | None = Field(default=None, max_length=64, index=True)
    report: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = _ts(nullable=False)
    updated_at: datetime = _ts(nullable=False, onupdate=True)
    finished_at: datetime | None = _ts()


class Hypothesis(StoreModel, table=True):
    """One claim a study tests, with the verdict once trials are analysed."""

    __tablename__ = "hypotheses"

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(
        sa_column=Column(Integer, ForeignKey("studies.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    statement: str = Field(sa_type=Text)
    rationale: str = Field(default="", sa_type=Text)
    status: str = Field(default=HypothesisStatus.OPEN.value, max_length=16)
    conclusion: dict[str, Any] | None = _json(nullable=True)
    created_at: datetime = _ts(nullable=False)
    updated_at: datetime = _ts(nullable=False, onupdate=True)


class Trial(StoreModel, table=True):
    """One training run: an arm (a configuration under test) with one seed.

    A trial is an MLflow child run of its study's run (`mlflow_run_id`).
    """

    __tablename__ = "trials"

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(
        sa_column=Column(Integer, ForeignKey("studies.id", ondelete="CASCADE"), nullable=False, index=True)
    )
    hypothesis_id: int | None = _fk("hypotheses.id", ondelete="SET NULL")
    arm: str = Field(max_length=255)
    seed: int = 0
    config: dict[str, Any] = _json()
    status: str = Field(default=TrialStatus.PENDING.value, max_length=16, index=True)
    mlflow_run_id: str | None = Field(default=None, max_length=64, index=True)
    created_at: datetime = _ts(nullable=False)
    updated_at: datetime = _ts(nullable=False, onupdate=True)
    started_at: datetime | None = _ts()
    finished_at: datetime | None = _ts()


class RunSummary(StoreModel, table=True):
    """Final metrics of one MLflow run, copied into the store for fast analysis."""

    __tablename__ = "run_summaries"

    id: int | None = Field(default=None, primary_key=True)
    mlflow_run_id: str = Field(max_length=64, unique=True)
    trial_id: int | None = _fk("trials.id", ondelete="CASCADE")
    metrics: dict[str, Any] = _json()
    created_at: datetime = _ts(nullable=False)
    updated_at: datetime = _ts(nullable=False, onupdate=True)


TABLES = (Study, Hypothesis, Trial, Job, SwarmServer, RunSummary)
