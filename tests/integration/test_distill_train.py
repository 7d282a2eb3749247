"""`swarm train --teacher` end to end on the tiny model: a local teacher scores every trained token in
the server (each step's metrics row carries `distill_kl`), and a teacher URL that returns no prompt
logprobs is refused before anything starts, in one line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.config.server import ServerConfig
from swarm.engine.fake import FakeEngine
from swarm.model.build import build_untrained
from swarm.testing import running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "ROOST_TEACHER_API_KEY": "worker-token"}
    cmd = [sys.executable, "-m", "swarm", "train", "--task", "arith", "--group-size", "2", "--batch-groups", "2"]
    cmd += ["--concurrency", "4", "--no-mlflow", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_a_local_teacher_scores_the_student_tokens_in_every_step(tmp_path: Path) -> None:
    """The teacher is the student's own initial model: at step 1 (before any update) its logprobs of
    the sampled tokens are the rollout logprobs, so the reverse KL is 0 up to kernel noise; an
    off-by-one position or another model would make it of order 1. (`--distill-mode full` through the
    server's trainer: tests/server/test_distill_teacher.py, in process.)"""
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    r = _train(
        tmp_path, "--model", str(model), "--teacher", str(model), "--distill-coef", "1", "--reward-coef", "0",
        "--steps", "3", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in (out / "server" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(math.isfinite(row["distill_kl"]) and row["distill_tokens"] > 0 for row in rows)
    assert abs(rows[0]["distill_kl"]) < 1e-3, rows[0]["distill_kl"]
    assert rows[0]["adv_abs_mean"] == 0.0  # --reward-coef 0: the group advantage is off


def test_a_teacher_url_without_prompt_logprobs_is_refused_before_anything_starts(tmp_path: Path) -> None:
    model = build_untrained(tmp_path / "model", seed=0)
    config = ServerConfig(engine="fake", model_dir=model, out_dir=tmp_path / "teacher", token="worker-token")
    out = tmp_path / "run"
    with running_server(config, FakeEngine(model)) as srv:  # the fake engine cannot score a prompt: no echo
        r = _train(
            tmp_path, "--model", str(model), "--teacher", srv.url, "--distill-coef", "1", "--steps", "1",
            "--out", str(out),
        )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if "--teacher" in line]
    assert len(lines) == 1 and "prompt logprobs" in lines[0], r.stderr
    assert not out.exists()  # nothing started: no run folder, no server

    full = _train(
        tmp_path, "--model", str(model), "--teacher", "http://127.0.0.1:9/v1", "--distill-coef", "1",
        "--distill-mode", "full", "--steps", "1", "--out", str(out),
    )  # fmt: skip
    assert full.returncode == 2 and "local teacher" in full.stderr, full.stdout + full.stderr
    assert not out.exists()
    sharper = _train(
        tmp_path, "--model", str(model), "--teacher", "http://127.0.0.1:9/v1", "--distill-coef", "1",
        "--teacher-temperature", "0.7", "--steps", "1", "--out", str(out),
    )  # fmt: skip
    assert sharper.returncode == 2 and "--teacher-temperature" in sharper.stderr, sharper.stdout + sharper.stderr
    assert "local teacher" in sharper.stderr and not out.exists()
