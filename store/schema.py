"""Is this database at the schema this code knows? `init_db` and `require_current`.

The application never runs on a schema it does not know: `require_current(engine)`
raises `StoreNotMigrated` / `StoreTooNew` naming the command to run. `init_db()` is
the one-call entry point for programs:

    from store import init_db, session_scope, Job
    engine = init_db()                      # default SQLite: created/upgraded (logged)
    with session_scope(engine) as s:
        s.add(Job(name="train", spec={"argv": ["swarm", "train"]}))

It sits above both `store.db` (engines) and `store.migrate` (Alembic), so neither of
those needs the other's caller.
"""

from __future__ import annotations

import logging

from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from store import migrate
from store.db import get_engine, redact

log = logging.getLogger(__name__)

UPGRADE_COMMAND = "swarm db upgrade"


class StoreError(RuntimeError):
    """Base of the store's schema-state errors."""


class StoreNotMigrated(StoreError):
    """The database has no schema yet, or an older one than this code needs."""


class StoreTooNew(StoreError):
    """The database was migrated by a newer Roost than the one running."""


def require_current(engine: Engine) -> str:
    """Refuse to go on unless the database is at this code's head revision.

    Returns the revision. Raises `StoreNotMigrated` (empty or behind: run
    `swarm db upgrade`) or `StoreTooNew` (migrated by newer code: upgrade Roost).
    """
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
        f"the Roost database at {where} is at revision {current} but this code needs {head}; run `{UPGRADE_COMMAND}`"
    )


def init_db(url: str | URL | None = None, upgrade: bool | None = None) -> Engine:
    """The engine for `url`, with the schema checked (and maybe migrated) first.

    `upgrade=None` (default): a SQLite database is created/upgraded automatically
    (it is local and private to this user; logged at INFO), any other database is
    only checked, because a shared server database is migrated deliberately with
    `swarm db upgrade`. `upgrade=True`: migrate whatever it is. `upgrade=False`:
    only check. A database newer than the code always raises `StoreTooNew`.
    """
    engine = get_engine(url)
    auto = engine.dialect.name == "sqlite" if upgrade is None else upgrade
    if auto:
        current = migrate.current(engine)
        if current != migrate.head() and (current is None or migrate.is_known(current)):
            log.info(
                "migrating Roost database at %s from %s to %s", redact(engine.url), current or "empty", migrate.head()
            )
            migrate.upgrade(engine)
    require_current(engine)
    return engine
