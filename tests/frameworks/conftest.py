"""The framework conformance suite: a scripted Roost server on loopback, shared by the session.

Run by `.ci/frameworks.sh` in the torch-free `.venv-frameworks` (and `.venv-frameworks-li` for
llama-index), with the server from the full install (`ROOST_FULL_PYTHON`):

    ROOST_FULL_PYTHON=.venv/bin/python .venv-frameworks/bin/python -m pytest tests/frameworks \\
        --confcutdir tests/frameworks -p no:cacheprovider

A framework that is not importable is skipped, unless `ROOST_REQUIRE_FRAMEWORKS=1` (CI), where it
fails. The server (`scripted_server.py`) starts on first use, in its own process, and is stopped by
its PID when the session ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # suite.py, by name under --import-mode=importlib

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kit"))  # full_install.py, by name
from full_install import ROOT, full_python  # noqa: E402
from suite import Roost  # noqa: E402


@pytest.fixture(scope="session")
def roost() -> Iterator[Roost]:
    work = Path(tempfile.mkdtemp(prefix="roost-fw-session-"))
    info = work / "server.json"
    log = (work / "server.log").open("w")
    env = {**os.environ, "ROOST_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [full_python(), str(Path(__file__).parent / "scripted_server.py"), str(info)],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while not info.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(f"the scripted server did not start:\n{(work / 'server.log').read_text()[-3000:]}")
            time.sleep(0.1)
        got = json.loads(info.read_text())
        yield Roost(got["url"], got["token"], Path(got["out"]))
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the server's stop signal
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
