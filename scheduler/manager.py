"""The job manager: backends + a record sink = submit (also exactly once), reconcile, cancel, logs.

    mgr = JobManager(StoreSink())                       # default backends: local, slurm
    job = mgr.submit(spec, backend="slurm", group_key="trial-7")
    job, how = mgr.submit_once(spec, backend="slurm", group_key="trial-7")   # again: the same job
    mgr.reconcile()                                     # poll every active job, record changes
    mgr.cancel_group("trial-7")                         # every job of one trial

The record is written *before* the backend is asked (state PENDING, no external id),
then completed with the handle: a crash in between leaves a row the reconciler marks
FAILED after `submit_grace_s` instead of a job nobody knows about. Every job gets
`ROOST_JOB_ID` in its environment so it can find its own row, and so the backend can
tell its submission apart from others of the same name: `submit_once` adopts such a
half-recorded job through `Backend.find` instead of submitting it a second time.

`reconcile()` is also the restart path: local jobs are found again by pid + start
time, Slurm jobs by id, and jobs that finished while nothing was watching are
recorded from their exit-code files. It also runs the runaway guard: a job still
RUNNING `runaway_grace_s` past its time limit (its backend failed to enforce it) is
killed and recorded as TIMEOUT.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from scheduler.base import Backend, BackendUnavailable, JobStatus, Stream
from scheduler.local import LocalBackend
from scheduler.records import JobRecord, JobSink
from scheduler.slurm import SlurmBackend
from scheduler.spec import ENV_JOB_ID, JobSpec
from store.models import JobState
from store.types import utcnow

log = logging.getLogger(__name__)

Submitted = Literal["submitted", "adopted", "existing"]


def default_backends() -> dict[str, Callable[[], Backend]]:
    """Backend factories by name (created on first use)."""
    return {"local": LocalBackend, "slurm": SlurmBackend}


class JobManager:
    """Submits jobs to backends and keeps their records in a sink up to date."""

    def __init__(
        self,
        sink: JobSink,
        backends: Mapping[str, Backend | Callable[[], Backend]] | None = None,
        runaway_grace_s: float = 120.0,
        submit_grace_s: float = 300.0,
    ) -> None:
        self.sink = sink
        self._factories: dict[str, Backend | Callable[[], Backend]] = dict(backends or default_backends())
        self._backends: dict[str, Backend] = {}
        self.runaway_grace_s = runaway_grace_s
        self.submit_grace_s = submit_grace_s
        self._lock = threading.RLock()

    def backend(self, name: str) -> Backend:
        with self._lock:
            if name not in self._backends:
                if name not in self._factories:
                    raise KeyError(f"unknown backend {name!r}; known: {sorted(self._factories)}")
                f = self._factories[name]
                # A class or a factory function is called; an instance is used as is.
                self._backends[name] = f() if isinstance(f, type) or not hasattr(f, "submit") else f  # type: ignore[operator]
            return self._backends[name]

    # ---------------------------------------------------------------- submit
    def submit(
        self, spec: JobSpec, backend: str = "local", trial_id: int | None = None, group_key: str | None = None
    ) -> JobRecord:
        b = self.backend(backend)
        rec = self.sink.create(
            name=spec.name,
            backend=backend,
            spec=spec.model_dump(),
            time_limit_s=spec.time_limit_s,
            trial_id=trial_id,
            group_key=group_key,
        )
        spec = spec.model_copy(update={"env": {**spec.env, ENV_JOB_ID: str(rec.id)}})
        try:
            with self._lock:
                handle = b.submit(spec)
        except Exception as e:
            self.sink.update(rec.id, state=JobState.FAILED, reason=f"submit failed: {e}", finished_at=utcnow())
            raise
        return self.sink.update(
            rec.id,
            spec=spec.model_dump(),
            external_id=handle.external_id,
            stdout_path=handle.stdout_path,
            stderr_path=handle.stderr_path,
        )

    def submit_once(
        self, spec: JobSpec, backend: str = "local", *, group_key: str, trial_id: int | None = None
    ) -> tuple[JobRecord, Submitted]:
        """Submit the job named `spec.name` in group `group_key`, unless an earlier call did.

        The key is (group_key, spec.name). Returns the record and how it came to be:
        "existing" (an earlier submit recorded its handle), "adopted" (an earlier submit
        reached the backend but died before recording the handle; the backend's `find`
        named the job), or "submitted" (now). Callers serialise calls per key (the
        researcher holds its study's lock). `BackendUnavailable` when the backend
        cannot say whether an earlier submit reached it.
        """
        earlier = [r for r in self.sink.group(group_key) if r.name == spec.name]
        for rec in reversed(earlier):
            if rec.handle() is not None:
                return rec, "existing"
        for rec in reversed(earlier):
            adopted = self._adopt(rec)
            if adopted is not None:
                return adopted, "adopted"
        for rec in earlier:  # nothing reached the backend: close the dangling rows
            if not rec.terminal:
                self.sink.update(
                    rec.id,
                    state=JobState.CANCELLED,
                    finished_at=utcnow(),
                    reason="submission interrupted before the backend got it",
                )
        return self.submit(spec, backend=backend, trial_id=trial_id, group_key=group_key), "submitted"

    def _adopt(self, rec: JobRecord) -> JobRecord | None:
        """Ask the record's backend for the job its interrupted submit may have started."""
        try:
            spec = JobSpec.model_validate(rec.spec)
        except ValidationError:  # not a spec this manager wrote: no backend was given it
            return None
        spec = spec.model_copy(update={"env": {**spec.env, ENV_JOB_ID: str(rec.id)}})
        with self._lock:
            handle = self.backend(rec.backend).find(spec)
        if handle is None:
            return None
        log.warning("job %s (%s): adopted %s left by an interrupted submit", rec.id, rec.name, handle.external_id)
        return self.sink.update(
            rec.id,
            spec=spec.model_dump(),
            external_id=handle.external_id,
            stdout_path=handle.stdout_path,
            stderr_path=handle.stderr_path,
            state=JobState.PENDING,
            finished_at=None,
            reason="adopted after an interrupted submit",
        )

    # ---------------------------------------------------------------- reconcile
    def reconcile(self, job_ids: Iterable[int] | None = None) -> list[JobRecord]:
        """Poll every active job (or those given) once per backend; record and return changes."""
        if job_ids is None:
            active = self.sink.active()
        else:
            active = [r for r in (self.sink.get(i) for i in job_ids) if r is not None and not r.terminal]
        now = utcnow()
        by_backend: dict[str, list[JobRecord]] = defaultdict(list)
        changed: list[JobRecord] = []
        for rec in active:
            if rec.handle() is not None:
                by_backend[rec.backend].append(rec)
            elif rec.created_at and now - rec.created_at > timedelta(seconds=self.submit_grace_s):
                changed.append(
                    self.sink.update(
                        rec.id,
                        state=JobState.FAILED,
                        finished_at=now,
                        reason="submission never completed (submitter crashed?)",
                    )
                )
        for name, recs in by_backend.items():
            try:
                b = self.backend(name)
                with self._lock:
                    statuses = b.status([r.handle() for r in recs])  # type: ignore[misc]
            except BackendUnavailable as e:
                log.warning("backend %s unavailable, keeping last known states: %s", name, e)
                continue
            except KeyError as e:
                log.error("%s", e)
                continue
            for rec in recs:
                st = statuses.get(rec.external_id or "")
                if st is None:
                    continue
                new = self._record(rec, st, now)
                if new is not None:
                    rec = new
                    changed.append(new)
                guarded = self._runaway_guard(rec, now)
                if guarded is not None:
                    changed.append(guarded)
        return changed

    def _record(self, rec: JobRecord, st: JobStatus, now: datetime) -> JobRecord | None:
        fields: dict[str, Any] = {}
        if st.state != rec.state:
            fields["state"] = st.state
        if st.exit_code != rec.exit_code and st.exit_code is not None:
            fields["exit_code"] = st.exit_code
        if st.reason != rec.reason and (st.reason is not None or "state" in fields):
            fields["reason"] = st.reason
        if rec.started_at is None and st.state not in (JobState.PENDING, JobState.UNKNOWN):
            if st.started_at is not None or st.state == JobState.RUNNING:
                fields["started_at"] = st.started_at or now
        if rec.finished_at is None and st.terminal:
            fields["finished_at"] = st.finished_at or now
        if not fields:
            return None
        log.info("job %s (%s %s): %s", rec.id, rec.backend, rec.external_id, {k: str(v) for k, v in fields.items()})
        return self.sink.update(rec.id, **fields)

    def _runaway_guard(self, rec: JobRecord, now: datetime) -> JobRecord | None:
        if rec.state != JobState.RUNNING or rec.started_at is None or rec.time_limit_s is None:
            return None
        ran = (now - rec.started_at).total_seconds()
        if ran <= rec.time_limit_s + self.runaway_grace_s:
            return None
        log.warning("runaway guard: job %s ran %.0f s past its %d s limit; killing it", rec.id, ran, rec.time_limit_s)
        try:
            with self._lock:
                self.backend(rec.backend).cancel(rec.handle(), force=True)  # type: ignore[arg-type]
        except Exception as e:  # record anyway: the row must not claim it is fine
            log.error("runaway guard could not kill job %s: %s", rec.id, e)
        return self.sink.update(
            rec.id,
            state=JobState.TIMEOUT,
            finished_at=now,
            reason=f"runaway guard: still running {ran:.0f} s after start, limit {rec.time_limit_s} s",
        )

    # ---------------------------------------------------------------- cancel, logs, wait
    def cancel(self, job_id: int, force: bool = False) -> JobRecord:
        """Ask the backend to stop the job; the final state arrives with the next reconcile."""
        rec = self._get(job_id)
        if rec.terminal:
            return rec
        handle = rec.handle()
        if handle is None:
            return self.sink.update(
                job_id, state=JobState.CANCELLED, finished_at=utcnow(), reason="cancelled before submission"
            )
        with self._lock:
            b = self.backend(rec.backend)
            b.cancel(handle, force=force)
            st = b.reattach(handle)
        return self._record(rec, st, utcnow()) or rec

    def cancel_group(self, group_key: str, force: bool = False) -> list[JobRecord]:
        """Cancel every unfinished job of a group (e.g. every job of one trial)."""
        return [self.cancel(r.id, force=force) for r in self.sink.group(group_key) if not r.terminal]

    def logs(self, job_id: int, stream: Stream = "stdout", tail_bytes: int | None = None) -> str:
        rec = self._get(job_id)
        handle = rec.handle()
        return "" if handle is None else self.backend(rec.backend).logs(handle, stream, tail_bytes)

    def wait(
        self,
        job_ids: Iterable[int],
        timeout_s: float,
        poll_s: float = 0.25,
        until: Callable[[JobRecord], bool] = lambda r: r.terminal,
    ) -> list[JobRecord]:
        """Reconcile until `until` holds for every job; TimeoutError otherwise."""
        ids = list(job_ids)
        end = time.monotonic() + timeout_s
        while True:
            self.reconcile(ids)
            recs = [self._get(i) for i in ids]
            if all(until(r) for r in recs):
                return recs
            if time.monotonic() > end:
                raise TimeoutError(
                    f"jobs not done after {timeout_s:g} s: " + ", ".join(f"{r.id}={r.state.value}" for r in recs)
                )
            time.sleep(poll_s)

    def get(self, job_id: int) -> JobRecord | None:
        return self.sink.get(job_id)

    def _get(self, job_id: int) -> JobRecord:
        rec = self.sink.get(job_id)
        if rec is None:
            raise KeyError(f"no job {job_id}")
        return rec
