"""Alembic migrations, driven from Python (the `swarm db` CLI and `store.schema.init_db` use this).

Layout: the migration scripts ship inside the package, `store/migrations/versions/`,
so `pip install roost` (wheel or editable) carries them and `swarm db upgrade` works
anywhere. The repository's top-level `alembic/` + `alembic.ini` are the developer
entry point for the stock `alembic` command (`alembic revision --autogenerate`,
`alembic upgrade head`); their `env.py` calls `run_env()` below and their
`version_locations` point at the same `store/migrations/versions/`. One set of
revision files, two ways in.

Safety:
* The version table is `roost_alembic_version`, so a database shared with another
  Alembic user (MLflow uses `alembic_version`) is not confused.
* Upgrades are serialised: a file lock beside a SQLite database, an advisory lock on
  PostgreSQL; two processes starting at once do not both create the tables.
* On SQLite, foreign keys are switched off while batch migrations copy tables (else
  dropping the old copy would cascade-delete child rows) and checked afterwards.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import URL, Connection, Engine

from alembic import command, context
from store import db
from store.models import metadata
from store.types import JSONType, UTCDateTime

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "roost_alembic_version"
_PG_LOCK_KEY = 0x526F6F7374  # "Roost"


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic `Config` for the packaged migrations (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", db.database_url(url).replace("%", "%%"))
    return cfg


def _script() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS_DIR))


def head() -> str:
    """The newest revision this code knows."""
    heads = _script().get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    return heads[0]


def is_known(revision: str) -> bool:
    try:
        return _script().get_revision(revision) is not None
    except Exception:  # alembic raises ResolutionError / CommandError for unknown ids
        return False


def _engine(target: Engine | str | URL | None) -> Engine:
    return target if isinstance(target, Engine) else db.get_engine(target)


def current(target: Engine | str | URL | None = None) -> str | None:
    """The database's revision, or None when it has no schema."""
    with _engine(target).connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        heads = ctx.get_current_heads()
    if len(heads) > 1:
        raise RuntimeError(f"database has several revisions {heads}; resolve by hand")
    return heads[0] if heads else None


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Serialise schema changes between processes."""
    path = db.sqlite_path(engine.url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".migrate.lock"), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
        return
    yield


def _run(target: Engine | str | URL | None, fn: Callable[[Config], Any]) -> Any:
    engine = _engine(target)
    with _migration_lock(engine), engine.connect() as conn:
        cfg = alembic_config(engine.url)
        cfg.attributes["connection"] = conn
        result = fn(cfg)
        conn.commit()
        return result


def upgrade(target: Engine | str | URL | None = None, revision: str = "head") -> str | None:
    """Migrate up to `revision` (default: head). Returns the new revision."""
    _run(target, lambda cfg: command.upgrade(cfg, revision))
    return current(target)


def downgrade(target: Engine | str | URL | None, revision: str) -> str | None:
    """Migrate down to `revision` (`base` drops every table). Returns the new revision."""
    _run(target, lambda cfg: command.downgrade(cfg, revision))
    return current(target)


def check(target: Engine | str | URL | None = None) -> list[Any]:
    """Differences between the models and the database schema (empty: no drift)."""
    with _engine(target).connect() as conn:
        ctx = MigrationContext.configure(conn, opts=_context_opts())
        return list(compare_metadata(ctx, metadata))


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Only look at our tables: a shared database may hold others' (e.g. LangGraph's)."""
    if type_ == "table":
        return name in metadata.tables
    return True


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Render our column types by their public names in generated migrations."""
    if type_ == "type" and isinstance(obj, (UTCDateTime, JSONType)):
        autogen_context.imports.add("import store.types")
        return f"store.types.{type(obj).__name__}()"
    return False


def _context_opts() -> dict[str, Any]:
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "render_as_batch": True,  # SQLite cannot ALTER most things; batch copies tables
        "compare_type": True,
        "compare_server_default": False,
        "include_name": _include_name,
        "render_item": _render_item,
    }


def run_env() -> None:
    """Body of both env.py files (packaged and top-level): run migrations in context."""
    config = context.config
    if context.is_offline_mode():
        context.configure(
            url=config.get_main_option("sqlalchemy.url") or db.database_url(),
            literal_binds=True,
            **_context_opts(),
        )
        with context.begin_transaction():
            context.run_migrations()
        return

    conn = config.attributes.get("connection")
    if conn is not None:
        _run_online(conn)
        return
    url = config.get_main_option("sqlalchemy.url") or db.database_url()
    engine = db.make_engine(url)
    try:
        with _migration_lock(engine), engine.connect() as conn:
            _run_online(conn)
            conn.commit()
    finally:
        engine.dispose()


def _run_online(conn: Connection) -> None:
    sqlite = conn.dialect.name == "sqlite"
    if sqlite:
        # Must happen outside a transaction to take effect; pysqlite has not begun one yet.
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
    try:
        context.configure(connection=conn, **_context_opts())
        with context.begin_transaction():
            context.run_migrations()
        if sqlite:
            bad = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if bad:
                raise RuntimeError(f"migration left dangling foreign keys: {bad[:5]}")
    except BaseException:
        conn.rollback()
        raise
    finally:
        if sqlite:
            conn.commit()  # ends any transaction so the pragma below takes effect
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
