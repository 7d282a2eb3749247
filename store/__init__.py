"""Roost's store: what the platform records (SQL) and what runs measured (MLflow).

    from store import init_db, session_scope, Job, JobState
    engine = init_db()                       # checks (and for SQLite, creates) the schema
    with session_scope(engine) as s:
        s.add(Job(name="server", backend="local", spec={"argv": [...]}))

    from store import RunLogger
    with RunLogger.start("study-42", run_name="arm=a seed=0", parent_run_id=parent) as run:
        run.log_params({"lr": 1e-5})
        run.log_metrics(step, {"reward": 0.4})   # buffered; flushed with log_batch

Modules: `paths` (the data directory; stdlib only), `models` (tables), `types` (UTC
timestamps, JSON), `db` (URL resolution, engines, sessions), `migrate` (Alembic),
`schema` (`init_db`, `require_current`), `tracking` (MLflow), `query` (metric
histories), `plots`, `testing` (a throwaway PostgreSQL), `cli` (`python -m store`).
Every public name is imported on first use: `import store.paths` stays stdlib-only,
and only callers of the MLflow-backed names (`RunLogger`, `metric_histories`,
`reward_curves`, ...) pay the seconds importing MLflow takes.
"""

from __future__ import annotations

import typing as _typing

from store.lazy import lazy_attributes as _lazy_attributes

# Public name -> module, imported on first use (PEP 562): `import store.paths` (which
# the client and the scheduler's job wrapper do) must not pull in SQLAlchemy, and
# nothing but `RunLogger` & co. should pay the seconds MLflow takes to import.
_LAZY = {
    "Hypothesis": "store.models",
    "HypothesisStatus": "store.models",
    "JSONType": "store.types",
    "Job": "store.models",
    "JobBackend": "store.models",
    "JobState": "store.models",
    "RunLogger": "store.tracking",
    "RunSummary": "store.models",
    "ServerStatus": "store.models",
    "StoreError": "store.schema",
    "StoreNotMigrated": "store.schema",
    "StoreTooNew": "store.schema",
    "Study": "store.models",
    "StudyStatus": "store.models",
    "SwarmServer": "store.models",
    "Trial": "store.models",
    "TrialStatus": "store.models",
    "UTCDateTime": "store.types",
    "artifact_location": "store.tracking",
    "database_url": "store.db",
    "dispose_engines": "store.db",
    "get_client": "store.tracking",
    "get_engine": "store.db",
    "get_session": "store.db",
    "histories_frame": "store.query",
    "init_db": "store.schema",
    "make_engine": "store.db",
    "metadata": "store.models",
    "metric_histories": "store.query",
    "require_current": "store.schema",
    "reward_curves": "store.plots",
    "session_scope": "store.db",
    "tracking_uri": "store.tracking",
    "utcnow": "store.types",
}

if _typing.TYPE_CHECKING:
    from store.db import database_url, dispose_engines, get_engine, get_session, make_engine, session_scope
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
    from store.plots import reward_curves
    from store.query import histories_frame, metric_histories
    from store.schema import StoreError, StoreNotMigrated, StoreTooNew, init_db, require_current
    from store.tracking import RunLogger, artifact_location, get_client, tracking_uri
    from store.types import JSONType, UTCDateTime, utcnow


__getattr__ = _lazy_attributes(__name__, _LAZY)


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
