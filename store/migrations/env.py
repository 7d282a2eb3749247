"""Alembic environment for the packaged migrations; the logic lives in store.migrate."""

from store.migrate import run_env

run_env()
