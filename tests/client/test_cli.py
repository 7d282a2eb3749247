"""`swarm client` (the typer command) against a real server."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from swarm.client._cursor import default_state_path
from swarm.client.cli import client_command
from swarm.folder_lock import hold_folder
from swarm.testing import RunningServer

app = typer.Typer()
app.command()(client_command)


def test_builtin_task(server: RunningServer) -> None:
    r = CliRunner().invoke(
        app,
        [
            "--url",
            server.url,
            "--token",
            server.token,
            "--task",
            "arith",
            "--n",
            "2",
            "--concurrency",
            "2",
            "--max-episodes",
            "4",
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "4 finished" in r.output
    assert server.swarm.counters["finished"] == 4
    assert {e.task_family for e in server.swarm.registry.closed.values()} == {"arith"}


def test_custom_workflow_with_env_token(server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_agent.py").write_text(
        "def dataset(seed, size):\n"
        "    return [{'task_id': f'q{seed}-{i}'} for i in range(size)]\n"
        "def play(task, episode):\n"
        "    episode.openai.chat.completions.create(model=episode.model, max_tokens=3,\n"
        "        messages=[{'role': 'user', 'content': task['task_id']}])\n"
        "    return 0.5\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ROOST_TOKEN", server.token)
    r = CliRunner().invoke(
        app, ["--url", server.url, "--workflow", "my_agent:play", "--dataset-size", "2", "--n", "2", "--epochs", "1"]
    )
    assert r.exit_code == 0, r.output
    assert server.swarm.counters["finished"] == 4


def _fleet_of(server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task: str, play: str) -> Any:
    """`swarm client` (2 workers, quiet) on a workflow module whose dataset's tasks are `task` (an
    expression of i) and whose `play` body is `play`: the CliRunner's result. The module's name is the
    test's folder's (a module imported once stays in sys.modules: another test's `flow` would be it)."""
    name = f"flow_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(
        f"def dataset(seed, size):\n    return [{task} for i in range(size)]\ndef play(task, episode):\n    {play}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--url", server.url, "--token", server.token, "--workflow", f"{name}:play", "--concurrency", "2", "-q"]
    return CliRunner().invoke(app, [*args, "--failure-streak", "4"])


def test_a_fleet_whose_every_thread_dies_exits_non_zero(
    server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = _fleet_of(server, tmp_path, monkeypatch, "{'q': i}", "return 1.0")
    assert r.exit_code != 0 and "every fleet thread died (2)" in str(r.exception), r.output


def test_a_workflow_failing_on_every_task_stops_the_fleet_with_exit_3(
    server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = _fleet_of(server, tmp_path, monkeypatch, "{'task_id': f't{i}'}", "raise KeyError('x')")
    said = " ".join(r.output.split())
    # 4, or 5 when the other worker's failure lands before the stop is seen
    assert r.exit_code == 3 and re.search(r"the workflow failed [45] times in a row, no episode finished", said), said


@pytest.mark.parametrize("args", [["--workflow", "no_such_module:f"], ["--task", "nope"], [], ["--workflow", "json"]])
def test_bad_options(server: RunningServer, args: list[str]) -> None:
    r = CliRunner().invoke(app, ["--url", server.url, "--token", "t", *args])
    assert r.exit_code == 2, r.output


def test_unreachable_server_exits_1() -> None:
    r = CliRunner().invoke(
        app,
        [
            "--url",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--task",
            "arith",
            "--retries",
            "1",
            "--max-episodes",
            "1",
            "--quiet",
        ],
    )
    assert r.exit_code == 1, r.output


def test_wrong_token_exits_1(server: RunningServer) -> None:
    r = CliRunner().invoke(app, ["--url", server.url, "--token", "wrong", "--task", "arith", "--quiet"])
    assert r.exit_code == 1 and "401" in r.output


def test_a_cursor_in_use_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """Two fleets on one cursor handed out the same jobs (the same tasks twice) and wrote over each other's
    pending set; a second one's `--fresh` deleted the first one's cursor under it."""
    state = tmp_path / "cursor.json"
    state.write_text('{"next": 40, "pending": [38]}')
    args = ["--url", "http://127.0.0.1:9", "--token", "t", "--task", "arith", "--quiet", "--state", str(state)]
    with hold_folder(tmp_path, "cursor.json.lock", "swarm client"):  # the first fleet, as it holds it
        r = CliRunner().invoke(app, [*args, "--fresh"])
        assert r.exit_code == 2, r.output
        assert f"the cursor {state} is in use by another swarm client (pid {os.getpid()})" in r.output, r.output
        assert "--seed" in r.output and "--state" in r.output
    assert state.read_text() == '{"next": 40, "pending": [38]}'
    r = CliRunner().invoke(app, [*args, "--retries", "1", "--max-episodes", "1"])  # free again: it runs
    assert r.exit_code == 1 and "cannot use http://127.0.0.1:9" in r.output, r.output


def test_default_cursors_differ_by_policy() -> None:
    """Fleets of two policies of one server (a shared-base study's trials, same task and seed) are two
    runs: they shared one default cursor, and now the second would be refused."""
    paths = {default_state_path("http://h:1", "task:arith", 0, "arith", p) for p in (None, "a", "b")}
    assert len(paths) == 3


def test_a_workflow_file_that_does_not_compile_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SyntaxError was a 65-line traceback (only ImportError was caught); `swarm train` said it in a line."""
    (tmp_path / "broken_flow.py").write_text("def play(task, episode)\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = CliRunner().invoke(app, ["--url", "http://127.0.0.1:9", "--token", "t", "--workflow", "broken_flow:play"])
    out = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and "cannot import 'broken_flow': SyntaxError" in out, r.output
    assert "Traceback" not in r.output


def test_choices_against_a_server_whose_groups_are_several_episodes_is_refused(server: RunningServer) -> None:
    """Its help says the server's group size is then 1; nothing checked it, and each group trained k x n samples."""
    assert server.swarm.config.group_size > 1
    args = ["--url", server.url, "--token", server.token, "--task", "arith", "--choices", "4", "-q"]
    r = CliRunner().invoke(app, args)
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "the server's group size must be 1; this one's is" in out, r.output
    assert server.swarm.counters["claims"] == 0
