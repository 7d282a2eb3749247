"""`researcher` on a client-only install (`pip install roost`: no numpy, torch, FastAPI...).

`researcher --help` there ended in a `ModuleNotFoundError: No module named 'numpy'` traceback
(the options' models import researcher.analysis, which needs numpy). It must say in one line
which extra to install, exit 1, the way the server commands do (issue 27, item 9).

Two ways: the packages of the `server` and `research` extras hidden in this venv (always runs),
and the real client-only venv `.venv-client` that `.ci/client.sh` builds, when it is there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hidden_modules import RUN_CLI

ROOT = Path(__file__).resolve().parents[2]
CLIENT_VENV_PYTHON = ROOT / ".venv-client" / "bin" / "python"

#: top-level modules of the `server` and `research` extras' packages: what a client-only install lacks
EXTRA_MODULES = (
    "numpy",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "llguidance",
    "peft",
    "fastapi",
    "uvicorn",
    "sqlmodel",
    "alembic",
    "mlflow",
    "psycopg",
    "matplotlib",
    "pandas",
    "scipy",
    "apscheduler",
    "langgraph",
    "langchain_core",
    "langchain_openai",
)

RUN = "import sys\nsys.argv = ['researcher', *sys.argv[1:]]\nfrom researcher.cli import main\nmain()\n"


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "COLUMNS": "120", "TERM": "dumb", "NO_COLOR": "1"}


def _assert_one_line(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "pip install 'roost[research]'" in lines[0] and "numpy" in lines[0], lines[0]


@pytest.mark.parametrize("args", [["--help"], ["study", "--help"], ["status"]])
def test_researcher_without_the_server_extra_says_which_extra_in_one_line(tmp_path: Path, args: list[str]) -> None:
    r = subprocess.run(
        [sys.executable, "-c", RUN_CLI, ",".join(EXTRA_MODULES), *args],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    _assert_one_line(r)


@pytest.mark.skipif(not CLIENT_VENV_PYTHON.exists(), reason="no .venv-client (.ci/client.sh builds it)")
def test_researcher_help_in_the_real_client_only_venv(tmp_path: Path) -> None:
    # cwd=ROOT puts this checkout's packages first on sys.path, before the venv's installed copy
    r = subprocess.run(
        [str(CLIENT_VENV_PYTHON), "-c", RUN, "--help"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    _assert_one_line(r)


def test_a_missing_module_of_our_own_is_not_taken_for_a_missing_extra(tmp_path: Path) -> None:
    """Hiding `researcher.planning` (a bug, not an install without the extra) keeps its traceback."""
    code = RUN_CLI.replace('if name.partition(".")[0] in HIDDEN', "if name in HIDDEN")
    r = subprocess.run(
        [sys.executable, "-c", code, "researcher.planning", "--help"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "Traceback" in r.stderr and "researcher.planning" in r.stderr, r.stderr
