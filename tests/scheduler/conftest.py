"""Fixtures for the scheduler tests: isolated data dirs, a database, a real Slurm when present.

Slurm: tests that need it request `slurm`. They skip (with the reason) only when Slurm
is truly absent: no `sbatch` on PATH or no answering controller. When env `CI` is set
or `ROOST_REQUIRE_SLURM=1` they fail instead, so CI cannot go green by silently
testing the local backend only. Bring Slurm up with `.ci/slurm.sh` (as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# helper modules beside this file (sched_helpers) import by name under --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler.base import JobHandle
from scheduler.slurm import SlurmBackend
from scheduler.spec import JobSpec
from store.db import dispose_engines
from store.schema import init_db


def slurm_required() -> bool:
    ci = os.environ.get("CI", "").strip().lower()
    return ci not in ("", "0", "false", "no") or os.environ.get("ROOST_REQUIRE_SLURM") == "1"


def slurm_problem() -> str | None:
    """Why Slurm cannot be used here, or None when it can."""
    for tool in ("sbatch", "squeue", "scontrol", "scancel", "sinfo"):
        if shutil.which(tool) is None:
            return f"Slurm is not installed: no `{tool}` on PATH (run .ci/slurm.sh as root)"
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "the Slurm controller does not answer (`sinfo` timed out); run .ci/slurm.sh"
    if res.returncode != 0:
        return f"the Slurm controller does not answer: {res.stderr.strip()} (run .ci/slurm.sh)"
    states = res.stdout.split()
    if not any(s.rstrip("*~#!%$@^-").lower() in ("idle", "mixed", "allocated", "completing") for s in states):
        return f"Slurm answers but has no usable node (states: {states or 'none'}); run .ci/slurm.sh"
    return None


@pytest.fixture(scope="session")
def slurm() -> None:
    """Require a working Slurm (skip, or fail under CI / ROOST_REQUIRE_SLURM=1)."""
    problem = slurm_problem()
    if problem:
        if slurm_required():
            pytest.fail(f"Slurm is required here (CI / ROOST_REQUIRE_SLURM=1): {problem}")
        pytest.skip(problem)


SLURM_TIMEOUT_TEST = "test_time_limit_kills_job[slurm]"


@pytest.fixture(scope="session", autouse=True)
def early_slurm_timeout_job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JobHandle | None]:
    """The Slurm time-limit job, submitted when the session starts (only if that test runs).

    Slurm limits are whole minutes and slurmctld checks them every 30 s, so that test
    takes 60-90 s of waiting; submitted first, the wait overlaps all other tests.
    """
    wanted = any(item.name == SLURM_TIMEOUT_TEST for item in request.session.items)
    if not wanted or slurm_problem():
        yield None
        return
    backend = SlurmBackend()
    handle = backend.submit(
        JobSpec(
            name="timelimit",
            command=["sleep", "600"],
            time_limit_s=60,
            log_dir=str(tmp_path_factory.mktemp("slurm-timeout")),
        )
    )
    yield handle
    backend.cancel(handle)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Never touch ~ or the developer's databases."""
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "roost-home"))
    monkeypatch.delenv("ROOST_DATABASE_URL", raising=False)
    monkeypatch.delenv("ROOST_LOCAL_MAX_JOBS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield
    dispose_engines()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A migrated SQLite database for one test."""
    url = f"sqlite:///{tmp_path / 'roost.db'}"
    init_db(url)
    return url
