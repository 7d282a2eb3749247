"""What a `swarm train` run records, and the commands its files document.

* `run.yaml` says what ran (the port, the server's out dir, the group size the server used under
  the group call) and `swarm train --config OUT/run.yaml`, as its header and the README write it,
  repeats the run (into a fresh sibling folder, named on stderr);
* `summary.json` points to the metrics instead of copying them and names its reward windows;
* nothing starts before every checkable input is checked, each problem one line;
* clients that all die are named by their log files, the MLflow run is FAILED, and the same
  command run again replaces the failed run (its logs kept).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from swarm.model.build import build_untrained

SWARM = [sys.executable, "-m", "swarm"]
SMALL = ["--group-size", "2", "--batch-groups", "2", "--concurrency", "4"]


def _swarm(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SWARM, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "ROOST_HOME": str(cwd / "home"), **(env or {})},
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.integration
@pytest.mark.slow
def test_run_yaml_records_what_ran(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    r = _swarm(
        "train",
        "--task",
        "arith",
        "--model",
        str(model),
        "--steps",
        "2",
        *SMALL,
        "--no-mlflow",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = (out / "run.yaml").read_text()
    recorded = yaml.safe_load(text)
    served = json.loads((out / "server" / "server.json").read_text())
    # the server's real port and folder, not the defaults of `swarm serve`
    assert recorded["server"]["port"] == int(served["url"].rsplit(":", 1)[1])
    # the server was told port 0 and bound what the kernel gave it (a port picked by `swarm train` and
    # handed over could be taken before the server bound it); the fleets were given the URL it bound
    assert yaml.safe_load((out / "server.yaml").read_text())["port"] == 0
    assert recorded["ran"]["fleets"]["client0"]["url"] == served["url"]
    assert Path(recorded["server"]["out_dir"]) == out / "server" and Path(recorded["out"]) == out
    # the group call: the run's groups are 2 choices of one call; the server ran with group size 1
    assert recorded["server"]["group_size"] == 2 and recorded["ran"]["server"]["group_size"] == 1
    assert recorded["ran"]["fleets"]["client0"]["choices"] == 2
    assert "swarm train --config" in text and "picks a free port" in text and "run-2" in text  # the header

    summary = json.loads((out / "summary.json").read_text())
    assert "steps" not in summary and summary["metrics"] == "server/metrics.jsonl"
    rows = _rows(out / summary["metrics"])
    assert [row["step"] for row in rows] == [1, 2] and summary["steps_done"] == 2
    assert summary["reward_window"] == 1 and summary["status"] == "finished"  # 5, but never sharing a step
    assert summary["reward_first_mean"] == pytest.approx(rows[0]["reward_mean"])
    assert summary["reward_last_mean"] == pytest.approx(rows[1]["reward_mean"])

    # the documented command (`swarm train --config OUT/run.yaml`) is run, as the README writes it, by
    # tests/integration/test_readme_commands.py: a fresh sibling folder, the same settings, the first run untouched


PLAY = """
import os


def play(task, episode):
    if os.environ.get("PLAY_DIES"):
        os._exit(3)
    episode.openai.chat.completions.create(model=episode.model, max_tokens=4,
                                           messages=[{"role": "user", "content": task["q"]}])
    return 1.0
"""
DATASET = """

def dataset(seed, size):
    return [{"task_id": f"t{i}", "q": f"What is {i}+1?"} for i in range(size)]
"""


def test_train_checks_every_input_before_starting_anything(tmp_path: Path) -> None:
    (tmp_path / "play_only.py").write_text(PLAY)  # a workflow without a dataset beside it
    (tmp_path / "not_callable.py").write_text("play = 3\n")
    r = _swarm(
        "train",
        "--workflow",
        "play_only:play",
        "--model",
        str(tmp_path / "nowhere"),
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    problems = [line for line in r.stderr.splitlines() if line.startswith("swarm train: ")]
    assert any("--dataset" in line and "play_only" in line for line in problems), r.stderr
    assert any("--model" in line and "nowhere" in line for line in problems), r.stderr
    assert not (tmp_path / "run").exists()  # nothing made, nothing started
    r = _swarm(
        "train",
        "--workflow",
        "not_callable:play",
        "--dataset",
        "nope_module:data",
        "--out",
        str(tmp_path / "run"),
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2
    assert "not callable" in r.stderr and "cannot import 'nope_module'" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
    (tmp_path / "no_ids.py").write_text(PLAY + DATASET.replace('"task_id"', '"id"'))
    r = _swarm("train", "--workflow", "no_ids:play", "--out", str(tmp_path / "run"), cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr  # every fleet thread died of it, a minute before the run failed
    assert r.stderr.splitlines() == [
        "swarm train: --dataset: task 0 of no_ids:dataset has no 'task_id' (every task is a dict with a task_id)"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
@pytest.mark.slow
def test_a_run_whose_clients_die_is_failed_named_and_can_be_run_again(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(PLAY + DATASET)
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    command = ("train", "--workflow", "agent:play", "--model", str(model), "--steps", "1", *SMALL, "--out", str(out))
    r = _swarm(*command, cwd=tmp_path, env={"PLAY_DIES": "1"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(out / "logs" / "client0.log") in r.stderr, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "client" in summary["error"] and summary["steps_done"] == 0
    from mlflow.tracking import MlflowClient

    mlflow_run = json.loads((out / "server" / "mlflow_run.json").read_text())
    client = MlflowClient(mlflow_run["tracking_uri"])
    failed = client.get_run(mlflow_run["run_id"])
    assert failed.info.status == "FAILED"
    assert failed.data.params["workflow"] == "agent:play" and "task" not in failed.data.params  # none given
    assert "verl" not in failed.data.params and not any(k.startswith(("verl", "vllm")) for k in failed.data.params)
    first_log = (out / "logs" / "server.log").read_text()
    # the same command again: the failed run (no step trained) is replaced, its logs kept
    r = _swarm(*command, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "failed" in r.stderr and "replac" in r.stderr
    assert (out / "logs" / "server.log").read_text().startswith(first_log)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["mlflow"]["run_id"] != mlflow_run["run_id"]
    assert client.get_run(summary["mlflow"]["run_id"]).info.status == "FINISHED"
