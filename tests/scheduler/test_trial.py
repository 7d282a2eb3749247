"""Exactly-once submission (`submit_once`, `Backend.find`) and trials as jobs (`scheduler.trial`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_helpers import job_spec, wait_for

from scheduler.base import BackendUnavailable
from scheduler.fake import FakeSlurm
from scheduler.local import LocalBackend
from scheduler.manager import JobManager
from scheduler.records import JobRecord, JobSink, MemorySink, StoreSink
from scheduler.slurm import SlurmBackend
from scheduler.spec import ENV_JOB_ID
from scheduler.trial import TrialShape, last_error, poll_trials, submit_trial, trial_jobs, trial_state
from store.models import JobState


@pytest.fixture(params=["memory", "store"])
def sink(request: pytest.FixtureRequest) -> JobSink:
    if request.param == "memory":
        return MemorySink()
    return StoreSink(request.getfixturevalue("db_url"))


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


def _backends(fake: FakeSlurm, tmp_path: Path) -> dict[str, Any]:
    return {
        "slurm": SlurmBackend(runner=fake, min_poll_s=0, max_poll_s=0),
        "local": LocalBackend(max_concurrent=2, state_dir=tmp_path / "st", kill_wait_s=1),
    }


@pytest.fixture
def mgr(sink: JobSink, fake: FakeSlurm, tmp_path: Path) -> Iterator[JobManager]:
    m = JobManager(sink, _backends(fake, tmp_path))
    yield m
    for rec in sink.active():  # never leave local processes behind
        if rec.backend == "local" and rec.handle() is not None:
            m.backend("local").cancel(rec.handle(), force=True)  # type: ignore[arg-type]


class _CrashOnHandle:
    """A sink whose submitter 'dies' right after the backend took the job, before its handle is saved."""

    def __init__(self, inner: JobSink) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def update(self, job_id: int, **fields: Any) -> JobRecord:
        if "external_id" in fields:
            raise SystemExit("crash between submit and record")
        return self.inner.update(job_id, **fields)


# ---------------------------------------------------------------- submit_once


def test_second_submit_with_the_same_key_returns_the_job(mgr: JobManager, fake: FakeSlurm, tmp_path: Path) -> None:
    first, how = mgr.submit_once(job_spec(tmp_path), backend="slurm", group_key="trial-1")
    again, how2 = mgr.submit_once(job_spec(tmp_path), backend="slurm", group_key="trial-1")
    assert (how, how2) == ("submitted", "existing") and again.id == first.id
    other, how3 = mgr.submit_once(job_spec(tmp_path), backend="slurm", group_key="trial-2")  # another key
    assert how3 == "submitted" and other.id != first.id
    assert fake.count("sbatch") == 2


@pytest.mark.parametrize("backend", ["slurm", "local"])
def test_crash_after_the_backend_took_the_job_is_adopted(
    sink: JobSink, fake: FakeSlurm, tmp_path: Path, backend: str
) -> None:
    crashing = JobManager(_CrashOnHandle(sink), _backends(fake, tmp_path))  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        crashing.submit_once(job_spec(tmp_path), backend=backend, group_key="trial-1")
    (lost,) = sink.group("trial-1")
    assert lost.external_id is None
    mgr = JobManager(sink, _backends(fake, tmp_path))  # "after the restart": fresh backends, no memory
    try:
        rec, how = mgr.submit_once(job_spec(tmp_path), backend=backend, group_key="trial-1")
        assert how == "adopted" and rec.id == lost.id and rec.external_id and rec.state == JobState.PENDING
        assert mgr.submit_once(job_spec(tmp_path), backend=backend, group_key="trial-1")[1] == "existing"
        assert len(sink.group("trial-1")) == 1
        if backend == "slurm":
            assert fake.count("sbatch") == 1 and rec.external_id == "1000"
        else:
            assert len(list((tmp_path / "logs").iterdir())) == 1  # one job directory: started once
            wait_for(
                lambda: mgr.reconcile([rec.id]) or mgr.get(rec.id).state == JobState.RUNNING,
                10,  # type: ignore[union-attr]
                what="adopted job running",
            )
    finally:
        for r in sink.active():
            if r.backend == "local" and r.handle() is not None:
                mgr.backend("local").cancel(r.handle(), force=True)  # type: ignore[arg-type]


def test_crash_before_the_backend_is_submitted_once(
    mgr: JobManager, sink: JobSink, fake: FakeSlurm, tmp_path: Path
) -> None:
    spec = job_spec(tmp_path)
    dangling = sink.create(
        name=spec.name, backend="slurm", spec=spec.model_dump(), time_limit_s=60, group_key="trial-1"
    )  # the submitter died right after writing the row
    rec, how = mgr.submit_once(spec, backend="slurm", group_key="trial-1")
    assert how == "submitted" and rec.id != dangling.id and fake.count("sbatch") == 1
    old = sink.get(dangling.id)
    assert old is not None and old.state == JobState.CANCELLED and "interrupted" in (old.reason or "")
    assert [r.id for r in trial_jobs(sink, "trial-1")] == [rec.id]  # the abandoned row is not the trial's


def test_an_unreachable_controller_submits_nothing(sink: JobSink, fake: FakeSlurm, tmp_path: Path) -> None:
    crashing = JobManager(_CrashOnHandle(sink), _backends(fake, tmp_path))  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        crashing.submit_once(job_spec(tmp_path), backend="slurm", group_key="trial-1")
    fake.down = True
    with pytest.raises(BackendUnavailable):
        JobManager(sink, _backends(fake, tmp_path)).submit_once(
            job_spec(tmp_path), backend="slurm", group_key="trial-1"
        )
    assert fake.count("sbatch") == 1 and len(sink.group("trial-1")) == 1


# ---------------------------------------------------------------- Backend.find


def test_slurm_find_matches_its_own_script_then_exit_file(fake: FakeSlurm, tmp_path: Path) -> None:
    backend = SlurmBackend(runner=fake, min_poll_s=0)
    mine = job_spec(tmp_path, "t1", env={ENV_JOB_ID: "7"})
    h = backend.submit(mine)
    backend.submit(job_spec(tmp_path, "t1", env={ENV_JOB_ID: "8"}))  # same name, another submission
    backend.submit(job_spec(tmp_path, "t10", env={ENV_JOB_ID: "7"}))  # a name sharing the prefix
    assert backend.find(mine) == h
    assert backend.find(job_spec(tmp_path, "t1", env={ENV_JOB_ID: "9"})) is None  # never submitted
    assert backend.find(job_spec(tmp_path, "never")) is None and fake.count("squeue") == 1  # no script: no query
    fake.set_state(h.external_id, "COMPLETED")
    fake.forget(h.external_id, squeue=True, scontrol=True)  # Slurm forgot it: the exit file tells
    assert backend.find(mine) is None
    Path(h.stdout_path).with_suffix(".exit").write_text("0\n")
    assert backend.find(mine) == h


def test_local_find_uses_the_wrappers_record(tmp_path: Path) -> None:
    backend = LocalBackend(max_concurrent=1, state_dir=tmp_path / "st", kill_wait_s=1)
    spec = job_spec(tmp_path, "t1", env={ENV_JOB_ID: "7"})
    h = backend.submit(spec)
    try:
        job_dir = Path(h.stdout_path).parent
        # the wrapper writes its record first and `started` once it holds a slot: a loaded machine can
        # read the status between the two (PENDING, rightly)
        wait_for(lambda: (job_dir / "started").exists(), 10, what="wrapper record and slot")
        (job_dir / "handle.json").unlink()  # the submitter died before writing it
        assert backend.find(spec) == h
        assert backend.find(job_spec(tmp_path, "t1", env={ENV_JOB_ID: "8"})) is None
        assert LocalBackend(state_dir=tmp_path / "st").status([h])[h.external_id].state == JobState.RUNNING
    finally:
        backend.cancel(h, force=True)
    never = tmp_path / "logs" / "t2-20250101-000000-abcdef"  # a directory whose wrapper never started
    never.mkdir()
    (never / "spec.json").write_text(json.dumps(job_spec(tmp_path, "t2").model_dump()))
    os.utime(never, (time.time() - 60, time.time() - 60))
    assert backend.find(job_spec(tmp_path, "t2")) is None


# ---------------------------------------------------------------- trials


def test_trial_shape_needs_jobs_with_distinct_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        TrialShape(key="trial-1", jobs=[])
    with pytest.raises(ValueError, match="distinct names"):
        TrialShape(key="trial-1", jobs=[job_spec(tmp_path, "a"), job_spec(tmp_path, "a")])


def test_submit_trial_is_idempotent_and_all_or_nothing(mgr: JobManager, fake: FakeSlurm, tmp_path: Path) -> None:
    shape = TrialShape(key="trial-3", jobs=[job_spec(tmp_path, "server"), job_spec(tmp_path, "fleet")])
    first = submit_trial(mgr, shape, backend="slurm", trial_id=None)
    again = submit_trial(mgr, shape, backend="slurm")
    assert (first.how, again.how) == ("submitted", "existing")
    assert [r.id for r in again.records] == [r.id for r in first.records] and fake.count("sbatch") == 2

    broken = TrialShape(
        key="trial-4", jobs=[job_spec(tmp_path, "server"), job_spec(tmp_path, "fleet", cwd="/nonexistent")]
    )
    with pytest.raises(Exception):  # noqa: B017 (whatever the backend raises for a missing cwd; the cancel is checked)
        submit_trial(mgr, broken, backend="local")
    done = mgr.wait([r.id for r in mgr.sink.group("trial-4")], timeout_s=30)  # a cancel lands at the next poll
    assert [r.state for r in done] == [JobState.CANCELLED, JobState.FAILED]


def _rec(i: int, state: JobState, name: str = "", reason: str | None = None) -> JobRecord:
    return JobRecord(id=i, name=name or f"j{i}", backend="local", state=state, reason=reason)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([JobState.COMPLETED], JobState.COMPLETED),
        ([JobState.PENDING, JobState.RUNNING], JobState.RUNNING),
        ([JobState.COMPLETED, JobState.PENDING], JobState.PENDING),
        ([JobState.CANCELLED, JobState.TIMEOUT], JobState.TIMEOUT),
        ([JobState.CANCELLED, JobState.COMPLETED], JobState.CANCELLED),
        ([], JobState.FAILED),
    ],
)
def test_trial_state_takes_the_jobs_together(states: list[JobState], expected: JobState) -> None:
    assert trial_state([_rec(i, s, reason=f"r{i}") for i, s in enumerate(states)]).state == expected


def test_poll_trials_reconciles_and_reads_one_state(mgr: JobManager, tmp_path: Path) -> None:
    ok = TrialShape(key="trial-5", jobs=[job_spec(tmp_path, "ok", command=["true"])])
    said = "echo starting >&2; echo 'swarm train: --model: /x does not exist' >&2; exit 3"
    bad = TrialShape(key="trial-6", jobs=[job_spec(tmp_path, "bad", command=["bash", "-c", said])])
    submit_trial(mgr, ok)
    submit_trial(mgr, bad)

    def done() -> dict[str, Any] | None:
        states = poll_trials(mgr, ["trial-5", "trial-6"])
        return states if all(s.terminal for s in states.values()) else None

    states = wait_for(done, 30, what="trials done")
    assert states["trial-5"].state == JobState.COMPLETED  # type: ignore[index]
    assert (states["trial-6"].state, states["trial-6"].reason) == (  # type: ignore[index]
        JobState.FAILED,
        "exit code 3: swarm train: --model: /x does not exist",  # the job's last words: its reason
    )


def test_the_last_error_of_a_job_is_its_panel_or_its_last_line(tmp_path: Path) -> None:
    panel = tmp_path / "panel"
    panel.write_text(
        "Usage: swarm train [OPTIONS]\n"
        "Try 'swarm train --help' for help.\n"
        "╭─ Error ─────────────────────────╮\n"
        "│ Invalid value for --lr: -1 is    │\n"
        "│ less than 0                      │\n"
        "╰──────────────────────────────────╯\n"
    )
    assert last_error(str(panel)) == "Invalid value for --lr: -1 is less than 0"
    trace = tmp_path / "trace"
    trace.write_text("Traceback (most recent call last):\n  File 'x.py', line 1\nKeyError: 'task_id'\n\n")
    assert last_error(str(trace)) == "KeyError: 'task_id'"
    (tmp_path / "empty").write_text("")
    assert last_error(str(tmp_path / "empty")) is None and last_error(str(tmp_path / "none")) is None
    assert last_error(None) is None
    (tmp_path / "long").write_text("x" * 1000)
    assert last_error(str(tmp_path / "long")) == "x" * 300 + "…"
