"""The test kit stays out of the shipped packages.

`swarm.testing` (a real server on loopback) is production code that benchmarks and
CI scripts use outside pytest; the pytest fixtures built on it live in `tests/kit/`.
So no shipped module imports a test framework, none outside the client SDK reaches
into its private modules, and importing `swarm.testing` loads no server, no torch
and no pytest until a server is actually started.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("swarm", "researcher", "scheduler", "store", "prompts")
TEST_FRAMEWORKS = {"pytest", "_pytest", "hypothesis", "schemathesis"}


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _shipped_modules() -> list[Path]:
    return sorted(f for pkg in SHIPPED for f in (ROOT / pkg).rglob("*.py"))


def test_no_shipped_module_imports_a_test_framework() -> None:
    bad = [
        f"{f.relative_to(ROOT)}: {name}"
        for f in _shipped_modules()
        for name in sorted(_imported(f))
        if name.split(".")[0] in TEST_FRAMEWORKS
    ]
    assert bad == []


def test_only_the_client_sdk_imports_its_private_modules() -> None:
    client = ROOT / "swarm" / "client"
    bad = [
        f"{f.relative_to(ROOT)}: {name}"
        for f in _shipped_modules()
        if client not in f.parents
        for name in sorted(_imported(f))
        if name.startswith("swarm.client._")
    ]
    assert bad == []


def test_importing_swarm_testing_loads_nothing_heavy() -> None:
    probe = (
        "import sys, swarm.testing; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'torch', 'pytest', 'swarm.server') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_procs_marked_finds_what_an_environment_started_and_nothing_else() -> None:
    """The suite's sweep of a lost worker's leftovers (tests/conftest.py) finds them by the environment
    they inherited, whatever their parent or session became."""
    import os
    import time
    import uuid

    from procs import gone_within, marked

    uid = uuid.uuid4().hex
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    mine = subprocess.Popen(sleeper, env={**os.environ, "ROOST_KIT_MARK": uid}, start_new_session=True)
    other = subprocess.Popen(sleeper, env={**os.environ, "ROOST_KIT_MARK": "other"}, start_new_session=True)
    try:
        for _ in range(50):  # the environment is readable once the child has exec'd
            found = marked({"ROOST_KIT_MARK": uid})
            if found:
                break
            time.sleep(0.02)
        assert found == [mine.pid]
        assert marked({"ROOST_KIT_MARK": uid}, spare={mine.pid}) == []
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()
    assert gone_within([mine.pid, other.pid], 5)
