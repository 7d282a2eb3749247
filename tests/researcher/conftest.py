"""Researcher tests: an isolated ROOST_HOME per test, and no real model requests, ever."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import researcher.llm as llm

FAKE_TRIAL = Path(__file__).with_name("fake_trial.py")


@pytest.fixture(autouse=True, scope="session")
def _no_model_requests() -> Iterator[None]:
    """The global switch: any real chat-model request raises ModelRequestsForbidden."""
    with llm.model_requests_allowed(False):
        os.environ[llm.ENV_ALLOW] = "0"
        yield


@pytest.fixture(scope="session")
def _mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow database for the session: creating one costs ~15 s of migrations.
    Studies never collide in it (one experiment per study, named uniquely)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _mlflow_uri: str) -> Iterator[Path]:
    home = tmp_path / "roost-home"
    monkeypatch.setenv("ROOST_HOME", str(home))
    monkeypatch.chdir(tmp_path)  # a finished study copies its HTML report to ./studies/, not into the checkout
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _mlflow_uri)
    for var in (
        "ROOST_DATABASE_URL",
        "ROOST_LLM_BASE_URL",
        "ROOST_LLM_MODEL",
        "ROOST_LLM_API_KEY",
        "ROOST_TRIAL_PROGRAM",
        "FAKE_TRIAL_SLEEP",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("ROOST_LOCAL_MAX_JOBS", "4")
    yield home
    from store.db import dispose_engines

    dispose_engines()


@pytest.fixture
def fake_program() -> list[str]:
    return [sys.executable, str(FAKE_TRIAL)]
