"""Fixtures for chaos and load tests: a tiny model dir (built once per session), ROOST_HOME in tmp."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from swarm.testing import tiny_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # chaos_harness, chaos_agent (--import-mode=importlib)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-full",
        action="store_true",
        default=False,
        help="test_soak.py at the issue's full size (64 clients x 600 s) instead of the CI size",
    )


@pytest.fixture(autouse=True)
def _roost_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "roost-home"))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())
