"""The import graph the architecture promises (docs/architecture.md), checked from the source.

* no import cycle between project modules, counting imports inside functions and
  under `TYPE_CHECKING` (a typed-only loop is still a design loop);
* the pure cores, `swarm.timeline` and `swarm.algorithms`, import nothing of the
  project but the ground-floor `swarm.samples`;
* packages depend one way: `researcher -> scheduler -> store`, `swarm -> store`;
* inside `swarm`, sub-packages stand in layers (`SWARM_LAYERS`) and import only downward:
  the config vocabulary below every user of it, the engines below the server, the
  server below the commands that start it;
* a function-local import says why it is lazy (`# lazy: <reason>`);
* a default is written once: changing one line of a config model changes the CLI
  help, the config file a run writes, and the researcher's knob.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("swarm", "researcher", "scheduler", "store", "prompts")
ALLOWED = {  # package -> project packages it may import
    "store": {"store"},
    "scheduler": {"scheduler", "store"},
    "swarm": {"swarm", "store"},
    "researcher": {"researcher", "scheduler", "store", "swarm", "prompts"},
    "prompts": {"prompts"},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> list[tuple[str, ast.stmt, bool]]:
    """(imported project module, statement, inside a function) for every import of `module`."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, ast.stmt, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((name.name, child, inner) for name in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = package
                    for _ in range(child.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                for name in child.names:
                    full = f"{base}.{name.name}"
                    out.append((full if full in MODULES else base, child, inner))
            visit(child, inner)

    visit(tree, False)
    return out


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for name, _, _ in _imports(module, path):
            target = _resolve(name)
            if target is not None and target != module:
                edges[module].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in MODULES:
        if v not in index:
            strong(v)
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    global MODULES
    saved, MODULES = MODULES, {name: Path(name) for name in "abcd"}
    try:
        assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
        assert _cycles({"a": {"b"}, "b": {"c"}, "d": {"a"}}) == []
    finally:
        MODULES = saved


@pytest.mark.parametrize("core", ["swarm.timeline", "swarm.algorithms"])
def test_pure_cores_import_only_the_sample_vocabulary(core: str) -> None:
    edges = _graph()
    for module in (m for m in MODULES if m == core or m.startswith(core + ".")):
        outside = {t for t in edges.get(module, ()) if not (t == core or t.startswith(core + "."))}
        assert outside <= {"swarm.samples"}, f"{module} imports {sorted(outside)}"


def test_swarm_samples_is_the_ground_floor() -> None:
    assert _graph().get("swarm.samples", set()) == set()
    assert _graph().get("store.paths", set()) == set()


@pytest.mark.parametrize("module", ["store.paths", "store.ports"])
def test_stdlib_only_modules_import_only_the_stdlib(module: str) -> None:
    """store.ports is loaded by path in venvs without roost or its dependencies (tests/kit/full_install.py)."""
    found = {name.partition(".")[0] for name, _, _ in _imports(module, MODULES[module])} - {"__future__"}
    assert found <= set(sys.stdlib_module_names), f"{module} imports {sorted(found - set(sys.stdlib_module_names))}"


#: swarm's sub-packages (and top-level modules), lowest first. A module may import its own
#: sub-package and any sub-package of a lower layer; never one of its own layer or above.
SWARM_LAYERS: list[set[str]] = [
    {"swarm.samples"},  # the ground floor: calls and training samples
    {"swarm.algorithms", "swarm.timeline"},  # the pure cores
    # built-in tasks; the wire protocol's bodies; one TLS context; the child processes a run starts; where a
    # run folder keeps each policy or role (read by eval and inspect); one process per folder (its lock); an
    # output path a command was given, checked before its work (eval --json, export --merge, inspect --html);
    # the user's own code a --workflow or --dataset names, imported
    {
        "swarm.tasks",
        "swarm.protocol",
        "swarm.tls",
        "swarm.children",
        "swarm.run_layout",
        "swarm.folder_lock",
        "swarm.output_paths",
        "swarm.kept_files",
        "swarm.user_code",
    },
    {"swarm.config"},  # every settings model and the option derivation
    {"swarm.chat"},  # tool-call parsing, shared by the model package and the server
    {"swarm.engine"},  # models behind one interface
    {"swarm.model"},  # building and evaluating the embedded model
    {"swarm.client", "swarm.rewards"},  # the SDK and fleets; rewards a workflow computes (an LLM judge)
    {"swarm.tinker"},  # the Tinker-compatible API: primitives on policies of the base (the server mounts it)
    {"swarm.server"},  # the swarm server
    # what `swarm train` checks before it starts anything, and its folder rules; its fleets' failure lines
    {"swarm.resume_checks"},  # what a resumed run's checkpoint can take
    {"swarm.run_checks", "swarm.fleet_alerts"},
    {"swarm.run_summary"},  # a run's summary.json, however it ran (train, --attach, --team)
    {"swarm.testing", "swarm.train", "swarm.inspect", "swarm.ctl", "swarm.plugins"},  # what drives a server
    {"swarm.team_resume"},  # a --team run's folder as `--resume` reads it (under team_run, which uses it)
    {"swarm.team_checks"},  # what a --team names, checked before anything starts (reads team_resume's folder)
    {"swarm.attach", "swarm.team_run"},  # `swarm train --attach` / `--team`: reuse train's parts
    {"swarm.cli"},  # the command line
    {"swarm.__main__", "swarm"},  # `python -m swarm`; the package itself
]


def _swarm_part(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _upward_imports(edges: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    layer = {part: i for i, parts in enumerate(layers) for part in parts}
    bad = []
    for module, targets in edges.items():
        if not module.startswith("swarm"):
            continue
        here = _swarm_part(module)
        for target in targets:
            there = _swarm_part(target)
            if target.startswith("swarm") and there != here and layer[there] >= layer[here]:
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def test_every_swarm_part_has_a_layer() -> None:
    parts = {_swarm_part(m) for m in MODULES if m == "swarm" or m.startswith("swarm.")}
    placed = set().union(*SWARM_LAYERS)
    assert parts - placed == set(), "add the new sub-package to SWARM_LAYERS"
    assert placed - parts == set(), "SWARM_LAYERS names a sub-package that no longer exists"


def test_swarm_layers_import_only_downward() -> None:
    assert _upward_imports(_graph(), SWARM_LAYERS) == []


def test_the_layer_check_finds_upward_and_sideways_imports() -> None:
    layers = [{"swarm.a"}, {"swarm.b", "swarm.c"}]
    edges = {"swarm.a.x": {"swarm.b.y"}, "swarm.b.y": {"swarm.c", "swarm.a.z", "swarm.b.w"}}
    assert _upward_imports(edges, layers) == ["swarm.a.x -> swarm.b.y", "swarm.b.y -> swarm.c"]


def test_packages_depend_one_way() -> None:
    bad = []
    for module, targets in _graph().items():
        pkg = module.split(".")[0]
        for t in targets:
            if t.split(".")[0] not in ALLOWED[pkg]:
                bad.append(f"{module} -> {t}")
    assert bad == []


def test_function_local_imports_say_why() -> None:
    missing = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for _, stmt, nested in _imports(module, path):
            if not nested:
                continue
            first = stmt.lineno - 1  # a block of lazy imports may share one reason, on its first line
            while first > 0 and lines[first - 1].strip().startswith(("import ", "from ")):
                first -= 1
            text = " ".join(lines[first : (stmt.end_lineno or stmt.lineno)])
            if "# lazy:" not in text:
                missing.append(f"{path.relative_to(ROOT)}:{stmt.lineno}")
    assert sorted(set(missing)) == []


DEFAULT_LINE = "lease_seconds: float = Field(\n        30.0,"  # the field, then its one default line


@pytest.mark.slow
def test_a_default_is_one_line(tmp_path: Path) -> None:
    """Change the lease's default in one line of a copy of the tree: help, config file and researcher follow."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "swarm" / "config" / "server.py"
    text = config.read_text()
    assert text.count(DEFAULT_LINE) == 1, "the lease default is no longer written once"
    config.write_text(text.replace(DEFAULT_LINE, DEFAULT_LINE.replace("30.0", "42.5")))
    probe = """
import json, sys
from typer.testing import CliRunner
from swarm.cli import app
from swarm.config.options import dump_config
from swarm.config.server import ServerConfig
from swarm.config.run import RunConfig
from researcher.experiment import KNOBS
runner = CliRunner()
helps = {c: runner.invoke(app, [c, "--help"], env={"COLUMNS": "400"}).output for c in ("serve", "train")}
print(json.dumps({
    "serve_help": [l for l in helps["serve"].splitlines() if "--lease-seconds" in l],
    "train_help": [l for l in helps["train"].splitlines() if "--lease-seconds" in l],
    "server_file": dump_config(ServerConfig())["lease_seconds"],
    "run_file": dump_config(RunConfig())["server"]["lease_seconds"],
    "knob": KNOBS["lease_seconds"].default,
    "where": __import__("swarm").__file__,
}))
"""
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "ROOST_HOME": str(tmp_path / "home")}
    r = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["where"].startswith(str(tmp_path))
    assert got["server_file"] == got["run_file"] == got["knob"] == 42.5
    assert len(got["serve_help"]) == 1 and "[default: 42.5]" in got["serve_help"][0]
    assert len(got["train_help"]) == 1 and "[default: 42.5]" in got["train_help"][0]
