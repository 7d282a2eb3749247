"""Column types that behave the same on SQLite and PostgreSQL.

* `UTCDateTime`: every timestamp is stored in UTC and comes back timezone-aware
  (UTC). SQLite has no timezone type and hands back naive datetimes; PostgreSQL's
  `timestamptz` hands back datetimes in the session's time zone. Both are
  normalised here, so code never compares naive with aware datetimes.
* `JSONType`: JSON on SQLite, JSONB on PostgreSQL (indexable, compact).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

UTC = UTC


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (use instead of `datetime.utcnow()`)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC that always loads as an aware UTC datetime.

    Naive datetimes are refused on write: a naive value is ambiguous (local time?
    UTC?) and silently guessing is how off-by-hours bugs get into schedulers.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def __init__(self) -> None:
        super().__init__()

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(DateTime(timezone=True))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"UTCDateTime expects a datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                "naive datetime given to a UTC timestamp column; use store.utcnow() or datetime.now(timezone.utc)"
            )
        value = value.astimezone(UTC)
        # SQLite stores text; drop tzinfo so the stored string is plain UTC.
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class JSONType(TypeDecorator[Any]):
    """JSON on SQLite (and others), JSONB on PostgreSQL.

    In-place mutation of a loaded dict is not tracked by SQLAlchemy: assign a new
    value (`job.spec = {**job.spec, "k": v}`) to have it saved.
    """

    impl = JSON()
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())
