"""Fixtures for the store tests: isolated data dirs, a real PostgreSQL, MLflow stores.

PostgreSQL: one throwaway cluster per test session (initdb + pg_ctl as user
`postgres`, free loopback port, stopped and deleted at the end), one fresh database
per test. Without the server binaries the PostgreSQL cases are skipped, unless `CI`
or `ROOST_REQUIRE_POSTGRES=1` is set: then they fail, so CI cannot go green by
silently testing SQLite only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.db import dispose_engines
from store.testing import MlflowServer, PostgresServer, postgres_available, start_postgres


def postgres_required() -> bool:
    ci = os.environ.get("CI", "").strip().lower()
    return ci not in ("", "0", "false", "no") or os.environ.get("ROOST_REQUIRE_POSTGRES") == "1"


_SESSION_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
_saved_env: dict[str, str | None] = {}
_mpl_dir: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Before any test module imports MLflow or matplotlib: no telemetry id in
    ~/.config/mlflow, no font cache in ~/.cache/matplotlib."""
    global _mpl_dir
    _mpl_dir = tempfile.mkdtemp(prefix="roost-mpl-")
    for key, value in {**_SESSION_ENV, "MPLCONFIGDIR": _mpl_dir}.items():
        _saved_env[key] = os.environ.get(key)
        os.environ[key] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if _mpl_dir:
        shutil.rmtree(_mpl_dir, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests needing the MLflow server last: it starts in the background at
    session start (see `_early_mlflow_server`) and is ready by then."""
    items.sort(key=lambda item: "mlflow_server" in getattr(item, "fixturenames", ()))


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
def mlflow_template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, initialised MLflow SQLite database to copy: creating one runs MLflow's
    own migrations (~7 s), which the session pays once."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments(max_results=1)
    return path


@pytest.fixture(scope="session")
def mlflow_uri(mlflow_template_db: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One local MLflow store shared by the session's tests."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(mlflow_template_db, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session", autouse=True)
def _early_mlflow_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowServer | None]:
    """Launch the MLflow server at session start when a selected test needs it: its
    15-20 s start-up then overlaps the other tests instead of adding to them."""
    wanted = any("mlflow_server" in item.fixturenames for item in request.session.items)
    if not wanted:
        yield None
        return
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).launch()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_server(_early_mlflow_server: MlflowServer | None) -> MlflowServer:
    """A real, healthy `mlflow server` on loopback (`.uri`); its process group is killed
    at the end of the session."""
    assert _early_mlflow_server is not None
    _early_mlflow_server.wait()
    return _early_mlflow_server
