"""`TinkerService.published`: what an optim_step reports when the serving engine (vLLM) could not take
its new weights. The step stands (the client must not retry it); the failure is in its metrics."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from swarm.config.lora import LoraSettings
from swarm.tinker.service import Model, Session, TinkerService


class Hooks:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.published: list[str] = []

    def publish(self, name: str) -> dict[str, float]:
        if self.fail:
            raise RuntimeError("vLLM refused the adapter")
        self.published.append(name)
        return {"publish_s": 0.01}


def _service(hooks: Any, tmp_path: Path) -> tuple[TinkerService, Model]:
    svc = TinkerService(None, tmp_path, ["base"], 64, 30.0, hooks, LoraSettings(rank=4))
    return svc, Model("s1:train:0", Session("s1"), SimpleNamespace(name="s1-train-0"), 4)  # type: ignore[arg-type]


def test_a_published_step_reports_the_syncs_timings(tmp_path: Path) -> None:
    hooks = Hooks(fail=False)
    svc, m = _service(hooks, tmp_path)
    assert svc.published(m) == {"publish_s": 0.01} and hooks.published == ["s1-train-0"]


def test_a_sync_the_engine_refuses_is_reported_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    svc, m = _service(Hooks(fail=True), tmp_path)
    with caplog.at_level(logging.ERROR, logger="swarm.tinker"):
        assert svc.published(m) == {"publish_failed": 1.0}
    assert "vLLM refused the adapter" in caplog.text and m.id in caplog.text
