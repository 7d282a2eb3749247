"""Fixtures of the Tinker API tests: a real torch policy server on loopback (tiny model, one LoRA
policy `main`), and `TinkerHTTP`, a raw httpx client of its `/api/v1` routes.

The SDK's own tests (test_sdk.py) run in the torch-free `.venv-tinker` against a `swarm serve`
started by `.ci/tinker.sh`; they do not use these fixtures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tinker_kit (tests/kit: the root conftest)

from server_fixtures import _roost_home, model_dir  # noqa: E402
from tinker_kit import TOKEN, TinkerHTTP  # noqa: E402

__all__ = ["_roost_home", "model_dir", "tinker_server"]


@pytest.fixture
def tinker_server(model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """`tinker_server(**config)` -> (RunningServer, TinkerHTTP): a torch server of one LoRA policy."""
    from swarm.config.server import ServerConfig  # lazy: the server's modules, only for these tests
    from swarm.server.app import make_host
    from swarm.testing import running_server

    with ExitStack() as stack:

        def make(**overrides: Any) -> tuple[Any, TinkerHTTP]:
            fields: dict[str, Any] = {
                "engine": "torch",
                "device": "cpu",
                "model_dir": model_dir,
                "out_dir": tmp_path / "out",
                "group_size": 2,
                "batch_groups": 1,
                "checkpoint_every": 0,
                "token": TOKEN,
                "admin_token": "tinker-admin-token",
                "stop_grace_s": 0.2,
                "mlflow": False,
                "lora": {"rank": 4},
                "policies": [{"name": "main"}],
            }
            fields.update(overrides)
            config = ServerConfig(**fields)
            host = make_host(config)
            srv = stack.enter_context(running_server(config, host))
            client = TinkerHTTP(srv.url)
            stack.callback(client.close)
            return srv, client

        yield make
