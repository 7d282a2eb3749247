"""`swarm eval` on a run: the trained model beside the one it started from, greedy and sampled.

The demo (`swarm train --task arith`) sharpens sampling while greedy dips a little;
one number alone hides that, so evaluating a run folder (or a checkpoint with
`--baseline`) shows both models side by side (issue item 11).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from swarm.model.build import build_untrained


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory) -> tuple[Path, Path]:
    """A `swarm train` run folder: OUT/server/config.yaml naming the initial model, one checkpoint."""
    root = tmp_path_factory.mktemp("evalrun")
    initial = build_untrained(root / "initial", seed=0)
    run = root / "run"
    ckpts = run / "server" / "checkpoints"
    shutil.copytree(build_untrained(root / "trained", seed=1), ckpts / "step_000003")
    (ckpts / "step_000003" / "server_state.json").write_text(json.dumps({"step": 3}))
    os.symlink("step_000003", ckpts / "latest")
    (run / "server" / "config.yaml").write_text(yaml.safe_dump({"model_dir": str(initial), "out_dir": "x"}))
    (run / "run.yaml").write_text("task: arith\n")
    return run, initial


def test_run_models_found_from_run_folder_and_checkpoint(fake_run):
    from swarm.model.evaluate import run_models

    run, initial = fake_run
    evaluated, start = run_models(run)
    assert evaluated == run / "server" / "checkpoints" / "step_000003" and start == initial
    assert run_models(run / "server" / "checkpoints" / "latest")[1] == initial  # a checkpoint of the run
    assert run_models(initial) == (initial, None)  # a plain model directory: nothing to compare with


def test_eval_of_a_run_folder_compares_with_the_initial_model(fake_run, tmp_path):
    from swarm.cli import app

    run, initial = fake_run
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(
        app, ["eval", "--model", str(run), "--task", "arith", "--n", "4", "--json", str(out)], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    header = next(line for line in lines if "greedy" in line)
    assert "sampled" in header
    assert any(line.lstrip("│ ").startswith("initial") for line in lines), r.output
    assert any(line.lstrip("│ ").startswith("trained") for line in lines), r.output
    rows = json.loads(out.read_text())
    assert {(row["model_role"], row["temperature"]) for row in rows} == {
        ("initial", 0.0),
        ("initial", 1.0),
        ("trained", 0.0),
        ("trained", 1.0),
    }
    # a checkpoint with --baseline does the same; without it, one model only
    r = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(run / "server" / "checkpoints" / "latest"),
            "--task",
            "arith",
            "--n",
            "2",
            "--temperature",
            "0",
            "--baseline",
        ],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0 and "initial" in r.output, r.output
    r = CliRunner().invoke(
        app,
        ["eval", "--model", str(initial), "--task", "arith", "--n", "2", "--temperature", "0", "--baseline"],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 2 and "initial model" in r.output, r.output


def test_eval_of_a_run_scores_its_own_tasks_and_takes_the_run_as_an_argument(fake_run, tmp_path):
    """`swarm eval RUN` said "unexpected extra argument" (inspect and export take the run that way), and a run
    of arith was scored on every built-in task: the run's own task(s) are the default now."""
    from swarm.cli import app
    from swarm.model.eval_cli import run_tasks

    run, initial = fake_run
    assert run_tasks(run) == ["arith"] and run_tasks(run / "server" / "checkpoints" / "latest") == ["arith"]
    assert run_tasks(initial) == []  # a plain model: every task
    mix = tmp_path / "mix"
    mix.mkdir()
    (mix / "run.yaml").write_text("task: arith=3+calc=1\n")
    assert run_tasks(mix) == ["arith", "calc"]
    (mix / "run.yaml").write_text("task: null\nworkflow: my_agent:play\n")
    assert run_tasks(mix) == []
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["eval", str(run), "--n", "2", "-t", "0", "--json", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "tasks: arith, the run's own (--task to choose)" in r.output
    assert {row["task"] for row in json.loads(out.read_text())} == {"arith"}
    r = CliRunner().invoke(app, ["eval", str(run), "--model", str(initial)], env={"COLUMNS": "200"})
    assert r.exit_code == 2 and "two models named" in r.output


def test_run_models_of_a_run_with_several_policies(tmp_path, fake_run):
    """A --shared-base run: the run folder names no one model (the error lists the policies); a policy's
    folder or checkpoint is evaluated beside the run's initial model."""
    from swarm.model.evaluate import RunFolderError, run_models

    _, initial = fake_run
    server = tmp_path / "run" / "server"
    for name in ("executor", "planner"):
        step = server / "policies" / name / "checkpoints" / "step_000002"
        step.mkdir(parents=True)
        (step / "server_state.json").write_text(json.dumps({"step": 2}))
    (server / "config.yaml").write_text(yaml.safe_dump({"model_dir": str(initial), "out_dir": "x"}))
    with pytest.raises(RunFolderError, match=r"several policies \(executor, planner\)"):
        run_models(tmp_path / "run")
    (server / "policies" / "late").mkdir()  # added live, no checkpoint yet: listed too, marked
    with pytest.raises(RunFolderError) as exc:  # `swarm eval` and `swarm model export` say it alike: no --model
        run_models(tmp_path / "run")
    assert "(executor, late (no checkpoint yet), planner): name one of their folders instead, e.g. " in str(exc.value)
    assert "--model" not in str(exc.value)
    policy = server / "policies" / "planner"
    assert run_models(policy) == ((policy / "checkpoints" / "step_000002").resolve(), initial)
    assert run_models(policy / "checkpoints" / "step_000002") == (policy / "checkpoints" / "step_000002", initial)


def test_a_run_folder_with_no_checkpoint_says_so(tmp_path, fake_run):
    """A run that ended before its first step: `swarm eval` and `swarm model export` called it "not a model
    directory" / "neither a model directory, a checkpoint nor a run folder"; it is a run folder, with none yet."""
    from swarm.cli import app
    from swarm.model.evaluate import RunFolderError, run_models

    _, initial = fake_run
    run = tmp_path / "run"
    (run / "server").mkdir(parents=True)
    (run / "server" / "config.yaml").write_text(yaml.safe_dump({"model_dir": str(initial), "out_dir": "x"}))
    (run / "summary.json").write_text(json.dumps({"status": "failed", "steps_done": 0}))
    with pytest.raises(RunFolderError, match=r"no checkpoint yet \(its run ended failed before its first step\)"):
        run_models(run)
    r = CliRunner().invoke(app, ["model", "export", str(run), "--merge", str(tmp_path / "merged")])
    said = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and "is a run folder with no checkpoint yet" in said
    assert not (tmp_path / "merged").exists()


def test_a_path_that_is_not_there_is_named_as_the_user_gave_it(tmp_path):
    """`swarm eval PATH` on a typo said "--model: ... no config.json": the argument as given, and that it is missing."""
    from swarm.cli import app

    missing = tmp_path / "nope"
    for args, where in ((["eval", str(missing)], "RUN_OR_MODEL"), (["eval", "--model", str(missing)], "--model")):
        r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        said = " ".join(r.output.replace("│", " ").split())
        assert r.exit_code == 2 and f"{where}: {missing} does not exist" in said, said


def test_a_team_run_folder_names_its_servers(tmp_path):
    """Given as --teacher (or to eval, export), a --team run's folder failed mid-sentence: "has no tokenizer:
    Couldn't instantiate the backend tokenizer from one of:"."""
    from swarm.model.evaluate import RunFolderError, run_models

    for role in ("executor", "planner"):
        (tmp_path / "team" / "servers" / role).mkdir(parents=True)
        (tmp_path / "team" / "servers" / role / "config.yaml").write_text("model_dir: x\n")
    with pytest.raises(RunFolderError) as exc:
        run_models(tmp_path / "team")
    assert "trained a team, a server per model (executor, planner): name one of their folders instead" in str(exc.value)
