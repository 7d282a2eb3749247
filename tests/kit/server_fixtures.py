"""Pytest fixtures shared by the server and client test suites (re-exported by their conftests).

A tiny model dir built once per session, ROOST_HOME in tmp, every SwarmClient and
Episode a test made closed afterwards, and `make_server(engine=None, **config)` for
a real loopback server (FakeEngine by default). Test code, so it lives under tests/
and not in a shipped package; the conftests put this folder on sys.path
(`--import-mode=importlib` does not) and import it by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from swarm.client import AsyncEpisode, Episode, SwarmClient
from swarm.config.server import ServerConfig
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer, running_server, tiny_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _roost_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "roost-home"))


@pytest.fixture(autouse=True)
def _close_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every SwarmClient and Episode a test made (their sockets), so no ResourceWarnings leak.

    Patches the public classes one by one (each defines its own `__init__`), so the kit
    needs no private base class of the client.
    """
    made: list[Any] = []
    for cls in (SwarmClient, Episode, AsyncEpisode):

        def init(self: Any, *args: Any, __orig: Any = cls.__init__, **kwargs: Any) -> None:
            __orig(self, *args, **kwargs)
            made.append(self)

        monkeypatch.setattr(cls, "__init__", init)
    yield
    for obj in reversed(made):
        obj.close()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


@pytest.fixture
def make_server(model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """`make_server(engine=None, **config)` -> a running server (FakeEngine by default)."""
    with ExitStack() as stack:

        def make(engine: Any = None, **overrides: Any) -> RunningServer:
            fields = {
                "engine": "fake",
                "model_dir": model_dir,
                "out_dir": tmp_path / "out",
                "group_size": 2,
                "batch_groups": 2,
                "checkpoint_every": 0,
                "token": "worker-token",
                "admin_token": "admin-token",
                "stop_grace_s": 0.2,
            }
            fields.update(overrides)
            config = ServerConfig(**fields)
            eng = engine if engine is not None else FakeEngine(model_dir)
            return stack.enter_context(running_server(config, eng))

        yield make


@pytest.fixture
def server(make_server: Callable[..., RunningServer]) -> RunningServer:
    return make_server()
