"""`swarm train --attach`: runs as LoRA policies of one running `swarm serve`, real processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from failing_flow import FAILING_WORKFLOW  # tests/kit, on sys.path
from procs import kill_marked, marked  # tests/kit, on sys.path

from swarm.model.build import build_untrained

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _serve(tmp_path: Path, model: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "base"
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarm", "serve", "--model", str(model), "--lora-rank", "4", "--policy", "base"]
        + ["--port", "0", "--out", str(out), "--batch-groups", "2", "--no-mlflow"],
        stdout=(tmp_path / "server.log").open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    end = time.monotonic() + 120
    while time.monotonic() < end:
        assert proc.poll() is None, (tmp_path / "server.log").read_text()
        try:
            url = json.loads((out / "server.json").read_text())["url"]
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, out
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    raise AssertionError("server did not start: " + (tmp_path / "server.log").read_text())


def _policies(base: Path) -> list[str]:
    """The policies the server whose out folder is `base` serves now (its admin route)."""
    secrets = json.loads((base / "secrets.json").read_text())
    url = json.loads((base / "server.json").read_text())["url"]
    admin = {"Authorization": f"Bearer {secrets['admin_token']}"}
    return [p["name"] for p in httpx.get(f"{url}/swarm/v1/admin/policies", headers=admin).json()["policies"]]


def _train(out: Path, server: Path, env: dict[str, str], *args: str, workflow: str | None = None) -> subprocess.Popen:
    # a failing workflow: as many workers as a group has episodes, its failing tasks first (tests/kit/failing_flow.py)
    plays = ["--workflow", workflow, "--concurrency", "2"] if workflow else ["--task", "arith", "--concurrency", "4"]
    return subprocess.Popen(
        [sys.executable, "-m", "swarm", "train", "--attach", str(server), "--steps", "2", *plays]
        + ["--group-size", "2", "--batch-groups", "2", "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=out.parent,
    )


def test_two_runs_train_as_policies_of_one_server(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    server, base = _serve(tmp_path, model, env)
    (tmp_path / "failing_flow.py").write_text(FAILING_WORKFLOW)  # lr-b's workflow fails on two of its tasks
    try:
        runs = {
            name: _train(
                tmp_path / name, base, env, "--model", str(model), "--policy", name, "--lr", lr, "--seed", seed,
                workflow=workflow,
            )
            for name, lr, seed, workflow in (("lr-a", "1e-3", "1", None), ("lr-b", "0", "2", "failing_flow:workflow"))
        }  # fmt: skip
        said = {}
        for name, proc in runs.items():
            said[name], _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, said[name]
        # the failing workflow is said as `swarm train` says it, and named in the summary
        assert "workflow failed (" in " ".join(said["lr-b"].split()) and "workflow failed" not in said["lr-a"]
        failures = json.loads((tmp_path / "lr-b" / "summary.json").read_text())["workflow_failures"]
        assert len(failures) == 2 and "LookupError: no such tool" in failures[0] + failures[1], failures
        assert "workflow_failures" not in json.loads((tmp_path / "lr-a" / "summary.json").read_text())
        for name in runs:
            summary = json.loads((tmp_path / name / "summary.json").read_text())
            assert summary["status"] == "finished" and summary["steps_done"] == 2, summary
            assert summary["attached"]["policy"] == name and summary["attached"]["server"] == str(base)
            rows = [json.loads(line) for line in (tmp_path / name / summary["metrics"]).read_text().splitlines()]
            assert [r["step"] for r in rows] == [1, 2]
            ran = (base / "policies" / name / "metrics.jsonl").read_text().splitlines()
            assert len(ran) == 2  # the policy trained on the server, in its own folder
        assert json.loads((tmp_path / "lr-a" / "summary.json").read_text())["config"]["lr"] == 1e-3
        # both policies are gone again: the server holds only its keeper, and is still up
        assert _policies(base) == ["base"] and server.poll() is None
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_attach_refuses_another_base_and_a_missing_server(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    missing = _train(tmp_path / "x", tmp_path / "nowhere", env, "--model", str(model))
    text, _ = missing.communicate(timeout=120)
    assert missing.returncode == 2 and "not the out folder of a running `swarm serve` (no such folder)" in text, text
    other = build_untrained(tmp_path / "other", seed=1)
    server, base = _serve(tmp_path, model, env)
    try:
        wrong = _train(tmp_path / "y", base, env, "--model", str(other))
        text, _ = wrong.communicate(timeout=120)
        assert wrong.returncode == 2 and "a policy shares its base" in text, text
        assert not (base / "policies" / "y").exists()  # nothing was added to the server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def test_a_cancelled_attached_run_stops_its_fleet_and_takes_its_policy_off(tmp_path: Path) -> None:
    """A study's trial cancelled (SIGTERM to `swarm train --attach`): its fleet is stopped, its policy
    removed (its steps checkpointed), its summary says interrupted. The driver used to die at once, its
    fleet (a session of its own) training on and its policy left on the shared server."""
    model = build_untrained(tmp_path / "model", seed=0)
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    server, base = _serve(tmp_path, model, env)
    run, mark = tmp_path / "trial", {"ROOST_TEST_RUN": str(tmp_path / "trial")}  # its processes, not the server
    driver = _train(run, base, {**env, **mark}, "--model", str(model), "--policy", "trial", "--steps", "100000")
    try:
        deadline = time.monotonic() + 180
        while not (base / "policies" / "trial" / "metrics.jsonl").exists():
            assert driver.poll() is None and time.monotonic() < deadline, driver.stdout.read() if driver.stdout else ""
            time.sleep(0.2)
        driver.send_signal(signal.SIGTERM)
        driver.communicate(timeout=120)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["attached"]["checkpoint"], summary
        assert marked(mark) == []  # its fleet stopped with it
        assert _policies(base) == ["base"] and server.poll() is None
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
        kill_marked(mark)
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
