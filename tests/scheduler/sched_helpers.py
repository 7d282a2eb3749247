"""Helpers shared by the scheduler tests (imported as a plain module: tests/ has no packages)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


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
