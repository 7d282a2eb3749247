"""The stdlib-only helpers of the cookbook tests: the full install's python, the embedded model, Roost's
`arith` problems, the figures' report, `swarm serve` health. Imported by name (conftest.py and the test
module put this folder on sys.path), never by the main suite's conftest.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "cookbook-worker-token"


def full_python() -> str:
    """The interpreter of the full install (the server needs FastAPI, torch and transformers)."""
    given = os.environ.get("ROOST_FULL_PYTHON")
    if given:
        return given
    for venv in (".venv-ci", ".venv"):
        py = ROOT / venv / "bin" / "python"
        if py.exists():
            return str(py)
    return sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_model() -> str:
    """The warm-started embedded model (`swarm model init`; built there if missing, ~4 min).

    `ROOST_COOKBOOK_MODEL` names another directory. The RL test needs the warm start: from random
    weights `arith` never earns a reward.
    """
    given = os.environ.get("ROOST_COOKBOOK_MODEL")
    if given:
        return given
    code = "from swarm.model.build import init_model; print(init_model())"
    r = subprocess.run([full_python(), "-c", code], capture_output=True, text=True, timeout=900, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"swarm model init failed:\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


def write_arith_problems(path: Path, seed: int, size: int) -> Path:
    """Roost's own `arith` problems (`swarm.tasks.arith.dataset`) as JSONL rows {question, answer}."""
    code = (
        "import json, sys; from swarm.tasks.arith import dataset\n"
        "rows = dataset(int(sys.argv[2]), int(sys.argv[3]))\n"
        "open(sys.argv[1], 'w').write(''.join(json.dumps({'question': r['question'], 'answer': r['answer']})"
        " + '\\n' for r in rows))"
    )
    subprocess.run([full_python(), "-c", code, str(path), str(seed), str(size)], check=True, timeout=120, cwd=ROOT)
    return path


@dataclass
class Served:
    url: str
    model: str
    log: Path


def wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    import httpx  # lazy: the SDK's own dependency, in the cookbook's venv

    end = time.monotonic() + 180
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"swarm serve exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"swarm serve did not start:\n{log.read_text()[-3000:]}")


def report(name: str, figures: dict) -> None:
    """One line of the measured figures, to stdout (pytest -s) and to ROOST_COOKBOOK_REPORT if set."""
    line = f"{name}: {json.dumps(figures)}"
    print(line)
    if os.environ.get("ROOST_COOKBOOK_REPORT"):
        with open(os.environ["ROOST_COOKBOOK_REPORT"], "a") as f:
            f.write(line + "\n")
