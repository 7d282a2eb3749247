"""`swarm train --team planner=A,executor=B --task duet`: two different models, a server each, one team
fleet, a summary section per role; a team run SIGKILLed whole and resumed (issue 24). Real processes
over loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import running, tree
from team_eval_kit import eval_team_run

from swarm.model.build import VOCAB_SIZE, build_untrained, task_corpus
from swarm.model.presets import build_preset
from swarm.model.tokenizer import build_tokenizer
from swarm.model.warmstart import WarmStartConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: a warm start of a few batches: the test needs a second, differently shaped model, not a skilled one
TINY_WARM = WarmStartConfig(
    arith_examples=64, guess_examples=0, calc_examples=0, duet_examples=16, target_arith_reward=None
)


@pytest.mark.timeout(240)
def test_a_team_of_two_different_models_trains_each_role_on_its_own_server(tmp_path: Path) -> None:
    planner = build_untrained(tmp_path / "planner-model")
    executor = build_preset("tiny-wide", tmp_path / "executor-model", layers=1, warm=TINY_WARM)
    # the embedded recipe's tokenizer (the same ids as the embedded model), on another shape
    vocab = json.loads((executor / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab == build_tokenizer(task_corpus(0), VOCAB_SIZE).backend_tokenizer.get_vocab(with_added_tokens=False)
    assert json.loads((executor / "config.json").read_text())["hidden_size"] == 192
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm",
            "train",
            "--team",
            f"planner={planner},executor={executor}",
            "--task",
            "duet",
            "--steps",
            "2",
            "--group-size",
            "2",
            "--batch-groups",
            "1",
            "--concurrency",
            "4",
            "--no-mlflow",
            "--out",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    printed = json.loads(r.stdout.splitlines()[0])
    assert set(printed["roles"]) == {"planner", "executor"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["task"] == "duet"
    assert list(summary["roles"]) == ["planner", "executor"] and list(summary["servers"]) == ["planner", "executor"]
    for role, model in (("planner", planner), ("executor", executor)):
        section = summary["roles"][role]
        assert section["model_dir"] == str(model) and section["restarts"] == 0
        assert section["steps_done"] >= 2 and section["reward_first_mean"] is not None
        rows = [json.loads(x) for x in (out / section["metrics"]).read_text().splitlines()]
        assert [x["step"] for x in rows][:2] == [1, 2] and rows[0]["episodes"] == 2  # a group of 2 per step
        assert (out / "servers" / role / "checkpoints" / "latest").exists()  # each role's own checkpoint
        assert (out / "logs" / f"server-{role}.log").exists() and (out / f"server-{role}.yaml").exists()
    fleet = (out / "fleet-client0.yaml").read_text()
    assert "planner=http://127.0.0.1:" in fleet and ",executor=http://127.0.0.1:" in fleet
    assert "team: planner=" in (out / "run.yaml").read_text()
    # `swarm eval` of the run: each role's checkpoint (two shapes) plays its part, beside the models it started from
    rows = eval_team_run(out, tmp_path / "eval.json")
    assert {r["role"]: r["model"] for r in rows if r["model_role"] == "initial"} == {
        "planner": str(planner),
        "executor": str(executor),
    }


def _steps(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(240)
def test_a_team_run_killed_whole_resumes_each_role_from_its_own_checkpoint(tmp_path: Path) -> None:
    planner = build_untrained(tmp_path / "planner-model")
    executor = Path(shutil.copytree(planner, tmp_path / "executor-model"))  # another folder: its own server
    out = tmp_path / "run"
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    team = f"planner={planner},executor={executor}"
    command = [
        sys.executable, "-m", "swarm", "train", "--team", team, "--task", "duet",
        "--steps", "4", "--group-size", "2", "--batch-groups", "1", "--concurrency", "4",
        "--checkpoint-every", "2", "--no-mlflow", "--out", str(out),
    ]  # fmt: skip
    roles = {role: out / "servers" / role for role in ("planner", "executor")}
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 - closed below
    train = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while not all((d / "checkpoints" / "latest" / "server_state.json").exists() for d in roles.values()):
            assert train.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.1)
    finally:
        pids = tree(train.pid)  # swarm train, its servers and its client: SIGKILL, nothing may tidy up
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        train.wait(10)
        log.close()
    end = time.monotonic() + 20
    while any(map(running, pids)) and time.monotonic() < end:
        time.sleep(0.1)
    assert len(pids) >= 4 and not any(map(running, pids)), pids  # the run, two servers, a client
    assert not (out / "summary.json").exists()  # killed: no summary, no last checkpoint
    at_kill = {}
    for role, folder in roles.items():
        state = json.loads((folder / "checkpoints" / "latest" / "server_state.json").read_text())
        at_kill[role] = (state["step"], _steps(folder / "metrics.jsonl")[: state["step"]])
        assert state["step"] >= 2 and len(at_kill[role][1]) == state["step"], role

    # refused before anything starts, one line each: another team, a folder that holds no team run
    swapped = [*command[:5], f"planner={executor},executor={planner}", *command[6:], "--resume"]
    r = subprocess.run(swapped, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stderr.count("swarm train:") == 1, r.stderr
    assert f"is the team {team}, not this one" in r.stderr and "--fresh" in r.stderr
    single = tmp_path / "single"
    single.mkdir()
    (single / "run.yaml").write_text("task: arith\nsteps: 2\n")  # a run of one model
    r = subprocess.run([*command[:-1], str(single), "--resume"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stderr.count("swarm train:") == 1, r.stderr
    assert "holds no --team run" in r.stderr and not (single / "servers").exists()
    assert "--resume" not in (out / "logs" / "server-planner.log").read_text()  # nothing was started

    r = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--resume: planner from step" in r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and list(summary["roles"]) == ["planner", "executor"]
    for role, folder in roles.items():
        step, before = at_kill[role]
        rows = _steps(out / summary["roles"][role]["metrics"])
        assert summary["roles"][role]["steps_done"] == len(rows) >= 4, role
        assert [x["step"] for x in rows] == list(range(1, len(rows) + 1)), role  # none twice, none missing
        assert rows[:step] == before, role  # the steps up to the checkpoint stand: not trained again
        state = json.loads((folder / "checkpoints" / "latest" / "server_state.json").read_text())
        assert state["counters"]["resumes"] == 1 and state["step"] >= 4, role  # from its checkpoint, once
        assert "--resume" in (out / "logs" / f"server-{role}.log").read_text()


@pytest.mark.timeout(240)
def test_a_team_run_whose_server_is_stopped_stops_whole_and_resumes(tmp_path: Path) -> None:
    """`swarm ctl --server OUT/servers/planner stop` on a --team run: the run used to restart the stopped
    server (a clean stop read as a crash), or end `failed: every client process exited`. The other server
    stops with it (a last checkpoint each), the run ends `stopped`, and `--resume` goes on from there."""
    planner = build_untrained(tmp_path / "planner-model")
    executor = Path(shutil.copytree(planner, tmp_path / "executor-model"))
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("ROOST_URL", "ROOST_ADMIN_TOKEN")}
    env["ROOST_HOME"] = str(tmp_path / "home")
    command = [
        sys.executable, "-m", "swarm", "train", "--team", f"planner={planner},executor={executor}",
        "--task", "duet", "--engine", "fake", "--steps", "100000", "--group-size", "2", "--batch-groups", "1",
        "--concurrency", "4", "--checkpoint-every", "50", "--no-mlflow", "--out", str(out),
    ]  # fmt: skip
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 - closed below
    train = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while len(_steps(out / "servers" / "executor" / "metrics.jsonl")) < 3:
            assert train.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.1)
        stop = [sys.executable, "-m", "swarm", "ctl", "--server", str(out / "servers" / "planner"), "stop"]
        r = subprocess.run(stop, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        assert train.wait(timeout=150) == 1
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGKILL)
            train.wait(10)
        log.close()
    text = (tmp_path / "first.log").read_text()
    assert "restarting it" not in text and "(status: stopped)" in text, text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["error"].startswith("server planner was stopped"), summary
    assert "swarm train --resume" in summary["error"]
    last = {}
    for role in ("planner", "executor"):  # each wrote a checkpoint at its last step as it stopped
        state = json.loads((out / "servers" / role / "checkpoints" / "latest" / "server_state.json").read_text())
        last[role] = state["step"]
        assert state["step"] == len(_steps(out / "servers" / role / "metrics.jsonl")) >= 3, role
    steps = max(last.values()) + 2
    r = subprocess.run(
        [*command[: command.index("100000")], str(steps), *command[command.index("100000") + 1 :], "--resume"],
        capture_output=True, text=True, timeout=150, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
