"""The package's public surface is exactly `__all__` (sorted), and every name resolves."""

from __future__ import annotations

import scheduler


def test_all_is_sorted_and_resolves() -> None:
    assert scheduler.__all__ == sorted(scheduler.__all__)
    for name in scheduler.__all__:
        assert getattr(scheduler, name) is not None, name


def test_public_names_are_exactly_these() -> None:
    assert set(scheduler.__all__) == {
        "Backend",
        "BackendError",
        "BackendUnavailable",
        "Daemon",
        "JobHandle",
        "JobManager",
        "JobRecord",
        "JobSpec",
        "JobState",
        "JobStatus",
        "LocalBackend",
        "MemorySink",
        "SlurmBackend",
        "StoreSink",
        "TrialLaunch",
        "TrialShape",
        "TrialState",
        "poll_trials",
        "register_tick",
        "render_script",
        "submit_trial",
        "trial_jobs",
        "trial_state",
        "unregister_tick",
    }


def test_backends_satisfy_the_protocol(tmp_path: object) -> None:
    from scheduler.fake import FakeSlurm

    assert isinstance(scheduler.LocalBackend(max_concurrent=1), scheduler.Backend)
    assert isinstance(scheduler.SlurmBackend(runner=FakeSlurm()), scheduler.Backend)


def test_wrapper_starts_without_heavy_imports() -> None:
    """Every local job's supervisor imports scheduler._wrap: it must not pull in the world."""
    import subprocess
    import sys

    code = (
        "import sys, scheduler._wrap; heavy = {'pydantic', 'sqlalchemy', 'apscheduler', 'sqlmodel'}"
        " & set(sys.modules); print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
