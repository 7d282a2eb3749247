"""Static guards on the server's structure: domain code knows no HTTP, routes share no helpers,
components do not import the `Swarm` that wires them, and no module imports the project late."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from swarm.server.errors import status_of
from swarm.server.exceptions import (
    EpisodeClosed,
    EpisodeNotFound,
    GenerateTimeout,
    InvalidKey,
    InvalidRequest,
    Refused,
    StaleLease,
    SwarmError,
    Unavailable,
    WrongEpisode,
)

SERVER = Path(__file__).resolve().parents[2] / "swarm" / "server"
DOMAIN = (
    "episodes",
    "batcher",
    "quotas",
    "buffer",
    "recovery",
    "leases",
    "trainer",
    "control",
    "render",
    "checkpoint",
    "events",
    "exceptions",
    "state",
    "admin_schema",
    "openai_schema",
)
COMPONENTS = ("episodes", "batcher", "quotas", "buffer", "recovery", "leases", "trainer", "control", "render")
ROUTES = ("openai_routes", "swarm_routes", "admin_routes")
HTTP = ("fastapi", "starlette", "swarm.server.errors", "swarm.server.auth", "swarm.server.app")


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported module, inside a function?) for every import of `swarm/server/<module>.py`."""
    tree = ast.parse((SERVER / f"{module}.py").read_text())
    out: list[tuple[str, bool]] = []

    def walk(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((a.name, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                out.extend([(child.module, inner)] + [(f"{child.module}.{a.name}", inner) for a in child.names])
            walk(child, inner)

    walk(tree, False)
    return out


@pytest.mark.parametrize("module", DOMAIN)
def test_domain_modules_know_no_http(module: str) -> None:
    bad = [m for m, _ in _imports(module) if m.startswith(HTTP)]
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", COMPONENTS)
def test_components_do_not_import_the_swarm(module: str) -> None:
    assert not [m for m, _ in _imports(module) if m.startswith("swarm.server.state")]


@pytest.mark.parametrize("module", ROUTES)
def test_route_modules_do_not_import_each_other(module: str) -> None:
    others = tuple(f"swarm.server.{r}" for r in ROUTES if r != module)
    assert not [m for m, _ in _imports(module) if m.startswith(others)]


# the only late project imports: heavy edges (module -> what it may import inside a function)
HEAVY = {
    "app": (
        "swarm.engine.torch_engine",
        "swarm.engine.lora",  # torch (and peft)
        "swarm.engine.policies",  # torch and peft: the shared base of several policies
        "swarm.engine.vllm",
        "swarm.engine.verl",  # vllm, verl+ray
        "swarm.server.http_protocol",
        "swarm.server.hangup",
    ),  # uvicorn's protocol classes and server, only in a serving process
    "tracking": ("store.tracking",),  # MLflow
    # torch and peft: a fake-engine server never loads them (the batcher's BASE_ADAPTER: the base sampler's)
    "tinker_hooks": ("swarm.tinker.service", "swarm.engine.continuous"),
}


def test_no_late_project_imports_but_heavy_edges() -> None:
    for path in SERVER.glob("*.py"):
        if path.stem in ("cli", "config", "bootstrap"):
            continue  # the CLI's, checked with it
        late = [
            m
            for m, local in _imports(path.stem)
            if local and m.split(".")[0] in ("swarm", "store") and not m.startswith(HEAVY.get(path.stem, ("-",)))
        ]
        assert not late, f"{path.name} imports {late} inside a function"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidRequest("invalid_prompt", "x"), 400),
        (InvalidKey(), 401),
        (WrongEpisode(), 403),
        (EpisodeNotFound("e"), 404),
        (StaleLease(), 409),
        (EpisodeClosed("e", "finished"), 409),
        (Refused("window_full", "x"), 429),
        (Unavailable("stopping", "x"), 503),
        (GenerateTimeout(1.0), 504),
        (SwarmError("mystery", "x"), 500),
    ],
)
def test_each_domain_error_has_one_status(error: SwarmError, status: int) -> None:
    assert status_of(error) == status
