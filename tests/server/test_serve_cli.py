"""`swarm serve` at the command line: a start that cannot work fails in one line and leaves nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def _refused(tmp_path: Path, *args: str) -> tuple[int, str]:
    """`swarm serve ARGS --out tmp/serve` that must fail: its exit status and its one line of output
    (a traceback fails the test), after checking it wrote nothing into its folder."""
    out = tmp_path / "serve"
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "serve", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
    )
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines  # no traceback
    assert not (out / "config.yaml").exists() and not (out / "secrets.json").exists()
    return r.returncode, lines[0]


def test_serve_on_a_port_in_use_says_so_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        _, line = _refused(tmp_path, "--engine", "fake", "--port", str(port))
    assert str(port) in line and "in use" in line and "--port" in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA can give --device cuda")
def test_serve_on_cuda_without_a_gpu_says_so_in_one_line(tmp_path: Path, model_dir: Path) -> None:
    """Not an 83-line traceback from inside the engine's placement: the flag, the reason, the fix."""
    code, line = _refused(tmp_path, "--model", str(model_dir), "--device", "cuda", "--no-mlflow", "--port", "0")
    assert code == 2 and "--device cuda" in line and "no CUDA GPU" in line and "--device cpu" in line, line
