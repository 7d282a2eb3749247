"""A command line whose store cannot be opened says so in one line, not in SQLAlchemy's traceback.

`swarm sched status`, `researcher status` or `swarm db current` with ROOST_DATABASE_URL naming a
server that is down (or a URL that names no database) failed deep inside SQLAlchemy. Each entry
point runs its app through `run_app`, which turns exactly those errors into `error: cannot open the
database: connection to server at ... refused` and a hint naming where the database comes from,
exit 1 (2 for a URL that names nothing). Stdlib only at import, like `store.paths`: `swarm --help`
must not pay for SQLAlchemy.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def run_app(run: Callable[[], Any], debug: bool = False) -> Any:
    """`run()`, with a store that cannot be opened said in one line (`--debug`: the traceback)."""
    try:
        return run()
    except Exception as exc:
        if debug or "sqlalchemy" not in sys.modules:  # nothing opened a database: not this error
            raise
        from store.db import open_failure  # lazy: SQLAlchemy is loaded already (checked above)

        failed = open_failure(exc)
        if failed is None:
            raise
        print(f"error: {failed[1]}", file=sys.stderr)
        print("hint: the database is the command's --db (or --url), else ROOST_DATABASE_URL", file=sys.stderr)
        raise SystemExit(failed[0]) from None
