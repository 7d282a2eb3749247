"""Tables on SQLite and PostgreSQL: UTC timestamps, JSON, foreign keys, SQLite pragmas."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, StatementError
from sqlmodel import select

from store import (
    Hypothesis,
    Job,
    JobState,
    RunSummary,
    Study,
    SwarmServer,
    Trial,
    make_engine,
    migrate,
    session_scope,
    utcnow,
)
from store.db import get_session


@pytest.fixture
def engine(db_url: str):  # type: ignore[no-untyped-def]
    migrate.upgrade(db_url)
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def test_job_and_server_round_trip(engine) -> None:  # type: ignore[no-untyped-def]
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5)))
    with session_scope(engine) as s:
        study = Study(name="s", question="does lr matter?", config={"budget": {"trials": 6}})
        s.add(study)
        s.flush()
        trial = Trial(study_id=study.id, arm="lr-high", seed=2, config={"lr": 3e-5})
        s.add(trial)
        s.flush()
        job = Job(
            name="server",
            backend="slurm",
            external_id="1234",
            state=JobState.RUNNING,
            spec={"argv": ["swarm", "serve"], "env": {"A": "1"}, "nested": [1, {"x": None}]},
            stdout_path="/tmp/o",
            stderr_path="/tmp/e",
            time_limit_s=3600,
            started_at=started,
            trial_id=trial.id,
            group_key=f"trial-{trial.id}",
        )
        s.add(job)
        s.flush()
        s.add(
            SwarmServer(
                name="srv", url="http://127.0.0.1:1", model="tiny", status="UP", last_heartbeat=utcnow(), job_id=job.id
            )
        )
        job_id = job.id
    with get_session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        assert job.state == JobState.RUNNING and job.backend == "slurm" and job.external_id == "1234"
        assert job.spec == {"argv": ["swarm", "serve"], "env": {"A": "1"}, "nested": [1, {"x": None}]}
        assert job.started_at == started and job.started_at.tzinfo == UTC
        assert job.created_at.tzinfo == UTC and job.finished_at is None
        srv = s.exec(select(SwarmServer).where(SwarmServer.job_id == job_id)).one()
        assert srv.last_heartbeat is not None and srv.last_heartbeat.tzinfo == UTC
        running = s.exec(select(Job).where(Job.state == JobState.RUNNING)).all()
        assert [j.id for j in running] == [job_id]


def test_naive_datetimes_are_refused(engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StatementError, match="naive datetime"):
        with session_scope(engine) as s:
            s.add(Job(name="j", started_at=datetime(2026, 1, 1)))


def test_timestamps_are_utc_whatever_the_session_timezone(db_url: str) -> None:
    migrate.upgrade(db_url)
    kwargs = {}
    if db_url.startswith("postgresql"):
        kwargs["connect_args"] = {"options": "-c timezone=America/New_York"}
    eng = make_engine(db_url, **kwargs)
    when = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    try:
        with session_scope(eng) as s:
            s.add(Job(name="tz", started_at=when))
        with get_session(eng) as s:
            job = s.exec(select(Job).where(Job.name == "tz")).one()
            assert job.started_at == when
            assert job.started_at.utcoffset() == timedelta(0)
            later = s.exec(select(Job).where(Job.started_at > when - timedelta(seconds=1))).all()
            assert len(later) == 1
    finally:
        eng.dispose()


def test_updated_at_moves_on_update(engine) -> None:  # type: ignore[no-untyped-def]
    with session_scope(engine) as s:
        job = Job(name="j")
        s.add(job)
    first = job.updated_at
    time.sleep(0.01)
    with session_scope(engine) as s:
        j = s.get(Job, job.id)
        j.state = JobState.COMPLETED
        j.exit_code = 0
    with get_session(engine) as s:
        assert s.get(Job, job.id).updated_at > first


def test_foreign_keys_enforced_and_set_null(engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(IntegrityError):
        with session_scope(engine) as s:
            s.add(Job(name="orphan", trial_id=987654))
    with session_scope(engine) as s:
        study = Study(name="fk")
        s.add(study)
        s.flush()
        hyp = Hypothesis(study_id=study.id, statement="higher lr helps")
        s.add(hyp)
        s.flush()
        trial = Trial(study_id=study.id, hypothesis_id=hyp.id, arm="a", seed=0)
        s.add(trial)
        s.flush()
        s.add(Job(name="j", trial_id=trial.id))
        s.add(RunSummary(mlflow_run_id="r1", trial_id=trial.id, metrics={"reward": 0.5}))
        study_id = study.id
    with engine.begin() as conn:  # delete below the ORM: the database's rules act
        conn.execute(text("DELETE FROM studies WHERE id = :i"), {"i": study_id})
    with get_session(engine) as s:
        assert s.exec(select(Trial)).all() == []  # CASCADE from studies
        assert s.exec(select(RunSummary)).all() == []  # CASCADE from trials
        assert s.exec(select(Job)).one().trial_id is None  # SET NULL


def test_sqlite_pragmas(sqlite_url: str) -> None:
    eng = make_engine(sqlite_url)
    try:
        with eng.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    finally:
        eng.dispose()


def test_job_state_values() -> None:
    assert {s.value for s in JobState} == {
        "PENDING",
        "RUNNING",
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "UNKNOWN",
    }
    assert JobState.TIMEOUT.terminal and not JobState.RUNNING.terminal
    assert JobState("RUNNING") == "RUNNING"
