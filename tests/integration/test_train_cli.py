"""`swarm train` end to end: real server and client processes over loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from team_eval_kit import eval_team_run
from train_runs import run_metrics, swarm_train  # tests/kit, on sys.path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _train_arith(tmp_path, *args: str, task: str = "arith"):
    """`swarm train --task arith` (or `task`) for 2 steps on an untrained model under its own ROOST_HOME."""
    return swarm_train(tmp_path, *args, task=task)[1]


def test_train_writes_summary_and_cleans_up(tmp_path):
    out = _train_arith(tmp_path, "--group-size", "2", "--batch-groups", "2", "--concurrency", "4")
    summary = json.loads((out / "summary.json").read_text())
    steps = run_metrics(out)
    assert [s["step"] for s in steps] == [1, 2]
    assert all(0.0 <= s["reward_mean"] <= 1.0 for s in steps)
    assert summary["reward_first_mean"] is not None and summary["reward_last_mean"] is not None
    assert summary["wall_s"] > 0
    assert summary["config"]["group_call"] is True  # arith's default: a group is one n-choice call
    assert (steps[0]["episodes"], steps[0]["samples"]) == (2, 4)
    timing = summary["timing"]  # medians of step 2 on (one step here)
    assert timing["collection_s"] == pytest.approx(steps[1]["wall_window_s"], abs=1e-4)
    assert timing["train_s"] > 0 and timing["engine_busy_s"] >= 0
    # every process it started is gone: the server wrote its pid
    pid = json.loads((out / "server" / "server.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # the server logged the run to MLflow (SQLite under ROOST_HOME by default): the reward curve is there
    from mlflow.tracking import MlflowClient

    client = MlflowClient(summary["mlflow"]["tracking_uri"])
    history = client.get_metric_history(summary["mlflow"]["run_id"], "reward_mean")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [1, 2]
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == [s["reward_mean"] for s in steps]
    run = client.get_run(summary["mlflow"]["run_id"])
    assert run.info.status == "FINISHED"
    # the parameters say what ran: the task, the server's group size under the group call, only this engine's
    params = run.data.params
    assert params["task"] == "arith" and params["group_call"] == "True" and params["group_size"] == "1"
    assert params["engine"] == "torch" and not any(k.split(".")[0] in ("verl", "vllm") for k in params)


def test_train_group_call_samples_each_group_in_one_call(tmp_path):
    """`--group-call`: a group is one episode whose one call samples `group_size` choices."""
    out = _train_arith(
        tmp_path, "--group-size", "4", "--batch-groups", "2", "--concurrency", "2", "--group-call", "--no-mlflow"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["group_call"] is True and summary["config"]["group_size"] == 4  # choices per group
    for step in run_metrics(out):  # 2 groups a step: 2 episodes, each one call of 4 choices, 8 samples
        assert (step["episodes"], step["calls"], step["samples"]) == (2, 8, 8)


def test_train_no_group_call_plays_an_episode_per_member(tmp_path):
    out = _train_arith(
        tmp_path, "--group-size", "2", "--batch-groups", "2", "--concurrency", "4", "--no-group-call", "--no-mlflow"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["group_call"] is False
    for step in run_metrics(out):
        assert (step["episodes"], step["calls"], step["samples"]) == (4, 4, 4)


def test_group_call_only_for_tasks_that_support_it() -> None:
    from pydantic import ValidationError

    from swarm.config.run import RunConfig

    assert RunConfig(task="arith").grouped and not RunConfig(task="calc").grouped
    assert not RunConfig(task="arith+guess").grouped and not RunConfig(task="arith", group_call=False).grouped
    with pytest.raises(ValidationError, match="task calc does not sample a group in one call"):
        RunConfig(task="calc", group_call=True)


def test_metrics_tail_reads_only_new_complete_lines(tmp_path):
    from swarm.run_layout import MetricsTail

    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.poll() == []  # no file yet
    path.write_text('{"step": 1}\n{"step": 2')  # the second row is still being written
    assert [r["step"] for r in tail.poll()] == [1]
    with path.open("a") as f:
        f.write('}\n{"step": 3}\n')
    assert [r["step"] for r in tail.poll()] == [1, 2, 3]
    path.write_text('{"step": 1}\n')  # rewritten shorter (a recovering server): read again from the start
    assert [r["step"] for r in tail.poll()] == [1]


def test_train_rejects_bad_input(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "train", "--task", "nope"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "unknown task 'nope'" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "train", "--model", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "config.json" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA can give --device cuda")
def test_train_on_cuda_without_a_gpu_is_refused_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "train", "--task", "arith", "--device", "cuda", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROOST_HOME": str(tmp_path / "home")},
    )
    assert r.returncode == 2 and "--device cuda" in r.stderr and "no CUDA GPU" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()  # no folder, no server, no MLflow run


def test_train_a_task_mix_holds_the_shares_in_every_batch(tmp_path):
    args = ("--group-size", "2", "--batch-groups", "4", "--concurrency", "8", "--no-mlflow")
    _, out = swarm_train(tmp_path, *args, task="arith=0.75+guess=0.25")
    summary = json.loads((out / "summary.json").read_text())
    for step in run_metrics(out):  # the server's quotas: 3 arith groups and 1 guess group per batch
        assert (step["episodes/arith"], step["episodes/guess"]) == (6, 2), step
        assert 0.0 <= step["reward_mean/arith"] <= 1.0 and 0.0 <= step["reward_mean/guess"] <= 1.0
    assert set(summary["families"]) == {"arith", "guess"}
    assert (out / "logs" / "client-arith-0.log").is_file() and (out / "logs" / "client-guess-0.log").is_file()


@pytest.mark.parametrize(
    "task,message",
    [
        ("arith+arith", "appears twice"),
        ("arith=1+guess", "share for every"),
        ("arith=0+guess=1", "positive"),
        ("arith+nope", "unknown task 'nope'"),
    ],
)
def test_train_rejects_a_bad_mix(task, message):
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "train", "--task", task], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_train_shared_base_trains_each_role_as_a_policy_of_one_server(tmp_path):
    """--shared-base: duet's planner and executor are LoRA policies of one server, played as team episodes."""
    out = _train_arith(
        tmp_path, "--shared-base", "--group-size", "2", "--batch-groups", "1", "--concurrency", "4", task="duet"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"planner", "executor"}
    assert summary["steps_done"] == 2 and all(p["steps_done"] >= 2 for p in summary["policies"].values())
    for role in ("planner", "executor"):
        rows = [json.loads(x) for x in (out / summary["metrics"][role]).read_text().splitlines()]
        assert [r["step"] for r in rows][:2] == [1, 2]
        assert rows[0]["episodes"] == 2  # one episode per team, one group of 2 per step
        ckpt = json.loads(
            (out / "server" / "policies" / role / "checkpoints" / "latest" / "engine_state.json").read_text()
        )
        assert ckpt["policy"] == role and ckpt["lora"]["rank"] == 8  # the default rank of --shared-base
    served = (out / "server.yaml").read_text()
    assert "planner" in served and "executor" in served
    assert json.loads((out / "server" / "server.json").read_text())["policies"] == ["planner", "executor"]
    # `swarm eval` of the run: both roles' LoRA checkpoints (merged into the base) play duet together
    rows = eval_team_run(out, tmp_path / "eval.json")
    assert {r["role"]: r["model"] for r in rows if r["model_role"] == "trained"} == {
        role: str((out / "server" / "policies" / role / "checkpoints" / "latest").resolve())
        for role in ("planner", "executor")
    }
