"""`swarm serve` at the command line: a start that cannot work fails in one line and leaves nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


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
