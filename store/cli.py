"""`swarm db ...` (and `python -m store ...`): migrate and inspect the Roost database.

    swarm db upgrade            # create the schema / apply new migrations (to head)
    swarm db upgrade 0001       # to a given revision
    swarm db downgrade base     # drop everything (downgrade to a revision)
    swarm db current            # where the database is, and where the code is
    swarm db check              # exit 1 if the models and the schema differ

The database is `--url` (or `--db`, as `swarm sched` calls it; before or after the command), else
env `ROOST_DATABASE_URL`, else the default SQLite file. A URL that names no database, an unreachable
server or an unknown revision is one line, not a traceback (exit 2 for what was typed, 1 for the server).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from store import db, migrate, schema
from store.options_anywhere import options_anywhere
from store.unreachable import run_app

app = typer.Typer(
    cls=options_anywhere(with_value=("--url", "--db")),  # `swarm db current --db U` too (`--db`: sched's name)
    help="The project database: migrations (upgrade, downgrade, current, check).",
    no_args_is_help=True,
)

_state: dict[str, str | None] = {"url": None}


F = TypeVar("F", bound=Callable[..., Any])


@app.callback()
def _root(
    url: str | None = typer.Option(
        None, "--url", "--db", envvar=db.ENV_URL, help="SQLAlchemy URL (default: SQLite in the data dir)."
    ),
) -> None:
    """Migrate and inspect the Roost database."""
    _state["url"] = url
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.getLogger("alembic.runtime.migration").addFilter(_quiet)


def _quiet(record: logging.LogRecord) -> bool:
    """Keep Alembic's "Running upgrade ..." lines, drop its per-connect chatter."""
    msg = str(record.msg)
    return not (msg.startswith("Context impl") or msg.startswith("Will assume"))


def _target() -> str:
    return db.database_url(_state["url"])


def _db_errors(fn: F) -> F:
    """A bad URL, an unreachable server or an unknown revision as one line instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from alembic.util import CommandError  # lazy: alembic only when a command runs

        try:
            return fn(*args, **kwargs)
        except CommandError as err:  # "Can't locate revision identified by 'zzz'"
            raise typer.BadParameter(str(err), param_hint="REVISION") from None
        except Exception as err:
            failed = db.open_failure(err, _state["url"])
            if failed is None:
                raise
            typer.echo(f"error: {failed[1]}", err=True)
            raise typer.Exit(failed[0]) from None

    return wrapper  # type: ignore[return-value]


@app.command()
@_db_errors
def upgrade(revision: str = typer.Argument("head", help="Target revision (default: head).")) -> None:
    """Apply migrations up to REVISION."""
    url = _target()
    rev = migrate.upgrade(url, revision)
    typer.echo(f"{db.redact(url)}: at {rev or 'base'}")


@app.command()
@_db_errors
def downgrade(revision: str = typer.Argument(..., help="Target revision; `base` drops all tables.")) -> None:
    """Revert migrations down to REVISION."""
    url = _target()
    rev = migrate.downgrade(url, revision)
    typer.echo(f"{db.redact(url)}: at {rev or 'base'}")


@app.command()
@_db_errors
def current() -> None:
    """Show the database's revision and the code's head."""
    url = _target()
    rev = migrate.current(url)
    head = migrate.head()
    if rev == head:
        note = "(head, up to date)"
    elif rev is None:
        note = f"(empty; run `{schema.UPGRADE_COMMAND}`)"
    elif migrate.is_known(rev):
        note = f"(behind head {head}; run `{schema.UPGRADE_COMMAND}`)"
    else:
        note = f"(unknown to this code, newest known {head}: migrated by a newer Roost)"
    typer.echo(f"{db.redact(url)}: {rev or 'none'} {note}")


@app.command()
@_db_errors
def check() -> None:
    """Exit 1 unless the database is at head and matches the models (no drift)."""
    url = _target()
    try:
        schema.require_current(db.get_engine(url))
    except schema.StoreError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(1) from None
    diffs = migrate.check(url)
    if diffs:
        typer.echo("schema drift between the models and the database:", err=True)
        for diff in diffs:
            typer.echo(f"  {diff}", err=True)
        typer.echo("write a migration: `alembic revision --autogenerate -m ...`", err=True)
        raise typer.Exit(1)
    typer.echo(f"{db.redact(url)}: at head {migrate.head()}, no drift")


def main() -> None:
    run_app(lambda: app(prog_name="python -m store"))
