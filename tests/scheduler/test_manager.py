"""JobManager over both sinks: records, reconciliation, groups, runaway guard, failure paths."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sched_helpers import job_spec, wait_for

from scheduler.base import BackendError
from scheduler.fake import FakeSlurm
from scheduler.local import LocalBackend
from scheduler.manager import ENV_JOB_ID, JobManager
from scheduler.records import JobSink, MemorySink, StoreSink
from scheduler.slurm import SlurmBackend
from scheduler.spec import JobSpec
from store.models import JobState
from store.types import utcnow


@pytest.fixture(params=["memory", "store"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> JobSink:
    if request.param == "memory":
        return MemorySink()
    return StoreSink(request.getfixturevalue("db_url"))


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def mgr(sink: JobSink, fake: FakeSlurm, tmp_path: Path) -> Iterator[JobManager]:
    m = JobManager(
        sink,
        {
            "slurm": SlurmBackend(runner=fake, min_poll_s=0, max_poll_s=0),
            "local": LocalBackend(max_concurrent=2, state_dir=tmp_path / "st", kill_wait_s=1),
        },
        runaway_grace_s=0,
    )
    yield m
    for rec in sink.active():  # never leave local processes behind
        if rec.backend == "local" and rec.handle() is not None:
            m.backend("local").cancel(rec.handle(), force=True)  # type: ignore[arg-type]


def test_submit_records_handle_and_job_id_env(mgr: JobManager, fake: FakeSlurm, tmp_path: Path) -> None:
    rec = mgr.submit(job_spec(tmp_path), backend="slurm", group_key="g1", trial_id=None)
    assert rec.state == JobState.PENDING and rec.external_id == "1000" and rec.group_key == "g1"
    assert rec.stdout_path and rec.stdout_path.endswith("job-1000.out")
    assert rec.spec["env"][ENV_JOB_ID] == str(rec.id)
    assert f"export {ENV_JOB_ID}={rec.id}" in fake.jobs[1000].script
    assert rec.time_limit_s == 3600


def test_reconcile_records_transitions_and_times(mgr: JobManager, fake: FakeSlurm, tmp_path: Path) -> None:
    a = mgr.submit(job_spec(tmp_path, "a"), backend="slurm")
    b = mgr.submit(job_spec(tmp_path, "b"), backend="slurm")
    assert mgr.reconcile() == []  # nothing changed
    fake.set_state(a.external_id, "RUNNING")
    changed = mgr.reconcile()
    assert [r.id for r in changed] == [a.id]
    assert changed[0].state == JobState.RUNNING and changed[0].started_at is not None
    fake.set_state(a.external_id, "OUT_OF_MEMORY", exit_code=0, signal=9)
    fake.set_state(b.external_id, "COMPLETED")
    mgr.reconcile()
    ra, rb = mgr.get(a.id), mgr.get(b.id)
    assert ra is not None and rb is not None
    assert (ra.state, ra.reason, ra.exit_code) == (JobState.FAILED, "OUT_OF_MEMORY", 137)
    assert ra.finished_at is not None
    assert (rb.state, rb.exit_code) == (JobState.COMPLETED, 0) and rb.started_at is not None
    assert mgr.sink.active() == []
    n = fake.count("squeue")
    mgr.reconcile()
    assert fake.count("squeue") == n  # terminal jobs are not polled again


def test_cancel_group_stops_every_member(mgr: JobManager, fake: FakeSlurm, tmp_path: Path) -> None:
    server = mgr.submit(job_spec(tmp_path, "server"), backend="slurm", group_key="trial-1")
    fleet = mgr.submit(job_spec(tmp_path, "fleet"), backend="slurm", group_key="trial-1")
    other = mgr.submit(job_spec(tmp_path, "other"), backend="slurm", group_key="trial-2")
    fake.set_state(server.external_id, "RUNNING")
    done = mgr.cancel_group("trial-1")
    assert {r.id for r in done} == {server.id, fleet.id}
    assert all(r.state == JobState.CANCELLED for r in done)
    assert mgr.get(other.id).state == JobState.PENDING  # type: ignore[union-attr]


def test_runaway_guard_kills_jobs_past_their_budget(mgr: JobManager, fake: FakeSlurm, tmp_path: Path) -> None:
    rec = mgr.submit(job_spec(tmp_path, time_limit_s=1), backend="slurm")
    fake.set_state(rec.external_id, "RUNNING")
    fake.jobs[int(rec.external_id)].start_time = int(time.time()) - 5  # Slurm failed to enforce it
    changed = mgr.reconcile()
    final = mgr.get(rec.id)
    assert final is not None and final.state == JobState.TIMEOUT
    assert "runaway guard" in (final.reason or "")
    assert any(c[0] == "scancel" for c in fake.calls)
    assert changed[-1].state == JobState.TIMEOUT


def test_runaway_guard_on_local_jobs(mgr: JobManager, tmp_path: Path) -> None:
    # A time limit the local supervisor would enforce only in an hour; pretend it started long ago.
    rec = mgr.submit(job_spec(tmp_path, time_limit_s=3600), backend="local")
    wait_for(
        lambda: mgr.reconcile() or mgr.get(rec.id).state == JobState.RUNNING,
        10,  # type: ignore[union-attr]
        what="running",
    )
    mgr.sink.update(rec.id, started_at=utcnow() - timedelta(hours=2))
    mgr.reconcile()
    final = mgr.get(rec.id)
    assert final is not None and final.state == JobState.TIMEOUT
    handle = final.handle()
    assert handle is not None
    wait_for(lambda: not LocalBackend(state_dir=tmp_path / "st")._alive(handle), 5, what="killed")


def test_submit_failure_is_recorded(mgr: JobManager, sink: JobSink, tmp_path: Path) -> None:
    with pytest.raises(BackendError):
        mgr.submit(job_spec(tmp_path, cwd="/nonexistent/dir"), backend="local")
    rec = sink.recent(1)[0]
    assert rec.state == JobState.FAILED and "submit failed" in (rec.reason or "")


def test_interrupted_submission_is_marked_failed(mgr: JobManager, sink: JobSink, tmp_path: Path) -> None:
    rec = sink.create(name="orphan", backend="slurm", spec={}, time_limit_s=60)  # submitter died here
    mgr.submit_grace_s = 0
    time.sleep(0.01)
    mgr.reconcile()
    final = sink.get(rec.id)
    assert final is not None and final.state == JobState.FAILED and "never completed" in (final.reason or "")


def test_cancel_before_submission_and_unknown_backend(mgr: JobManager, sink: JobSink) -> None:
    rec = sink.create(name="later", backend="slurm", spec={}, time_limit_s=60)
    assert mgr.cancel(rec.id).state == JobState.CANCELLED
    with pytest.raises(KeyError):
        mgr.submit(JobSpec(name="x", command=["true"]), backend="nope")


def test_controller_outage_keeps_last_states(mgr: JobManager, fake: FakeSlurm, tmp_path: Path) -> None:
    rec = mgr.submit(job_spec(tmp_path), backend="slurm")
    fake.set_state(rec.external_id, "RUNNING")
    mgr.reconcile()
    fake.down = True
    assert mgr.reconcile() == []
    assert mgr.get(rec.id).state == JobState.RUNNING  # type: ignore[union-attr]


def test_wait_and_logs_with_local_jobs(mgr: JobManager, tmp_path: Path) -> None:
    rec = mgr.submit(job_spec(tmp_path, command=["bash", "-c", "echo hello; exit 5"]), backend="local")
    final = mgr.wait([rec.id], timeout_s=15)[0]
    assert (final.state, final.exit_code) == (JobState.FAILED, 5)
    assert mgr.logs(rec.id) == "hello\n"
    with pytest.raises(TimeoutError):
        slow = mgr.submit(job_spec(tmp_path, "slow"), backend="local")
        mgr.wait([slow.id], timeout_s=0.3)
