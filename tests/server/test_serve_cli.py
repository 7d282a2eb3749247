"""`swarm serve` at the command line: a start that cannot work fails in one line and leaves nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def test_serve_on_a_port_in_use_says_so_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "serve"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "swarm", "serve", "--engine", "fake", "--port", str(port), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
        )
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines  # no traceback
    assert str(port) in lines[0] and "in use" in lines[0] and "--port" in lines[0], lines[0]
    assert not (out / "config.yaml").exists() and not (out / "secrets.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA can give --device cuda")
def test_serve_on_cuda_without_a_gpu_says_so_in_one_line(tmp_path: Path, model_dir: Path) -> None:
    """Not an 83-line traceback from inside the engine's placement: the flag, the reason, the fix."""
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "serve", "--model", str(model_dir), "--device", "cuda", "--no-mlflow"]
        + ["--port", "0", "--out", str(tmp_path / "serve")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
    )
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "--device cuda" in lines[0] and "no CUDA GPU" in lines[0], lines
    assert "--device cpu" in lines[0] and r.returncode == 2
    assert not (tmp_path / "serve" / "config.yaml").exists() and not (tmp_path / "serve" / "secrets.json").exists()
