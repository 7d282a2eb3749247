"""`swarm train --team`: parsing ROLE=MODEL, the checks before anything starts, how roles group into
servers, each server's settings and the team fleet's routing (swarm/team_checks.py, swarm/team_run.py).
No process starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.client import TeamClient
from swarm.client.cli import _client
from swarm.config.fleet import FleetConfig
from swarm.config.run import RunConfig
from swarm.model.presets import PRESETS, default_preset_dir
from swarm.team_checks import EMBEDDED, known_roles, members, parse_team, resolve_model, team_problems
from swarm.team_run import TEAM_CHECKPOINT_EVERY, Member, member_config, role_metrics, team_fleets


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Two model directories (a config.json is all the checks read) and ROOST_HOME in tmp."""
    monkeypatch.setenv("ROOST_HOME", str(tmp_path / "home"))
    out = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        out.append(tmp_path / name)
    return out[0], out[1]


def test_parse_team_keeps_the_order_and_names_each_problem() -> None:
    assert parse_team("planner=A, executor = B") == ({"planner": "A", "executor": "B"}, [])
    team, problems = parse_team("planner=A,planner=B,executor,=C,bad name=D")
    assert team == {"planner": "A"}
    assert problems[0] == "--team: role 'planner' is named twice (one model per role)"
    assert problems[1] == "--team: expected ROLE=MODEL, got 'executor'"
    assert problems[2] == "--team: expected ROLE=MODEL, got '=C'"
    assert problems[3].startswith("--team: role 'bad name': policy name")
    assert all("\n" not in p for p in problems)


def test_a_model_is_embedded_a_preset_or_a_path(models: tuple[Path, Path]) -> None:
    from store.paths import default_model_dir

    assert resolve_model(EMBEDDED) == default_model_dir()
    assert resolve_model("tiny-wide") == default_preset_dir("tiny-wide")
    assert resolve_model(str(models[0])) == models[0].resolve()


def test_roles_come_from_the_task_or_beside_the_workflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_team.py").write_text("ROLES = ('a', 'b')\ndef play(task, team): return {'a': 1, 'b': 0}\n")
    (tmp_path / "no_roles.py").write_text("def play(task, team): return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert known_roles(RunConfig(task="duet", team="planner=x"))[0] == ("planner", "executor")
    assert known_roles(RunConfig(workflow="my_team:play", task="duet", team="a=x"))[0] == ("a", "b")
    assert known_roles(RunConfig(workflow="no_roles:play", task="arith", team="a=x"))[0] == ()
    assert known_roles(RunConfig(workflow="no_roles:play", dataset="no_roles:play", team="a=x"))[0] is None
    for name in ("my_team", "no_roles"):
        sys.modules.pop(name, None)


def test_bad_input_is_one_line_per_problem(models: tuple[Path, Path]) -> None:
    a, b = models
    assert team_problems(RunConfig(task="duet", team=f"planner={a},executor={b}")) == []
    found = team_problems(RunConfig(task="duet", team=f"planner={a},coach={b},planner={b}"))
    assert found == [
        "--team: role 'planner' is named twice (one model per role)",
        "--team: task duet has no role 'coach' (its roles: planner, executor)",
        "--team: role 'executor' of task duet has no model (give executor=MODEL)",
    ]
    found = team_problems(RunConfig(task="duet", team=f"planner={a},executor={a.parent / 'nope'}"))
    assert found == [f"--team: executor={a.parent / 'nope'}: {a.parent / 'nope'} is not a model directory "
                     f"(no config.json), a preset or {EMBEDDED}"]  # fmt: skip
    assert team_problems(RunConfig(task="arith", team=f"planner={a}")) == [
        "--team: task arith has no roles (team tasks: duet)"
    ]
    # a preset or the embedded model not built yet is built before the run, not refused
    assert team_problems(RunConfig(task="duet", team="planner=embedded,executor=tiny-wide")) == []
    with pytest.raises(ValueError, match="--team starts a server per model itself"):
        RunConfig(task="duet", team=f"planner={a},executor={b}", shared_base=True)


def _checkpoint(folder: Path, step: int) -> None:
    """What a resume reads of a checkpoint: its `latest` pointer and the step in its state file."""
    (folder / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
    (folder / "checkpoints" / f"step_{step:06d}" / "server_state.json").write_text(f'{{"step": {step}}}')
    (folder / "checkpoints" / "latest").symlink_to(f"step_{step:06d}")


def test_a_resume_needs_this_very_team_with_steps_left(models: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = models
    out = tmp_path / "run"
    team = f"planner={a},executor={b}"

    def problems(given: str, steps: int = 4) -> list[str]:
        return team_problems(RunConfig(task="duet", team=given, steps=steps, out=out), resume=True)

    out.mkdir()
    (out / "run.yaml").write_text("task: arith\nsteps: 2\n")  # a run of one model
    assert problems(team) == [
        f"--resume: {out} holds no --team run (its run.yaml names no team): resume it without --team, "
        "--fresh to replace it, or choose another --out"
    ]
    (out / "run.yaml").write_text(f"task: duet\nsteps: 4\nteam: {team}\n")
    assert problems(team) == []  # no checkpoint yet: each role starts from its model
    for other in (f"planner={b},executor={a}", f"executor={b},planner={a}"):  # other models; another order
        assert problems(other) == [
            f"--resume: the run in {out} is the team {team}, not this one: resume it with that --team "
            "(or none: run.yaml's), --fresh to replace it, or choose another --out"
        ]
    _checkpoint(out / "servers" / "planner", 4)
    assert problems(team) == []  # the executor has steps left
    _checkpoint(out / "servers" / "executor", 5)
    assert problems(team) == [
        f"--steps: the team run in {out} already has 4 steps per role (planner 4, executor 5); ask for more with "
        "--steps"
    ]
    assert problems(team, steps=6) == []
    shared = f"planner={a},executor={a}"  # roles on one base: each policy's own checkpoint
    (out / "run.yaml").write_text(f"task: duet\nsteps: 4\nteam: {shared}\n")
    _checkpoint(out / "servers" / "planner+executor" / "policies" / "planner", 4)
    assert problems(shared) == []
    _checkpoint(out / "servers" / "planner+executor" / "policies" / "executor", 4)
    assert problems(shared)[0].startswith("--steps:")


def test_cli_refuses_bad_input_before_anything_starts(models: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = models
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app,
        ["train", "--task", "duet", "--team", f"planner={a},planner={b}", "--out", str(out)],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.startswith("swarm train:")]
    assert lines == [
        "swarm train: --team: role 'planner' is named twice (one model per role)",
        "swarm train: --team: role 'executor' of task duet has no model (give executor=MODEL)",
    ]
    assert not out.exists()  # nothing started, no folder made


def test_roles_on_one_model_share_a_server_others_get_their_own(models: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = models
    assert members(RunConfig(task="duet", team=f"planner={a},executor={b}")) == [
        Member("planner", a.resolve(), ("planner",)),
        Member("executor", b.resolve(), ("executor",)),
    ]
    spec = RunConfig(task="duet", team=f"planner={a},executor={a}")
    (shared,) = members(spec)
    assert shared == Member("planner+executor", a.resolve(), ("planner", "executor"))
    cfg = member_config(spec, shared, tmp_path, 1234)
    assert [p.name for p in cfg.policies] == ["planner", "executor"] and cfg.lora.rank == 8
    assert (
        role_metrics(tmp_path, shared)["executor"]
        == tmp_path / "servers/planner+executor/policies/executor/metrics.jsonl"
    )


def test_a_role_alone_on_its_model_is_the_servers_model_name(models: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = models
    spec = RunConfig(task="duet", team=f"planner={a},executor={b}")
    planner, executor = members(spec)
    cfg = member_config(spec, executor, tmp_path, 1234, resume=True)
    assert cfg.model_name == "executor" and "executor" in cfg.model_aliases and not cfg.policies
    assert cfg.model_dir == b.resolve() and cfg.out_dir == tmp_path / "servers" / "executor"
    assert cfg.max_steps is None and cfg.resume  # this command stops the servers together
    assert cfg.checkpoint_every == TEAM_CHECKPOINT_EVERY  # a run's default of none: a restart needs one
    assert member_config(spec.model_copy(update={"server": spec.server.model_copy(update={"checkpoint_every": 3})}),
                         executor, tmp_path, 1).checkpoint_every == 3  # fmt: skip
    assert role_metrics(tmp_path, planner) == {"planner": tmp_path / "servers/planner/metrics.jsonl"}


def test_the_team_fleet_routes_each_role_to_its_server(models: tuple[Path, Path]) -> None:
    a, b = models
    spec = RunConfig(task="duet", team=f"planner={a},executor={b}", clients=2, concurrency=8, failure_streak=7)
    fleets = team_fleets(spec, {"planner": "http://127.0.0.1:1", "executor": "http://127.0.0.1:2"})
    assert list(fleets) == ["client0", "client1"]
    fleet = fleets["client0"]
    assert fleet.failure_streak == 7  # `swarm train --failure-streak` reaches every fleet
    assert fleet.team == "planner=http://127.0.0.1:1,executor=http://127.0.0.1:2" and fleet.concurrency == 4
    client = _client(fleet, fleet.url, "tok")
    assert isinstance(client, TeamClient)
    assert {r: (c.url, c.model) for r, c in client.members.items()} == {
        "planner": ("http://127.0.0.1:1", "planner"),
        "executor": ("http://127.0.0.1:2", "executor"),
    }
    plain = _client(FleetConfig(url="http://127.0.0.1:3", team="planner,executor"), "http://127.0.0.1:3", "tok")
    assert {c.url for c in plain.members.values()} == {"http://127.0.0.1:3"}  # ROLE alone: policies of --url


def test_tiny_wide_is_a_preset_of_the_embedded_recipe() -> None:
    preset = PRESETS["tiny-wide"]
    assert preset.tokenizer == "embedded" and preset.warm_start is not None
    assert preset.shape["hidden_size"] > 128 and preset.shape["num_hidden_layers"] > 4  # wider and deeper


def test_a_run_of_several_roles_reports_the_roles_mean_for_the_run_and_each_family() -> None:
    """The run's numbers of a team or a --shared-base run come from every role, not the first one's (its
    families and step timings stood for the run's)."""
    from swarm.run_summary import combine_roles

    def role(first: float | None, last: float, families: dict, steps: int) -> dict:
        return {
            "status": "finished",
            "reward_first_mean": first,
            "reward_last_mean": last,
            "families": families,
            "steps_done": steps,
            "timing": {"collection_s": 0.1, "engine_busy_s": 0.05, "train_s": 0.2},
        }

    fam = {"reward_first_mean": 0.2, "reward_last_mean": 0.4, "steps_seen": 6}
    planner = role(0.2, 0.4, {"duet": fam}, 6)
    executor = role(None, 0.8, {"duet": {**fam, "reward_last_mean": 0.8, "steps_seen": 5}, "calc": fam}, 5)
    run = combine_roles({"planner": planner, "executor": executor})
    assert run["reward_first_mean"] == 0.2 and run["reward_last_mean"] == pytest.approx(0.6)  # None left out
    assert run["families"] == {
        "calc": fam,
        "duet": {"reward_first_mean": 0.2, "reward_last_mean": pytest.approx(0.6), "steps_seen": 6},
    }
    assert run["steps_done"] == 5 and "timing" not in run and run["status"] == "finished"
    assert planner["families"] == {"duet": fam} and "timing" in planner  # the roles' own are left as they were
