"""Roost's store: what the platform records (SQL) and what runs measured (MLflow).

    from store import init_db, session_scope, Job, JobState
    engine = init_db()                       # checks (and for SQLite, creates) the schema
    with session_scope(engine) as s:
        s.add(Job(name="server", backend="local", spec={"argv": [...]}))

    from store import RunLogger
    with RunLogger.start("study-42", run_name="arm=a seed=0", parent_run_id=parent) as run:
        run.log_params({"lr": 1e-5})
        run.log_metrics(step, {"reward": 0.4})   # buffered; flushed with log_batch

Modules: `models` (tables), `types` (UTC timestamps, JSON), `db` (URL resolution,
engines, sessions, schema checks), `migrate` (Alembic), `tracking` (MLflow),
`query` (metric histories), `plots`, `cli` (`swarm db ...`, `python -m store`).
The MLflow-backed names (`RunLogger`, `metric_histories`, `reward_curves`, ...) are
imported on first use: importing MLflow takes seconds, and the scheduler, which
only needs tables, should not pay for it.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from store.db import (
    StoreError,
    StoreNotMigrated,
    StoreTooNew,
    database_url,
    dispose_engines,
    get_engine,
    get_session,
    init_db,
    make_engine,
    require_current,
    session_scope,
)
from store.models import (
    Hypothesis,
    HypothesisStatus,
    Job,
    JobBackend,
    JobState,
    RunSummary,
    ServerStatus,
    Study,
    StudyStatus,
    SwarmServer,
    Trial,
    TrialStatus,
    metadata,
)
from store.types import JSONType, UTCDateTime, utcnow

_LAZY = {
    "RunLogger": "store.tracking",
    "tracking_uri": "store.tracking",
    "artifact_location": "store.tracking",
    "get_client": "store.tracking",
    "metric_histories": "store.query",
    "histories_frame": "store.query",
    "reward_curves": "store.plots",
}

if _typing.TYPE_CHECKING:
    from store.plots import reward_curves
    from store.query import histories_frame, metric_histories
    from store.tracking import RunLogger, artifact_location, get_client, tracking_uri


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Hypothesis",
    "HypothesisStatus",
    "JSONType",
    "Job",
    "JobBackend",
    "JobState",
    "RunLogger",
    "RunSummary",
    "ServerStatus",
    "StoreError",
    "StoreNotMigrated",
    "StoreTooNew",
    "Study",
    "StudyStatus",
    "SwarmServer",
    "Trial",
    "TrialStatus",
    "UTCDateTime",
    "artifact_location",
    "database_url",
    "dispose_engines",
    "get_client",
    "get_engine",
    "get_session",
    "histories_frame",
    "init_db",
    "make_engine",
    "metadata",
    "metric_histories",
    "require_current",
    "reward_curves",
    "session_scope",
    "tracking_uri",
    "utcnow",
]
