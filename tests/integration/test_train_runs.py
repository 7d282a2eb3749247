"""`swarm train` never mixes runs, trains your own workflow, and its CLI says what it does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from failing_flow import FAILING_WORKFLOW, RAISES_AT  # tests/kit, on sys.path
from procs import hangup_default, kill_marked, marked, running  # tests/kit, on sys.path

from swarm.model.build import build_untrained
from swarm.run_checks import clear_run, previous_run

ROOT = Path(__file__).resolve().parents[2]
SWARM = [sys.executable, "-m", "swarm"]


def _swarm_script() -> str:
    """The console script (which, unlike `python -m`, does not put the current directory on sys.path)."""
    return str(Path(sys.executable).with_name("swarm"))


def test_train_refuses_a_folder_that_holds_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "server").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    r = subprocess.run(
        [*SWARM, "train", "--out", str(out), "--steps", "2"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "earlier run" in r.stderr and "--resume" in r.stderr and "--fresh" in r.stderr
    assert (out / "summary.json").read_text() == "{}"  # nothing touched
    r = subprocess.run(  # a bad --team is said with the folder's problem, not after a second try with --fresh
        [*SWARM, "train", "--out", str(out), "--team", "nope", "--task", "duet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "earlier run" in r.stderr and "--team: expected ROLE=MODEL, got 'nope'" in r.stderr
    r = subprocess.run(
        [*SWARM, "train", "--out", str(tmp_path / "empty"), "--resume"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "nothing to resume" in r.stderr


def test_train_refuses_a_serve_folder_and_a_folder_under_a_file(tmp_path: Path) -> None:
    served = tmp_path / "served"  # what `swarm serve --out served` leaves: no run.yaml, its server's files on top
    (served / "checkpoints").mkdir(parents=True)
    (served / "server.json").write_text("{}")
    (served / "buffer.sqlite").write_text("")
    for flags in ([], ["--fresh"], ["--resume"]):
        r = subprocess.run([*SWARM, "train", "--out", str(served), *flags], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "out folder of a `swarm serve` (server.json, buffer.sqlite, checkpoints)" in r.stderr
        assert "never mixed with another run" in r.stderr
    assert sorted(p.name for p in served.iterdir()) == ["buffer.sqlite", "checkpoints", "server.json"]
    (tmp_path / "afile").write_text("")
    r = subprocess.run(
        [*SWARM, "train", "--out", str(tmp_path / "afile" / "sub")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and f"{tmp_path / 'afile'} is a file, not a folder" in r.stderr, r.stderr


def _endless_run(tmp_path: Path) -> tuple[Path, list[str], subprocess.Popen]:
    """A `swarm train` (fake engine) that goes on until stopped, in a session of its own: (out, args, driver)."""
    out, model_dir = tmp_path / "run", build_untrained(tmp_path / "model", seed=0)
    args = ["train", "--engine", "fake", "--model", str(model_dir), "--steps", "100000", "--out", str(out)]
    with (tmp_path / "driver.log").open("w") as log:  # the driver keeps its own copy of the file
        driver = subprocess.Popen(
            [*SWARM, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **_mark(tmp_path)},  # inherited by the server and the clients it starts
            preexec_fn=hangup_default,  # as from a terminal, also when the tests themselves run under nohup
        )
    return out, args, driver


def _mark(tmp_path: Path) -> dict[str, str]:
    """The environment mark of this test's run: its processes found by it (tests/kit/procs.py), by PID."""
    return {"ROOST_TEST_RUN": str(tmp_path)}


def _until(ready: Callable[[], bool], driver: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_run_still_going_is_refused_even_with_fresh_or_resume(tmp_path: Path) -> None:
    """`--fresh` into the folder of a run still going deleted its files under it; `--resume` started a
    second server on them. The first run's driver holds the folder: both are one line, nothing touched."""
    out, args, first = _endless_run(tmp_path)
    try:
        # run.yaml as it stays: written again with the fleets once the server has said its URL
        _until(lambda: "url: http" in _text(out / "run.yaml") and '"pid"' in (out / "run.lock").read_text(), first)
        written = (out / "run.yaml").read_text()
        for flag in ("--fresh", "--resume"):
            r = subprocess.run([*SWARM, *args, flag], capture_output=True, text=True, timeout=120)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1, r.stdout + r.stderr
            assert f"in use by another swarm train (pid {first.pid}), a run still going" in lines[0], lines
        assert (out / "run.yaml").read_text() == written and first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGTERM)  # the driver stops its server and clients
        first.wait(timeout=60)


def test_a_server_killed_mid_run_ends_with_how_to_resume(tmp_path: Path) -> None:
    """`kill -9` of its server: the run failed with "server stopped after N of M steps" and no word that
    `--resume` goes on from its last checkpoint, as Ctrl-C's line says."""
    out, args, driver = _endless_run(tmp_path)
    try:
        _until(lambda: len(_text(out / "server" / "metrics.jsonl").splitlines()) >= 2, driver)
        os.kill(json.loads((out / "server" / "server.json").read_text())["pid"], signal.SIGKILL)
        assert driver.wait(timeout=60) == 1
    finally:
        kill_marked(_mark(tmp_path))
    said = " ".join((tmp_path / "driver.log").read_text().split())
    assert "server stopped after" in said and "(exit code -9)" in said, said[-2000:]
    assert f"`swarm train --out {out} --resume` goes on from its last checkpoint" in said, said[-2000:]


def test_fresh_removes_only_what_a_run_wrote(tmp_path: Path) -> None:
    for name in ("server", "logs"):
        (tmp_path / name).mkdir()
    for name in ("summary.json", "run.yaml", "fleet-client0.yaml", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert set(previous_run(tmp_path)) == {"server", "logs", "summary.json", "run.yaml", "fleet-client0.yaml"}
    clear_run(tmp_path)
    assert previous_run(tmp_path) == [] and (tmp_path / "notes.txt").read_text() == "x"


def test_client_imports_a_workflow_from_the_current_directory(tmp_path: Path) -> None:
    """The README's `swarm client --workflow examples.arith_openai:workflow`, run from the repo root."""
    r = subprocess.run(
        [
            _swarm_script(),
            "client",
            "--workflow",
            "examples.arith_openai:workflow",
            "--token",
            "t",
            "--url",
            "http://127.0.0.1:9",
            "--retries",
            "0",
            "--reconnect-s",
            "0",
            "-q",
            "--state",
            str(tmp_path / "cursor.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "No module named" not in r.stderr, r.stderr
    assert "cannot use http://127.0.0.1:9" in r.stderr  # it got as far as the (absent) server


def test_help_shows_every_default() -> None:
    env = {**os.environ, "COLUMNS": "300"}
    r = subprocess.run([*SWARM, "model", "init", "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert "ROOST_HOME/models/tiny-qwen2" in r.stdout
    r = subprocess.run([*SWARM, "train", "--help"], capture_output=True, text=True, timeout=60, env=env)
    for line in ("--lr", "--lease-seconds", "--steps", "--concurrency"):
        shown = [x for x in r.stdout.splitlines() if x.lstrip("│ ").startswith(line + " ")]
        assert shown and "[default: " in shown[0], (line, shown)


@pytest.mark.integration
@pytest.mark.slow
def test_train_your_own_workflow_then_resume_it(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    base = [
        _swarm_script(),
        "train",
        "--workflow",
        "examples.arith_openai:workflow",
        "--model",
        str(model),
        "--group-size",
        "2",
        "--batch-groups",
        "2",
        "--concurrency",
        "4",
        "--no-mlflow",
        "--out",
        str(out),
    ]
    r = subprocess.run([*base, "--steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workflow"] == "examples.arith_openai:workflow" and summary["steps_done"] == 1
    run_file = yaml.safe_load((out / "run.yaml").read_text())
    assert run_file["workflow"] == "examples.arith_openai:workflow" and run_file["server"]["group_size"] == 2
    assert "token" not in run_file["server"]  # secrets stay out of the run's config
    # the same folder again: refused; --resume continues to 2 steps in all and prints only the new one
    r = subprocess.run([*base, "--steps", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "--resume" in r.stderr
    first_part = {name: (out / "logs" / name).read_text() for name in ("server.log", "client0.log")}
    r = subprocess.run(
        [*base, "--steps", "2", "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / summary["metrics"]).read_text().splitlines()]
    assert [s["step"] for s in rows] == [1, 2] and summary["config"]["steps"] == 2 and summary["steps_done"] == 2
    assert "step 1:" not in r.stderr and "step 2:" in r.stderr
    for name, text in first_part.items():  # the resumed part's logs follow the first part's, under a marker
        log = (out / "logs" / name).read_text()
        assert log.startswith(text) and "--resume" in log[len(text) :], name


@pytest.mark.integration
@pytest.mark.slow
def test_train_says_at_once_that_the_workflow_fails(tmp_path: Path) -> None:
    """A workflow raising on some tasks (or returning None unfinished) lost those episodes in silence: the
    run trained on the rest and only the client's log said why. `swarm train` prints each kind once."""
    (tmp_path / "failing_flow.py").write_text(FAILING_WORKFLOW)
    out = tmp_path / "run"
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    r = subprocess.run(
        [*SWARM, "train", "--workflow", "failing_flow:workflow", "--engine", "fake",
         "--model", str(build_untrained(tmp_path / "model", seed=0)), "--steps", "2", "--group-size", "2",
         "--batch-groups", "1", "--concurrency", "2", "--no-mlflow", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    said = " ".join(r.stderr.split())
    assert said.count("warning: client0.log: workflow failed (") == 1, r.stderr
    assert "LookupError: no such tool: t" in said and f"(the traceback: {out / 'logs' / 'client0.log'})" in said
    assert said.count("warning: client0.log: workflow returned None without finishing the episode") == 1
    log = (out / "logs" / "client0.log").read_text()
    assert f'failing_flow.py", line {RAISES_AT}, in workflow' in log  # the traceback, in the log
    failures = json.loads((out / "summary.json").read_text())["workflow_failures"]  # and in the summary
    assert len(failures) == 2 and "LookupError: no such tool" in failures[0] + failures[1], failures


@pytest.mark.slow
def test_eval_scores_a_model_greedy_and_sampled(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "eval.json"
    r = subprocess.run(
        [*SWARM, "eval", "--model", str(model), "--task", "arith", "--n", "4", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert [(row["task"], row["temperature"], row["n"]) for row in rows] == [("arith", 0.0, 4), ("arith", 1.0, 4)]
    assert all(0.0 <= row["mean_reward"] <= 1.0 for row in rows)
    r = subprocess.run(
        [*SWARM, "eval", "--model", str(model), "--task", "nope"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "unknown task 'nope'" in r.stderr


def test_ctl_set_help_needs_no_token_and_lists_every_live_setting() -> None:
    from swarm.server.admin_schema import LiveConfigUpdate

    env = {k: v for k, v in os.environ.items() if k != "ROOST_ADMIN_TOKEN"} | {"COLUMNS": "200"}
    r = subprocess.run([*SWARM, "ctl", "set", "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    for name in LiveConfigUpdate.model_fields:
        assert f"{name}:" in r.stdout, name
    assert "loss_agg" in r.stdout
    r = subprocess.run([*SWARM, "ctl", "get"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "admin token is required" in r.stderr  # a real call still needs one


@pytest.mark.integration
@pytest.mark.slow
def test_train_logs_the_final_model_to_mlflow(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    r = subprocess.run(
        [
            *SWARM,
            "train",
            "--task",
            "arith",
            "--model",
            str(model),
            "--steps",
            "1",
            "--group-size",
            "2",
            "--batch-groups",
            "2",
            "--concurrency",
            "4",
            "--out",
            str(out),
            "--mlflow-run-name",
            "arm=a seed=0",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    run = client.get_run(summary["mlflow"]["run_id"])
    assert run.info.run_name == "arm=a seed=0" and run.info.status == "FINISHED"
    assert summary["mlflow"]["model_uri"].startswith("models:/")
    logged = client.get_logged_model(summary["mlflow"]["model_uri"].split("/")[-1])
    assert logged.source_run_id == run.info.run_id
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "run.yaml" in artifacts


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_hangup_or_terminate_stops_the_whole_run_and_says_interrupted(tmp_path: Path, sig: signal.Signals) -> None:
    """The terminal closed (SIGHUP) or a scheduler cancelled (SIGTERM): the driver stops its server and
    fleet (each in a session of its own) and writes its summary. SIGHUP used to kill the driver alone,
    leaving both training on, orphaned, with no summary."""
    out, _, driver = _endless_run(tmp_path)
    try:
        _until((out / "server" / "metrics.jsonl").exists, driver)
        driver.send_signal(sig)
        assert driver.wait(timeout=90) != 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["steps_done"] >= 1, summary
        said = " ".join((tmp_path / "driver.log").read_text().split())  # it ended without a word before
        assert f"interrupted after {summary['steps_done']} of 100000 steps" in said and "--resume" in said, said
        assert marked(_mark(tmp_path)) == []  # its server and client stopped with it
        assert json.loads((out / "client-state" / "client0.json").read_text())["next"] > 0  # its own cursor
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        kill_marked(_mark(tmp_path))


def test_a_run_whose_server_is_stopped_by_swarm_ctl_says_stopped_and_resumes(tmp_path: Path) -> None:
    """`swarm ctl --server RUN stop` (the run's port and tokens are its own: read from its folder) ends the
    run as `stopped` with how to go on; it read "failed: every client process exited" before."""
    out, args, driver = _endless_run(tmp_path)
    try:
        _until(lambda: len(_rows(out)) >= 2, driver)
        env = {k: v for k, v in os.environ.items() if k not in ("ROOST_URL", "ROOST_ADMIN_TOKEN")}
        r = subprocess.run([*SWARM, "ctl", "stop", "--server", str(out)], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert driver.wait(timeout=120) == 1
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "stopped" and "swarm train --resume" in summary["error"], summary
        assert marked(_mark(tmp_path)) == []
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        kill_marked(_mark(tmp_path))
    steps = summary["steps_done"] + 2
    more = [*args[: args.index("--steps")], "--steps", str(steps), "--out", str(out), "--resume"]
    r = subprocess.run([*SWARM, *more], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"


def _rows(out: Path) -> list[str]:
    try:
        return (out / "server" / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []


def test_a_server_left_running_by_a_killed_driver_is_named_before_a_resume_or_fresh(tmp_path: Path) -> None:
    """`kill -9` of the driver (or the OOM killer's) leaves its server training on and its fleet playing,
    each in a session of its own. `--resume` then started a second server on its folder (and a second
    fleet on the cursor), `--fresh` deleted their files under them."""
    out, args, driver = _endless_run(tmp_path)
    try:
        _until((out / "server" / "metrics.jsonl").exists, driver)
        server_pid = json.loads((out / "server" / "server.lock").read_text())["pid"]
        fleet_lock = out / "client-state" / "client0.json.lock"
        _until(fleet_lock.exists, driver)
        fleet_pid = json.loads(fleet_lock.read_text())["pid"]
        driver.kill()
        driver.wait(timeout=30)
        for flag in ("--resume", "--fresh"):
            r = subprocess.run([*SWARM, *args, flag], capture_output=True, text=True, timeout=120)
            assert r.returncode == 2, r.stdout + r.stderr
            assert f"in use by another swarm serve (pid {server_pid}, http" in r.stderr, r.stderr
            assert "left running when this run's `swarm train` was killed" in r.stderr, r.stderr
            cursor = out / "client-state" / "client0.json"
            assert f"the client fleet on {cursor} (another swarm client (pid {fleet_pid}))" in r.stderr, r.stderr
        assert (out / "server" / "metrics.jsonl").exists() and running(server_pid) and running(fleet_pid)
    finally:
        kill_marked(_mark(tmp_path))
