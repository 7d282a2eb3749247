"""Tick targets for the daemon tests (must be importable by reference: "sched_ticks:touch")."""

from __future__ import annotations

from pathlib import Path


def touch(path: str) -> None:
    """Append one line per call, so the test can count runs."""
    with Path(path).open("a") as f:
        f.write("tick\n")
