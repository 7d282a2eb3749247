"""`swarm eval` on a team run (swarm/model/team_eval.py): where each kind of team run keeps its roles,
the calls routed to the model of the role they name, and a row per role beside the initial team."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from swarm.model.build import build_untrained
from swarm.model.evaluate import LocalOpenAI, RunFolderError, evaluate
from swarm.model.team_eval import evaluate_team, team_checkpoints, team_mixes, team_plan

ROLES = ("planner", "executor")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("teameval")
    return {"initial": build_untrained(root / "initial", seed=0), "trained": build_untrained(root / "trained", seed=1)}


def _checkpoint(folder: Path, model: Path | None, step: int = 2) -> Path:
    """`folder/checkpoints/step_N` (a copy of `model`, or only its marker) with `latest` pointing at it."""
    at = folder / "checkpoints" / f"step_{step:06d}"
    if model is not None:
        shutil.copytree(model, at)
    at.mkdir(parents=True, exist_ok=True)
    (at / "server_state.json").write_text(json.dumps({"step": step}))
    os.symlink(at.name, folder / "checkpoints" / "latest")
    return at


def _config(server: Path, initial: Path) -> None:
    server.mkdir(parents=True, exist_ok=True)
    (server / "config.yaml").write_text(yaml.safe_dump({"model_dir": str(initial), "out_dir": "x"}))


def test_each_layout_of_a_team_run_gives_each_roles_checkpoint_and_initial_model(tmp_path: Path) -> None:
    a, b = tmp_path / "base-a", tmp_path / "base-b"
    shared = tmp_path / "shared"  # swarm train --task duet --shared-base
    _config(shared / "server", a)
    for role in ROLES:
        _checkpoint(shared / "server" / "policies" / role, None)
    found = team_checkpoints(shared, ROLES)
    assert found == {r: (shared / "server" / "policies" / r / "checkpoints" / "step_000002", a) for r in ROLES}
    team = tmp_path / "team"  # swarm train --team planner=A,executor=B: a server per model
    _config(team / "servers" / "planner", a)
    _config(team / "servers" / "executor", b)
    for role in ROLES:
        _checkpoint(team / "servers" / role, None)
    assert {r: start for r, (_, start) in team_checkpoints(team, ROLES).items()} == {"planner": a, "executor": b}
    one = tmp_path / "one-base"  # --team planner=A,executor=A: one server of two policies
    _config(one / "servers" / "planner+executor", a)
    for role in ROLES:
        _checkpoint(one / "servers" / "planner+executor" / "policies" / role, None)
    assert team_plan(one, None) == [("duet", team_checkpoints(one, ROLES))]


def test_a_team_run_refuses_what_it_cannot_score_and_other_runs_pass_through(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _config(run / "server", tmp_path / "base")
    _checkpoint(run / "server" / "policies" / "planner", None)
    with pytest.raises(
        RunFolderError, match="no checkpoint for role executor of the team .*it holds checkpoints of planner"
    ):
        team_plan(run, ["duet"])
    assert team_plan(run, None) is None  # no whole team: `run_models` says what the folder holds
    _checkpoint(run / "server" / "policies" / "executor", None)
    with pytest.raises(RunFolderError, match=r"team run \(planner, executor\).*not on arith; score a role alone with"):
        team_plan(run, ["duet", "arith"])
    study = tmp_path / "study"  # a shared-base study's server: trials, no team
    _config(study, tmp_path / "base")
    for name in ("base", "t1", "t2"):
        _checkpoint(study / "policies" / name, None)
    assert team_plan(study, None) is None
    assert team_plan(tmp_path / "base", None) is None  # a plain model directory


class _Says:
    """A stand-in model whose every answer is one fixed token (this test is about routing, not models)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def generate(self, ids, max_new_tokens: int, **_: object) -> torch.Tensor:
        return torch.cat([ids, torch.full((ids.shape[0], max_new_tokens), self.token)], dim=1)


def test_calls_go_to_the_model_their_role_names_batched_per_model(models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["initial"])
    ids = {word: tok.encode(word, add_special_tokens=False)[0] for word in ("7", "9", "3")}
    client = LocalOpenAI(
        _Says(ids["3"]), tok, named={"planner": (_Says(ids["7"]), tok), "executor": (_Says(ids["9"]), tok)}
    )
    answers: dict[str, str] = {}

    def call(model: str) -> None:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        answers[model] = r.choices[0].message.content
        client.episode_done()

    threads = [threading.Thread(target=call, args=(m,)) for m in ("planner", "executor", "local")]
    for t in threads:
        t.start()
    client.serve(3)
    for t in threads:
        t.join()
    assert answers == {"planner": "7", "executor": "9", "local": "3"}  # an unnamed model: the default


def test_a_team_of_one_model_scores_what_that_model_scores_alone(models: dict[str, Path]) -> None:
    """Greedy: both roles played by one model give the per-role rewards whose mean is the one-model duet's."""
    alone = evaluate(models["trained"], "duet", n=6, temperature=0.0)
    rows = evaluate_team({r: models["trained"] for r in ROLES}, "duet", n=6, temperature=0.0)
    assert [row["task"] for row in rows] == ["duet (planner)", "duet (executor)"]
    assert sum(row["mean_reward"] for row in rows) / 2 == pytest.approx(alone["mean_reward"], abs=1e-4)
    assert rows[0]["calls_per_episode"] == alone["calls_per_episode"] == 2.0
    with pytest.raises(ValueError, match="duet: roles planner, executor, given planner"):
        evaluate_team({"planner": models["trained"]}, "duet")


def test_swarm_eval_of_a_team_run_shows_each_role_beside_the_initial_team(models, tmp_path: Path) -> None:
    from swarm.cli import app

    run = tmp_path / "run"
    _config(run / "server", models["initial"])
    for role in ROLES:
        _checkpoint(run / "server" / "policies" / role, models["trained"])
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(
        app, ["eval", "--model", str(run), "--n", "3", "-t", "0", "--json", str(out)], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 0, r.output
    assert "duet planner: trained" in r.output and "duet (executor)" in r.output and "change" in r.output
    rows = json.loads(out.read_text())
    assert sorted((row["model_role"], row["role"]) for row in rows) == [
        ("initial", "executor"),
        ("initial", "planner"),
        ("trained", "executor"),
        ("trained", "planner"),
    ]
    assert {row["model"] for row in rows if row["model_role"] == "initial"} == {str(models["initial"])}
    r = CliRunner().invoke(app, ["eval", "--model", str(run), "--task", "arith"], env={"COLUMNS": "1000"})
    assert r.exit_code == 2 and "score a role alone with --model" in r.output, r.output


def test_each_role_scores_a_role_trained_beside_its_partners_initial_models(models, tmp_path: Path) -> None:
    """`--each-role`: "only planner trained" is the planner's checkpoint with the executor's initial model (and
    back), scored as evaluate_team scores that mix; between the initial and the trained team in the table."""
    from swarm.cli import app

    run = tmp_path / "run"
    _config(run / "server", models["initial"])
    checkpoints = {role: _checkpoint(run / "server" / "policies" / role, models["trained"]) for role in ROLES}
    out = tmp_path / "eval.json"
    args = ["eval", "--model", str(run), "--n", "3", "-t", "0", "--each-role", "--json", str(out)]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    labels = ["initial", "only planner trained", "only executor trained", "trained"]
    assert [row["model_role"] for row in rows if row["role"] == "planner"] == labels
    for row in rows:
        trained_here = row["model_role"] in ("trained", f"only {row['role']} trained")
        assert row["model"] == str(checkpoints[row["role"]] if trained_here else models["initial"]), row
    mix = {"planner": checkpoints["planner"], "executor": models["initial"]}
    direct = evaluate_team(mix, "duet", n=3, temperature=0.0)
    got = [row for row in rows if row["model_role"] == "only planner trained"]
    assert [row["mean_reward"] for row in got] == [row["mean_reward"] for row in direct]
    cells = [line.split("│")[1].strip() for line in r.output.splitlines() if line.count("│") > 2]
    assert cells[:5] == [*labels, "change"], r.output  # the planner's block

    unrecorded = tmp_path / "unrecorded"  # no config.yaml: the models the roles started from are unknown
    for role in ROLES:
        _checkpoint(unrecorded / "server" / "policies" / role, None)
    r = CliRunner().invoke(app, ["eval", "--model", str(unrecorded), "--each-role"], env={"COLUMNS": "1000"})
    assert r.exit_code == 2 and "no initial model recorded for planner, executor" in r.output, r.output

    plain = tmp_path / "plain"  # a one-model run has no roles to score alone
    _config(plain / "server", models["initial"])
    _checkpoint(plain / "server", models["trained"])
    r = CliRunner().invoke(app, ["eval", "--model", str(plain), "--each-role"], env={"COLUMNS": "1000"})
    assert r.exit_code == 2 and "is not a team run" in r.output, r.output


def test_team_mixes_give_each_roles_share_both_ways_once() -> None:
    """Two roles: the initial team, each role trained alone, the trained team ("all but planner" would be
    "only executor" again). Three roles: also each role left initial beside its trained partners. No
    recorded initial models: the trained team alone, whatever was asked."""
    trained = {role: Path(f"/t/{role}") for role in ("a", "b", "c")}
    initial = {role: Path(f"/i/{role}") for role in ("a", "b", "c")}
    two = team_mixes({r: trained[r] for r in "ab"}, {r: initial[r] for r in "ab"}, each_role=True)
    assert [label for label, _ in two] == ["initial", "only a trained", "only b trained", "trained"]
    assert dict(two)["only a trained"] == {"a": trained["a"], "b": initial["b"]}
    three = dict(team_mixes(trained, initial, each_role=True))
    assert list(three) == [
        "initial",
        *(f"only {r} trained" for r in "abc"),
        *(f"all but {r} trained" for r in "abc"),
        "trained",
    ]
    assert three["all but b trained"] == {"a": trained["a"], "b": initial["b"], "c": trained["c"]}
    assert three["only c trained"] == {"a": initial["a"], "b": initial["b"], "c": trained["c"]}
    assert [label for label, _ in team_mixes(trained, initial, each_role=False)] == ["initial", "trained"]
    assert team_mixes(trained, {}, each_role=True) == [("trained", trained)]
