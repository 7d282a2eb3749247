"""Alembic environment for the repository's `alembic` command (see alembic.ini).

Revision files live in the package, `store/migrations/versions/`, so an installed
Roost carries them; this directory is the developer entry point. The logic is
shared with the packaged env: `store.migrate.run_env`. The database URL is
`ROOST_DATABASE_URL` or the default SQLite file unless `-x url=...` or
`sqlalchemy.url` in alembic.ini says otherwise.
"""

from alembic import context
from store.migrate import run_env

_url = context.get_x_argument(as_dictionary=True).get("url")
if _url:
    context.config.set_main_option("sqlalchemy.url", _url.replace("%", "%%"))

run_env()
