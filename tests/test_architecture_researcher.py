"""The researcher holds no backend-specific code: how jobs run and are found again is the scheduler's.

Fails on Slurm commands, /proc, imports of the scheduler's backend modules, and any
comparison with a backend's name (`if backend == "local"`) anywhere in `researcher/`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

RESEARCHER = Path(__file__).resolve().parents[1] / "researcher"
SOURCES = sorted(RESEARCHER.rglob("*.py"))

BACKEND_WORDS = re.compile(r"\b(squeue|sbatch|scontrol|scancel|sacct)\b|/proc\b")
BACKEND_NAMES = {"local", "slurm"}
BACKEND_MODULES = ("scheduler.local", "scheduler.slurm", "scheduler._wrap", "scheduler._slurm_parse", "scheduler.fake")


def _names_in(node: ast.expr) -> set[str]:
    """Backend-name string literals in a comparison operand (also inside a tuple/list/set)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in BACKEND_NAMES}


def _offences(path: Path) -> list[str]:
    text = path.read_text()
    found = [
        f"{path.name}:{n}: {m.group(0)!r}"
        for n, line in enumerate(text.splitlines(), 1)
        for m in BACKEND_WORDS.finditer(line)
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            names = set().union(*(_names_in(x) for x in (node.left, *node.comparators)))
            if names:
                found.append(f"{path.name}:{node.lineno}: compares with backend name(s) {sorted(names)}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(m.startswith(BACKEND_MODULES) for m in mods):
                found.append(f"{path.name}:{node.lineno}: imports from {node.module}")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.name}:{node.lineno}: imports {a.name}" for a in node.names if a.name.startswith(BACKEND_MODULES)
            ]
    return found


def test_the_check_sees_the_researcher_package() -> None:
    assert any(p.name == "trials.py" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(RESEARCHER)))
def test_no_backend_specific_code_in_researcher(path: Path) -> None:
    assert _offences(path) == []


def test_the_check_catches_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import subprocess\nfrom scheduler.local import proc_start_ticks\n"
        'if cfg.backend == "local":\n    subprocess.run(["squeue", "-h"])\n'
        'elif "slurm" in (cfg.backend,):\n    open("/proc/1/stat")\n'
    )
    assert len(_offences(bad)) == 5
