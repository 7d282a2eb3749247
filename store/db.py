"""Engines, sessions, and which database Roost talks to.

Resolution order for the database URL: an explicit `url` argument (what a config
file passes) > env `ROOST_DATABASE_URL` > SQLite at `swarm.paths.data_dir()/roost.db`.
Any SQLAlchemy URL works; PostgreSQL is `postgresql+psycopg://user@host:port/db`.

SQLite connections get WAL (readers never block the writer), foreign keys on (off by
default in SQLite!) and a busy timeout (a second process waits for a lock instead of
failing at once) on every connect.

The application never runs on a schema it does not know: `require_current(engine)`
raises `StoreNotMigrated` / `StoreTooNew` naming the command to run.
`init_db()` is the one-call entry point for programs:

    from store import init_db, session_scope, Job
    engine = init_db()                      # default SQLite: created/upgraded (logged)
    with session_scope(engine) as s:
        s.add(Job(name="train", spec={"argv": ["swarm", "train"]}))
"""

from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)

ENV_URL = "ROOST_DATABASE_URL"
DB_FILENAME = "roost.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000
UPGRADE_COMMAND = "swarm db upgrade"


class StoreError(RuntimeError):
    """Base of the store's schema-state errors."""


class StoreNotMigrated(StoreError):
    """The database has no schema yet, or an older one than this code needs."""


class StoreTooNew(StoreError):
    """The database was migrated by a newer Roost than the one running."""


# ---------------------------------------------------------------- URLs


def default_url() -> str:
    """SQLite in the project's data directory (absolute path)."""
    from swarm.paths import data_dir

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


# ---------------------------------------------------------------- schema state


def require_current(engine: Engine) -> str:
    """Refuse to go on unless the database is at this code's head revision.

    Returns the revision. Raises `StoreNotMigrated` (empty or behind: run
    `swarm db upgrade`) or `StoreTooNew` (migrated by newer code: upgrade Roost).
    """
    from store import migrate

    where = redact(engine.url)
    current = migrate.current(engine)
    head = migrate.head()
    if current == head:
        return head
    if current is None:
        raise StoreNotMigrated(
            f"the Roost database at {where} has no schema yet; run `{UPGRADE_COMMAND}` "
            f"(or `python -m store upgrade`) to create it"
        )
    if not migrate.is_known(current):
        raise StoreTooNew(
            f"the Roost database at {where} is at revision {current}, which this version of "
            f"Roost does not know (its newest is {head}): it was migrated by a newer Roost. "
            f"Upgrade Roost, or run `swarm db downgrade {head}` with the newer version"
        )
    raise StoreNotMigrated(
        f"the Roost database at {where} is at revision {current} but this code needs {head}; "
        f"run `{UPGRADE_COMMAND}`"
    )


def init_db(url: str | URL | None = None, upgrade: bool | None = None) -> Engine:
    """The engine for `url`, with the schema checked (and maybe migrated) first.

    `upgrade=None` (default): a SQLite database is created/upgraded automatically
    (it is local and private to this user; logged at INFO), any other database is
    only checked, because a shared server database is migrated deliberately with
    `swarm db upgrade`. `upgrade=True`: migrate whatever it is. `upgrade=False`:
    only check. A database newer than the code always raises `StoreTooNew`.
    """
    from store import migrate

    engine = get_engine(url)
    auto = engine.dialect.name == "sqlite" if upgrade is None else upgrade
    if auto:
        current = migrate.current(engine)
        if current != migrate.head() and (current is None or migrate.is_known(current)):
            log.info("migrating Roost database at %s from %s to %s",
                     redact(engine.url), current or "empty", migrate.head())
            migrate.upgrade(engine)
    require_current(engine)
    return engine
