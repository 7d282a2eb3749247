"""The backend contract, run against the local backend and a REAL single-node Slurm.

Each test drives a `Backend` only through its interface: submit, status (batched),
cancel, logs, reattach, find. Backend-specific bits are in `Env`: how to make a job wait
(local: a blocker holding the only slot; Slurm: --begin=now+3) and how long a time
limit takes to bite (local: exact seconds; Slurm: whole minutes, checked every 30 s,
so its time-limit job is submitted when the test session starts (conftest) and only
checked in the last test, overlapping its ~75 s with the other tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sched_helpers import wait_for

from scheduler.base import Backend, JobHandle, JobStatus
from scheduler.local import LocalBackend
from scheduler.slurm import SlurmBackend
from scheduler.spec import ENV_JOB_ID, JobSpec
from store.models import JobState

pytestmark = pytest.mark.integration


@dataclass
class Env:
    backend: Backend
    log_dir: Path
    kind: str
    timeout_job: JobHandle | None = None
    cleanup: list[JobHandle] = field(default_factory=list)

    def spec(self, name: str, command: list[str], **kw: object) -> JobSpec:
        return JobSpec(name=name, command=command, log_dir=str(self.log_dir), **kw)  # type: ignore[arg-type]

    def submit(self, spec: JobSpec) -> JobHandle:
        h = self.backend.submit(spec)
        self.cleanup.append(h)
        return h

    def submit_pending(self, spec: JobSpec) -> tuple[JobHandle, Callable[[], None]]:
        """Submit so that the job is observably PENDING until `release()`."""
        if self.kind == "slurm":
            return self.submit(spec.model_copy(update={"slurm_args": ["--begin=now+3"]})), lambda: None
        blocker = self.submit(self.spec("blocker", ["sleep", "60"]))
        wait_for(lambda: self.status(blocker).state == JobState.RUNNING, 10, what="blocker running")
        return self.submit(spec), lambda: self.backend.cancel(blocker)

    def status(self, h: JobHandle) -> JobStatus:
        return self.backend.status([h])[h.external_id]

    def wait_state(self, h: JobHandle, pred: Callable[[JobStatus], bool], timeout: float) -> JobStatus:
        def check() -> JobStatus | None:
            st = self.status(h)
            return st if pred(st) else None

        return wait_for(check, timeout, what=f"{h.name} state")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def _slurm_env_shared(
    tmp_path_factory: pytest.TempPathFactory, slurm: None, early_slurm_timeout_job: JobHandle | None
) -> Iterator[Env]:
    env = Env(SlurmBackend(min_poll_s=0.1, max_poll_s=0.5), tmp_path_factory.mktemp("slurm-logs"), "slurm")
    # Submitted as early as possible (see the module docstring and conftest).
    env.timeout_job = early_slurm_timeout_job or env.backend.submit(
        env.spec("timelimit", ["sleep", "600"], time_limit_s=60)
    )
    yield env
    for h in [*env.cleanup, env.timeout_job]:
        if h is not None:
            env.backend.cancel(h)


@pytest.fixture(params=["local", "slurm"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "slurm":
        shared: Env = request.getfixturevalue("_slurm_env_shared")
        yield shared
        return
    e = Env(LocalBackend(max_concurrent=1, state_dir=tmp_path / "state", kill_wait_s=1.0), tmp_path / "logs", "local")
    yield e
    for h in e.cleanup:
        e.backend.cancel(h, force=True)


def test_lifecycle_pending_running_completed(env: Env) -> None:
    h, release = env.submit_pending(env.spec("life", ["bash", "-c", "echo to-out; echo to-err >&2; sleep 2"]))
    assert env.status(h).state == JobState.PENDING
    release()
    seen = [JobState.PENDING]
    end = time.monotonic() + 60
    while time.monotonic() < end:
        st = env.status(h)
        if st.state != seen[-1]:
            seen.append(st.state)
        if st.terminal:
            break
        time.sleep(0.1)
    assert seen == [JobState.PENDING, JobState.RUNNING, JobState.COMPLETED], seen
    assert st.exit_code == 0 and st.started_at is not None and st.finished_at is not None
    assert "to-out" in env.backend.logs(h)
    assert "to-err" in env.backend.logs(h, "stderr")
    assert env.backend.reattach(h).state == JobState.COMPLETED


def test_failing_job_reports_exit_code(env: Env) -> None:
    h = env.submit(env.spec("fails", ["bash", "-c", "echo doomed; exit 7"]))
    st = env.wait_state(h, lambda s: s.terminal, 30)
    assert st.state == JobState.FAILED
    assert st.exit_code == 7


def test_status_is_batched_and_keyed_by_external_id(env: Env) -> None:
    hs = [env.submit(env.spec(f"batch{i}", ["true"])) for i in range(3)]
    wait_for(lambda: all(s.terminal for s in env.backend.status(hs).values()), 30, what="batch done")
    assert set(env.backend.status(hs)) == {h.external_id for h in hs}


def test_cancel_running_job(env: Env) -> None:
    h = env.submit(env.spec("tocancel", ["sleep", "120"]))
    env.wait_state(h, lambda s: s.state == JobState.RUNNING, 30)
    env.backend.cancel(h)
    st = env.wait_state(h, lambda s: s.terminal, 30)
    assert st.state == JobState.CANCELLED


def test_env_and_cwd_reach_the_job(env: Env, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    h = env.submit(
        env.spec("envcwd", ["bash", "-c", 'echo "v=$ROOST_T_VAR"; pwd'], env={"ROOST_T_VAR": "a b'c"}, cwd=str(work))
    )
    st = env.wait_state(h, lambda s: s.terminal, 30)
    assert st.state == JobState.COMPLETED
    out = env.backend.logs(h)
    assert "v=a b'c" in out and str(work) in out


def test_find_names_the_job_a_lost_submit_started(env: Env) -> None:
    """What a submitter that died before recording the handle gets back after a restart."""
    mine = env.spec("lost", ["sleep", "30"], env={ENV_JOB_ID: "41"})
    h = env.submit(mine)
    env.submit(env.spec("lost", ["sleep", "30"], env={ENV_JOB_ID: "42"}))  # same name, another submission
    assert env.backend.find(mine) == h
    assert env.backend.find(env.spec("lost", ["sleep", "30"], env={ENV_JOB_ID: "43"})) is None
    assert env.backend.find(env.spec("never-submitted", ["true"])) is None
    env.backend.cancel(h)
    env.wait_state(h, lambda s: s.terminal, 30)
    assert env.backend.find(mine) == h  # also once it has ended


def test_time_limit_kills_job(env: Env) -> None:
    if env.kind == "slurm":
        h = env.timeout_job
        assert h is not None
        budget = 150  # Slurm: 60 s limit + up to 30 s until slurmctld's next check + KillWait
    else:
        h = env.submit(env.spec("timelimit", ["sleep", "60"], time_limit_s=1))
        budget = 15
    st = env.wait_state(h, lambda s: s.terminal, budget)
    assert st.state == JobState.TIMEOUT, st
