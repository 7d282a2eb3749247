"""Alembic migrations for the store, shipped in the package (see store/migrate.py)."""
