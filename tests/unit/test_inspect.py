"""`swarm inspect`: a recorded multi-turn episode rendered token by token (terminal and HTML)."""

from __future__ import annotations

import json
import subprocess
import sys

from rich.console import Console

from swarm.inspect import find_episode, render_html, render_terminal, rollout_log


def _write_rollouts(path):
    calls = [
        {"agent": "main", "prompt_ids": [1, 2], "completion_ids": [3, 4], "logprobs": [-0.1, -0.2]},
        {"agent": "main", "prompt_ids": [1, 2, 3, 4, 5], "completion_ids": [6], "logprobs": [-3.0]},
    ]
    eps = [
        {"episode_id": "ep-a", "task_id": "t1", "reward": 1.0, "calls": calls},
        {"episode_id": "ep-b", "task_id": "t2", "reward": 0.0, "calls": calls[:1]},
    ]
    path.write_text("\n".join(json.dumps(e) for e in eps) + "\n{torn")  # a torn last line is skipped


def test_render_terminal_and_html(tmp_path):
    _write_rollouts(tmp_path / "rollouts.jsonl")
    ep = find_episode(tmp_path, "ep-a")
    decode = lambda ids: "".join(f"<{i}>" for i in ids)  # noqa: E731
    console = Console(record=True, width=120)
    render_terminal(ep, decode, console)
    out = console.export_text()
    assert "calls 2 → samples 1" in out and "merge ratio 2.00" in out
    page = render_html(ep, decode)
    assert page.count("class='t m1") == 3 and page.count("class='t m0'") == 3
    assert "logprob -3.0000" in page and "&lt;6&gt;" in page
    assert find_episode(tmp_path, None)["episode_id"] == "ep-b"  # default: the last one


def test_cli_errors_are_clear(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "inspect", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "no rollout log" in r.stderr


def test_a_train_run_folder_is_read_through_its_server_and_several_logs_are_named(tmp_path):
    run = tmp_path / "run"
    (run / "server").mkdir(parents=True)
    _write_rollouts(run / "server" / "rollouts.jsonl")  # `swarm train --out run`
    assert rollout_log(run) == run / "server" / "rollouts.jsonl"
    assert find_episode(run, "ep-a")["task_id"] == "t1"
    assert rollout_log(run / "server" / "rollouts.jsonl") == run / "server" / "rollouts.jsonl"
    team = tmp_path / "team"  # `swarm train --team`: a server per model
    for role in ("planner", "executor"):
        (team / "servers" / role).mkdir(parents=True)
        _write_rollouts(team / "servers" / role / "rollouts.jsonl")
    try:
        rollout_log(team)
    except FileNotFoundError as exc:
        assert "2 rollout logs" in str(exc) and str(team / "servers" / "executor") in str(exc)
    else:
        raise AssertionError("a folder of two logs must name them, not pick one")
    assert find_episode(team / "servers" / "planner", "ep-b")["task_id"] == "t2"
    shared = tmp_path / "shared"  # `swarm train --team planner=M,executor=M`: one server, a policy per role
    for role in ("planner", "executor"):
        (shared / "servers" / "planner+executor" / "policies" / role).mkdir(parents=True)
        _write_rollouts(shared / "servers" / "planner+executor" / "policies" / role / "rollouts.jsonl")
    try:
        rollout_log(shared)
    except FileNotFoundError as exc:
        assert "2 rollout logs" in str(exc) and "planner+executor/policies/planner" in str(exc)
    else:
        raise AssertionError("a team's shared server's policies must be named")


def test_list_and_filter_episodes(tmp_path):
    from swarm.inspect import parse_filter, select_episodes

    _write_rollouts(tmp_path / "rollouts.jsonl")
    assert [e["episode_id"] for e in select_episodes(tmp_path, ["reward>0.5"])] == ["ep-a"]
    assert [e["episode_id"] for e in select_episodes(tmp_path, ["calls>=2", "task_id~t"])] == ["ep-a"]
    assert [e["episode_id"] for e in select_episodes(tmp_path, ["task_id!=t1"])] == ["ep-b"]
    assert find_episode(tmp_path, None, ["reward>=1"])["episode_id"] == "ep-a"  # the last that passes
    for bad, message in [("bogus=1", "unknown field"), ("reward>x", "needs a number"), ("reward", "FIELD OP")]:
        try:
            parse_filter(bad)
        except ValueError as exc:
            assert message in str(exc)
        else:
            raise AssertionError(bad)
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "inspect", str(tmp_path), "--list", "--filter", "reward<1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0, r.stderr
    assert "ep-b" in r.stdout and "ep-a" not in r.stdout and "1 episode(s)" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "inspect", str(tmp_path), "--filter", "bogus=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "unknown field" in r.stderr


def test_group_call_episode_shows_each_choice_reward(tmp_path):
    """A group-call episode (one call, n choices, a reward per choice): each sample shows its own reward,
    so the wrong choices stand out (issue item 10)."""
    choices = [
        {"agent": "main", "prompt_ids": [1, 2], "completion_ids": [10 + i], "logprobs": [-0.5]} for i in range(3)
    ]
    ep = {"episode_id": "ep-g", "task_id": "t1", "reward": 1 / 3, "choice_rewards": [1.0, 0.0, 0.0], "calls": choices}
    (tmp_path / "rollouts.jsonl").write_text(json.dumps(ep) + "\n")
    ep = find_episode(tmp_path, "ep-g")
    decode = lambda ids: "".join(f"<{i}>" for i in ids)  # noqa: E731
    console = Console(record=True, width=160)
    render_terminal(ep, decode, console)
    out = console.export_text()
    assert "calls 3 → samples 3" in out
    rules = [line.strip("─ ") for line in out.splitlines() if line.lstrip("─ ").startswith("sample ")]
    assert [("reward 1.000" in r, "reward 0.000 (wrong)" in r) for r in rules] == [
        (True, False),
        (False, True),
        (False, True),
    ]
    assert [r.endswith(f"calls [{i}]") for i, r in enumerate(rules)] == [True] * 3
    page = render_html(ep, decode)
    assert page.count("reward 1.0") == 1 and page.count("reward 0.0") == 2
    assert page.count("class='wrong'") == 2  # the wrong choices are marked


def test_agent_rewards_shown_per_sample(tmp_path):
    """A team episode: a sample of an agent with its own reward shows that reward, not the episode's."""
    calls = [
        {"agent": "a", "prompt_ids": [1], "completion_ids": [2], "logprobs": [-0.1]},
        {"agent": "b", "prompt_ids": [5], "completion_ids": [6], "logprobs": [-0.1]},
    ]
    ep = {"episode_id": "ep-t", "task_id": "t1", "reward": 0.5, "agent_rewards": {"b": 0.0}, "calls": calls}
    page = render_html(ep, lambda ids: str(ids))
    assert page.count("reward 0.5") == 2 and page.count("reward 0.0") == 1  # header + sample a; sample b


def _inspect(*args: str):
    from typer.testing import CliRunner

    from swarm.cli import app

    r = CliRunner().invoke(app, ["inspect", *args], env={"COLUMNS": "300"})
    return r, " ".join(r.output.replace("│", " ").split())  # rich's error box, unwrapped


def test_bad_paths_are_refused_in_one_line_naming_the_option(tmp_path):
    """--html to a folder or into a missing folder's file, --model that is not there: tracebacks before."""
    _write_rollouts(tmp_path / "rollouts.jsonl")
    r, said = _inspect(str(tmp_path), "--html", str(tmp_path))
    assert r.exit_code == 2 and f"Invalid value for --html: {tmp_path} is a folder" in said, r.output
    r, said = _inspect(str(tmp_path), "--model", "/nonexistent")
    assert r.exit_code == 2 and "Invalid value for --model: /nonexistent does not exist" in said, r.output
    r, said = _inspect(str(tmp_path), "--model", str(tmp_path))
    assert r.exit_code == 2 and "holds no tokenizer" in said, r.output
    recorded = tmp_path / "gone"  # the run's model, moved away since: --model is named as the way out
    (tmp_path / "rollouts.jsonl").write_text(json.dumps({"episode_id": "e", "model_dir": str(recorded), "calls": []}))
    r, said = _inspect(str(tmp_path))
    assert r.exit_code == 2 and f"the run's model: {recorded} does not exist; give --model DIR" in said, r.output


def test_no_episode_is_said_without_quotes_and_unreadable_lines_are_counted(tmp_path):
    from swarm.inspect import NoEpisode

    _write_rollouts(tmp_path / "rollouts.jsonl")  # two episodes and a torn last line
    r, said = _inspect(str(tmp_path), "-f", "reward>5")
    assert r.exit_code == 2 and f"--filter: no episode matches the filters in {tmp_path};" in said, r.output
    assert f"1 line of {tmp_path / 'rollouts.jsonl'} skipped as unreadable (line 3)" in said
    unreadable: list[int] = []
    try:
        find_episode(tmp_path, "nope", unreadable=unreadable)
    except NoEpisode as exc:
        assert str(exc).startswith(f"episode 'nope' not found in {tmp_path}")
    else:
        raise AssertionError("no such episode")
    assert unreadable == [3]
    (tmp_path / "rollouts.jsonl").write_text("not json\n[1, 2]\n{torn\n")  # no JSON object at all
    r, said = _inspect(str(tmp_path), "--list")
    assert r.exit_code == 0 and "3 lines of" in said and "(lines 1, 2, 3)" in said, r.output
