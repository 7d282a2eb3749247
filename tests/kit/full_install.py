"""The full install, seen from a suite that runs in a venv of its own (the Tinker SDK's, the cookbook's,
the agent frameworks'): its interpreter, a free port, and waiting for a `swarm serve` it started.

Stdlib and httpx only: those venvs hold no roost and no torch. The suites put this folder on sys.path
and import it by name.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from http_wait import wait_answering  # tests/kit, on sys.path

ROOT = Path(__file__).resolve().parents[2]


def full_python() -> str:
    """The interpreter of the full install (the server needs FastAPI, torch and transformers):
    `ROOST_FULL_PYTHON`, else the checkout's .venv-ci or .venv, else this one."""
    given = os.environ.get("ROOST_FULL_PYTHON")
    if given:
        return given
    for venv in (".venv-ci", ".venv"):
        py = ROOT / venv / "bin" / "python"
        if py.exists():
            return str(py)
    return sys.executable


def free_port() -> int:
    """`store.ports.free_port` (a port below the ephemeral range, which no outgoing connection takes),
    loaded from its file: this venv has no roost, and that module is stdlib only."""
    spec = importlib.util.spec_from_file_location("_roost_ports", ROOT / "store" / "ports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.free_port())


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 180.0) -> None:
    """Return once the server `proc` answers `/api/v1/healthz`; RuntimeError with its log's tail if it
    exits or does not answer within `timeout` seconds."""
    wait_answering(f"{url}/api/v1/healthz", proc, log, timeout, every=0.2)
