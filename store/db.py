"""Which database Roost talks to, its engines and sessions.

Resolution order for the database URL: an explicit `url` argument (what a config
file passes) > env `ROOST_DATABASE_URL` > SQLite at `store.paths.data_dir()/roost.db`.
Any SQLAlchemy URL works; PostgreSQL is `postgresql+psycopg://user@host:port/db`.

SQLite connections get WAL (readers never block the writer), foreign keys on (off by
default in SQLite!) and a busy timeout (a second process waits for a lock instead of
failing at once) on every connect.

Whether the schema is the one this code knows is `store.schema`'s concern
(`init_db`, `require_current`); this module knows nothing of migrations, so
`store.migrate` can build on it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.engine.url import URL
from sqlmodel import Session, create_engine

from store.paths import data_dir

ENV_URL = "ROOST_DATABASE_URL"
DB_FILENAME = "roost.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000


# ---------------------------------------------------------------- URLs


def default_url() -> str:
    """SQLite in the project's data directory (absolute path)."""
    return f"sqlite:///{data_dir() / DB_FILENAME}"


def database_url(url: str | URL | None = None) -> str:
    """The URL to use: `url` if given, else env `ROOST_DATABASE_URL`, else the default."""
    if url is not None and str(url):
        return url.render_as_string(hide_password=False) if isinstance(url, URL) else str(url)
    return os.environ.get(ENV_URL) or default_url()


def is_sqlite(url: str | URL) -> bool:
    return make_url(str(url) if not isinstance(url, URL) else url).get_backend_name() == "sqlite"


def sqlite_path(url: str | URL) -> Path | None:
    """The file behind a SQLite URL; None for in-memory databases and other backends."""
    u = make_url(url) if not isinstance(url, URL) else url
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:"):
        return None  # URI form; leave it to the caller
    return Path(u.database).expanduser().absolute()


def redact(url: str | URL) -> str:
    """The URL without its password, for messages and logs."""
    u = make_url(url) if not isinstance(url, URL) else url
    return u.render_as_string(hide_password=True)


# ---------------------------------------------------------------- engines


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL, much faster commits
    finally:
        cur.close()


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """A new engine for `url` (resolved with `database_url`), SQLite pragmas attached.

    Creates the parent directory of a SQLite file. Prefer `get_engine`, which caches.
    """
    resolved = database_url(url)
    if is_sqlite(resolved):
        path = sqlite_path(resolved)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        connect_args = dict(kwargs.pop("connect_args", {}))
        # Sessions may be handed between threads (scheduler callbacks, FastAPI).
        connect_args.setdefault("check_same_thread", False)
        kwargs["connect_args"] = connect_args
    else:
        kwargs.setdefault("pool_pre_ping", True)
    engine = create_engine(resolved, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    return engine


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def get_engine(url: str | URL | None = None) -> Engine:
    """The process-wide engine for `url` (one connection pool per database)."""
    resolved = database_url(url)
    with _engines_lock:
        engine = _engines.get(resolved)
        if engine is None:
            engine = _engines[resolved] = make_engine(resolved)
        return engine


def dispose_engines() -> None:
    """Close every cached engine's connections (tests; before fork)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


# ---------------------------------------------------------------- sessions


def get_session(engine: Engine | None = None) -> Session:
    """A plain session. Objects stay readable after commit (`expire_on_commit=False`)."""
    return Session(engine or get_engine(), expire_on_commit=False)


@contextmanager
def session_scope(engine: Engine | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = get_session(engine)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def open_failure(exc: BaseException, url: str | URL | None = None) -> tuple[int, str] | None:
    """(exit code, one line) for a database that could not be opened, None for any other error.

    A URL naming no dialect (`nope://x`) is what was typed (2); a server that refuses or is away
    (1). `url`: the one that failed, where the caller knows it (SQLAlchemy's errors do not carry it).
    """
    from sqlalchemy.exc import ArgumentError, OperationalError  # lazy: only when something failed

    where = redact(url) if url else "the database"
    if isinstance(exc, ArgumentError):  # NoSuchModuleError too
        return 2, f"{redact(url) if url else 'the database URL'} is not one the store can open: {exc}"
    if isinstance(exc, OperationalError):
        reason = str(exc.orig or exc).strip().splitlines()[0]
        return 1, f"cannot open {where}: {reason}"
    return None
