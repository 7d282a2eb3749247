"""Fixtures for chaos and load tests: a tiny model dir (built once per session), ROOST_HOME in tmp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from swarm.server.testing import tiny_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _roost_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "roost-home"))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())
