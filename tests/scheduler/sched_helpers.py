"""Helpers shared by the scheduler tests (imported as a plain module: tests/ has no packages)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler.spec import JobSpec


def wait_for(pred: Callable[[], object], timeout: float, interval: float = 0.05, what: str = "condition") -> object:
    """Poll `pred` until it returns something truthy; fail the test after `timeout` s."""
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def job_spec(tmp_path: Path, name: str = "job", **kw: Any) -> JobSpec:
    """A 30 s sleep logging under `tmp_path/logs`; `kw` overrides any field."""
    base: dict[str, Any] = {"name": name, "command": ["sleep", "30"], "log_dir": str(tmp_path / "logs")}
    base.update(kw)
    return JobSpec(**base)
