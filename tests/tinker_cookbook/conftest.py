"""A real `swarm serve` (the full install) on loopback for tinker-cookbook's loops, one a session.

`.ci/tinker_cookbook.sh` runs these tests in `.venv-cookbook` (tinker-cookbook 0.5.8, tinker 0.38.0,
torch, pytest; no roost) with `ROOST_FULL_PYTHON` pointing at the full install's python:

    ROOST_FULL_PYTHON=$PWD/.venv/bin/python .venv-cookbook/bin/python -m pytest tests/tinker_cookbook \\
        --confcutdir tests/tinker_cookbook -p no:cacheprovider

Nothing here imports the project or the cookbook: the server is a separate process, started here and
stopped by its PID when the session ends (kill -9 if it does not stop), and the model and the
`arith` problems come from the full install through subprocesses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cookbook_serving.py, by name under --import-mode=importlib

from cookbook_serving import TOKEN, Served, embedded_model  # noqa: E402
from full_install import ROOT, free_port, full_python, wait_healthy  # noqa: E402


@pytest.fixture(scope="session")
def roost_server() -> Iterator[Served]:
    """`swarm serve` of the embedded model as a policy server (LoRA rank 8), torch on the CPU."""
    model = embedded_model()
    work = Path(tempfile.mkdtemp(prefix="roost-cookbook-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ROOST_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1"}
    cmd = [full_python(), "-m", "swarm", "serve", "--engine", "torch", "--device", "cpu", "--model", model]
    cmd += ["--port", str(port), "--token", TOKEN, "--admin-token", "cookbook-admin", "--lora-rank", "8"]
    cmd += ["--policy", "main", "--out", str(work / "server"), "--no-mlflow"]
    log = work / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        wait_healthy(proc, url, log)
        with pytest.MonkeyPatch.context() as env_of_the_sdk:  # what a user exports (docs/tinker.md)
            env_of_the_sdk.setenv("TINKER_BASE_URL", url)
            env_of_the_sdk.setenv("TINKER_API_KEY", f"tml-{TOKEN}")
            env_of_the_sdk.setenv("TINKER_TELEMETRY", "0")
            yield Served(url, model, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
