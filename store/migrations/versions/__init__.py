"""Revision files. Generate new ones from the repository root:
`alembic revision --autogenerate -m "what changed"`."""
