"""`researcher` on an install without the `research` extra (the README's `pip install -e '.[server]'`).

`researcher --help` crashed there with `ModuleNotFoundError: No module named 'langgraph'`:
the CLI module imported the whole study machinery at the top. Now the help lists the
commands, and each command that needs the extra says in one line which modules are
missing and what to install, exit code 1, no traceback, the way `swarm serve` does for
the `server` extra.

The missing packages are simulated in a subprocess: every finder on `sys.meta_path` is
wrapped so that it does not see the research-only modules. `import langgraph` then
fails exactly as on a machine without it, and `importlib.util.find_spec` returns None
(a finder that raised instead would make find_spec raise, which no real install does).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hidden_modules import HIDE, RUN_CLI

ROOT = Path(__file__).resolve().parents[2]

# The `research` extra's own packages (roost[server] aside) and the module each installs. A package
# added to the extra must be added here, so that this test keeps simulating an install without it.
RESEARCH_MODULES = {
    "scipy": "scipy",
    "apscheduler": "apscheduler",
    "langgraph": "langgraph",
    "langchain-core": "langchain_core",
    "langchain-openai": "langchain_openai",
    "langgraph-checkpoint-sqlite": "langgraph",  # a namespace package under langgraph.checkpoint
    "langgraph-checkpoint-postgres": "langgraph",
}


def _extra() -> tuple[str, list[str]]:
    """The extra's name as pyproject.toml spells it, and the modules its own packages install."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    name = "research"
    packages = [d for d in extras[name] if not d.startswith("roost[")]
    dists = [p.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().lower() for p in packages]
    unknown = [d for d in dists if d not in RESEARCH_MODULES]
    assert not unknown, f"add these packages of roost[{name}] to RESEARCH_MODULES: {unknown}"
    return name, sorted({RESEARCH_MODULES[d] for d in dists})


def _run(code: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    _, hidden = _extra()
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "COLUMNS": "120", "TERM": "dumb", "NO_COLOR": "1"}
    for var in ("ROOST_LLM_BASE_URL", "ROOST_LLM_MODEL", "ROOST_DATABASE_URL"):
        env.pop(var, None)
    return subprocess.run(
        [sys.executable, "-c", code, ",".join(hidden), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )


def test_the_simulation_hides_the_research_modules(tmp_path: Path) -> None:
    code = HIDE + (
        "import importlib.util\n"
        "assert importlib.util.find_spec('langgraph') is None\n"
        "try:\n    import langgraph.graph\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    )
    r = _run(code, tmp_path=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "No module named 'langgraph'", r.stdout + r.stderr


def test_help_lists_the_commands_without_the_extra(tmp_path: Path) -> None:
    r = _run(RUN_CLI, "--help", tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for command in ("study", "approve", "resume", "status", "report", "stop", "daemon"):
        assert f" {command} " in r.stdout, command
    assert "Traceback" not in r.stdout + r.stderr


def test_a_commands_help_works_without_the_extra(tmp_path: Path) -> None:
    r = _run(RUN_CLI, "study", "--help", tmp_path=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--dry-run" in r.stdout and "--max-trials" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("study", "x", "--dry-run"),
        ("study", "Does the learning rate matter for arithmetic? Compare 0 and 3e-4", "--steps", "2"),
        ("status",),
        ("report", "1"),
        ("stop", "1"),
        ("approve", "1"),
        ("resume", "1"),
        ("daemon",),
    ],
    ids=lambda a: a[0] + ("-dry-run" if "--dry-run" in a else ""),
)
def test_a_command_needing_the_extra_says_what_to_install_in_one_line(args: tuple[str, ...], tmp_path: Path) -> None:
    extra, hidden = _extra()
    r = _run(RUN_CLI, *args, tmp_path=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert f"pip install 'roost[{extra}]'" in lines[0], lines[0]
    assert "langgraph" in lines[0], lines[0]  # the missing modules are named
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.db")), "a store was created"
