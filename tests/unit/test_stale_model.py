"""`swarm train` on the default model rebuilds a build of another recipe version.

An install upgraded to a new recipe (build 6: a 4,096-token context) kept training the old
build for ever when only a missing config.json triggered a build. The build itself takes
minutes and is tested in tests/test_model_build.py; here `init_model` and `run` are recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import swarm.cli
import swarm.model.build
from swarm.model.version import BUILD_VERSION, MARKER, built_version


def _train(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, marker: dict | None) -> tuple[list[Path], str]:
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "home"))
    model = tmp_path / "home" / "models" / "tiny-qwen2"
    if marker is not None:
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
        (model / MARKER).write_text(json.dumps(marker))
    built: list[Path] = []
    monkeypatch.setattr(swarm.model.build, "init_model", lambda out, **kw: built.append(out) or out)
    monkeypatch.setattr(
        swarm.cli, "run", lambda spec, resume=False: {"reward_first_mean": 0, "reward_last_mean": 0, "wall_s": 0}
    )
    result = CliRunner().invoke(
        swarm.cli.app, ["train", "--task", "arith", "--steps", "1", "--out", str(tmp_path / "run")]
    )
    assert result.exit_code == 0, result.output
    return built, result.output


def test_an_older_build_is_rebuilt_and_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built, output = _train(monkeypatch, tmp_path, {"version": BUILD_VERSION - 1})
    assert built == [tmp_path / "home" / "models" / "tiny-qwen2"]
    assert f"is build {BUILD_VERSION - 1}" in output and "rebuilding" in output


def test_the_current_build_is_used_as_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built, output = _train(monkeypatch, tmp_path, {"version": BUILD_VERSION})
    assert built == [] and "rebuilding" not in output


def test_a_missing_model_is_built_without_a_stale_note(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built, output = _train(monkeypatch, tmp_path, None)
    assert len(built) == 1 and "rebuilding" not in output


@pytest.mark.parametrize("text", ["", "not json", "[1]", '{"version": "6"}'])
def test_an_unreadable_marker_is_no_build(tmp_path: Path, text: str) -> None:
    (tmp_path / MARKER).write_text(text)
    assert built_version(tmp_path) is None
