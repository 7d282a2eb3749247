"""Fixtures for the store tests: isolated data dirs, a real PostgreSQL, MLflow stores.

PostgreSQL: one throwaway cluster per test session (initdb + pg_ctl as user
`postgres`, free loopback port, stopped and deleted at the end), one fresh database
per test. Without the server binaries the PostgreSQL cases are skipped, unless `CI`
or `ROOST_REQUIRE_POSTGRES=1` is set: then they fail, so CI cannot go green by
silently testing SQLite only.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.db import dispose_engines
from store.testing import PostgresServer, postgres_available, start_postgres


def postgres_required() -> bool:
    ci = os.environ.get("CI", "").strip().lower()
    return ci not in ("", "0", "false", "no") or os.environ.get("ROOST_REQUIRE_POSTGRES") == "1"


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Never touch ~ or the developer's databases; no telemetry."""
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "roost-home"))
    monkeypatch.delenv("ROOST_DATABASE_URL", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    yield
    dispose_engines()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    reason = postgres_available()
    if reason:
        if postgres_required():
            pytest.fail(f"PostgreSQL is required here (CI / ROOST_REQUIRE_POSTGRES=1): {reason}")
        pytest.skip(reason)
    with start_postgres() as pg:
        yield pg


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = postgres_server.create_database(name)
    yield url
    dispose_engines()
    postgres_server.drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs on SQLite and on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One local MLflow store for the session (creating one costs several seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
