"""Where job states are kept: the `JobSink` interface, in memory or in the store's `jobs` table.

The manager only needs create / update / get / list; `StoreSink` maps those onto
`store.models.Job` rows (the durable record that survives restarts), `MemorySink` keeps
them in a dict (unit tests, throwaway scripts).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.engine import Engine
from sqlmodel import select

from scheduler.base import TERMINAL_STATES, JobHandle
from store.db import session_scope
from store.models import Job, JobState
from store.schema import init_db
from store.types import utcnow

_ACTIVE = [JobState.PENDING.value, JobState.RUNNING.value, JobState.UNKNOWN.value]


@dataclass(frozen=True)
class JobRecord:
    """A snapshot of one `jobs` row."""

    id: int
    name: str
    backend: str
    state: JobState
    spec: dict[str, Any] = field(default_factory=dict)
    external_id: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    stdout_path: str | None = None
    stderr_path: str | None = None
    time_limit_s: int | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    trial_id: int | None = None
    group_key: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def handle(self) -> JobHandle | None:
        """The backend handle, once the job was submitted."""
        if not self.external_id:
            return None
        return JobHandle(
            backend=self.backend,
            external_id=self.external_id,
            name=self.name,
            stdout_path=self.stdout_path or "",
            stderr_path=self.stderr_path or "",
        )


_FIELDS = [f.name for f in dataclasses.fields(JobRecord)]


class JobSink(Protocol):
    def create(
        self,
        *,
        name: str,
        backend: str,
        spec: dict[str, Any],
        time_limit_s: int | None,
        trial_id: int | None = None,
        group_key: str | None = None,
    ) -> JobRecord: ...

    def update(self, job_id: int, **fields: Any) -> JobRecord: ...

    def get(self, job_id: int) -> JobRecord | None: ...

    def active(self) -> list[JobRecord]:
        """Jobs not in a terminal state (PENDING, RUNNING, UNKNOWN)."""
        ...

    def group(self, group_key: str) -> list[JobRecord]: ...

    def recent(self, limit: int = 50) -> list[JobRecord]: ...


def _normalise(fields: dict[str, Any]) -> dict[str, Any]:
    if "state" in fields and fields["state"] is not None:
        fields["state"] = JobState(fields["state"]).value
    return fields


class MemorySink:
    """Job records in a dict (ids from 1)."""

    def __init__(self) -> None:
        self._rows: dict[int, JobRecord] = {}
        self._lock = threading.Lock()

    def create(
        self,
        *,
        name: str,
        backend: str,
        spec: dict[str, Any],
        time_limit_s: int | None,
        trial_id: int | None = None,
        group_key: str | None = None,
    ) -> JobRecord:
        with self._lock:
            job_id = max(self._rows, default=0) + 1
            now = utcnow()
            rec = JobRecord(
                id=job_id,
                name=name,
                backend=backend,
                state=JobState.PENDING,
                spec=spec,
                time_limit_s=time_limit_s,
                trial_id=trial_id,
                group_key=group_key,
                created_at=now,
                updated_at=now,
            )
            self._rows[job_id] = rec
            return rec

    def update(self, job_id: int, **fields: Any) -> JobRecord:
        fields = _normalise(fields)
        if "state" in fields:
            fields["state"] = JobState(fields["state"])
        with self._lock:
            rec = dataclasses.replace(self._rows[job_id], **fields, updated_at=utcnow())
            self._rows[job_id] = rec
            return rec

    def get(self, job_id: int) -> JobRecord | None:
        return self._rows.get(job_id)

    def active(self) -> list[JobRecord]:
        return [r for r in self._rows.values() if r.state.value in _ACTIVE]

    def group(self, group_key: str) -> list[JobRecord]:
        return [r for r in self._rows.values() if r.group_key == group_key]

    def recent(self, limit: int = 50) -> list[JobRecord]:
        return sorted(self._rows.values(), key=lambda r: r.id, reverse=True)[:limit]


class StoreSink:
    """Job records in the store's `jobs` table (SQLite or PostgreSQL)."""

    def __init__(self, url: str | None = None, engine: Engine | None = None) -> None:
        self.engine = engine if engine is not None else init_db(url)

    @staticmethod
    def _record(row: Any) -> JobRecord:
        data = {k: getattr(row, k) for k in _FIELDS}
        data["state"] = JobState(data["state"])
        data["spec"] = dict(data["spec"] or {})
        return JobRecord(**data)

    def _select(self, where: Sequence[Any], order_desc: bool = False, limit: int | None = None) -> list[JobRecord]:
        stmt = select(Job).where(*where)
        stmt = stmt.order_by(Job.id.desc() if order_desc else Job.id)  # type: ignore[union-attr]
        if limit is not None:
            stmt = stmt.limit(limit)
        with session_scope(self.engine) as s:
            return [self._record(r) for r in s.exec(stmt).all()]

    def create(
        self,
        *,
        name: str,
        backend: str,
        spec: dict[str, Any],
        time_limit_s: int | None,
        trial_id: int | None = None,
        group_key: str | None = None,
    ) -> JobRecord:
        with session_scope(self.engine) as s:
            row = Job(
                name=name,
                backend=backend,
                state=JobState.PENDING.value,
                spec=spec,
                time_limit_s=time_limit_s,
                trial_id=trial_id,
                group_key=group_key,
            )
            s.add(row)
            s.flush()
            s.refresh(row)
            return self._record(row)

    def update(self, job_id: int, **fields: Any) -> JobRecord:
        fields = _normalise(fields)
        with session_scope(self.engine) as s:
            row = s.get(Job, job_id)
            if row is None:
                raise KeyError(f"no job {job_id}")
            for k, v in fields.items():
                setattr(row, k, v)
            row.updated_at = utcnow()
            s.add(row)
            s.flush()
            s.refresh(row)
            return self._record(row)

    def get(self, job_id: int) -> JobRecord | None:
        with session_scope(self.engine) as s:
            row = s.get(Job, job_id)
            return None if row is None else self._record(row)

    def active(self) -> list[JobRecord]:
        return self._select([Job.state.in_(_ACTIVE)])  # type: ignore[attr-defined]

    def group(self, group_key: str) -> list[JobRecord]:
        return self._select([Job.group_key == group_key])

    def recent(self, limit: int = 50) -> list[JobRecord]:
        return self._select([], order_desc=True, limit=limit)
