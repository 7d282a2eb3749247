"""How `swarm train` follows the server's logging of the trained model (`MODEL_FILE`), without MLflow here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm import train
from swarm.server.tracking import MODEL_FILE


class _Server:
    """A server process that exits after `polls` polls, writing `states` to MODEL_FILE on the way."""

    def __init__(self, folder: Path, states: list[dict], polls: int) -> None:
        self.folder, self.states, self.polls, self.seen = folder, states, polls, 0

    def poll(self) -> int | None:
        if self.seen < len(self.states):
            (self.folder / MODEL_FILE).write_text(json.dumps(self.states[self.seen]))
        self.seen += 1
        return 0 if self.seen > self.polls else None


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train.time, "sleep", lambda s: None)


def test_the_model_the_server_logged_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logged = {"state": "logged", "run_id": "r", "model_uri": "models:/m-1", "seconds": 0.8}
    train._await_exit(_Server(tmp_path, [{"state": "logging", "run_id": "r"}, logged], polls=3), [tmp_path])
    assert train._logged_model(tmp_path / MODEL_FILE) == "models:/m-1"
    assert "logged the trained model to MLflow in 0.8s" in capsys.readouterr().err


def test_a_failure_is_a_warning_and_no_file_is_no_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train._logged_model(tmp_path / MODEL_FILE) is None  # the fake engine: nothing to log, nothing said
    assert capsys.readouterr().err == ""
    (tmp_path / MODEL_FILE).write_text(json.dumps({"state": "failed", "run_id": "r", "error": "disk full"}))
    assert train._logged_model(tmp_path / MODEL_FILE) is None
    assert "could not log the model to MLflow: disk full" in capsys.readouterr().err


def test_a_server_that_does_not_stop_fails_the_run_but_slow_logging_does_not(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match="did not exit"):
        train._await_exit(_Server(tmp_path, [], polls=10**9), [tmp_path], stop_s=-1.0)
    # still logging past its time: `run` stops the server and ends the MLflow run, the training stands
    train._await_exit(
        _Server(tmp_path, [{"state": "logging", "run_id": "r"}], polls=10**9), [tmp_path], stop_s=60.0, model_s=-1.0
    )
