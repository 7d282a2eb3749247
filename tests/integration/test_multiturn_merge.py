"""The multi-turn task trains end to end through merged samples (real server + client)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from train_runs import SMALL, swarm_train  # tests/kit, on sys.path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_guess_trains_through_merged_samples(tmp_path):
    _, out = swarm_train(tmp_path, *SMALL, "--no-mlflow", task="guess", timeout=600)
    model, env = tmp_path / "model", {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    rows = [json.loads(line) for line in (out / "server" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["calls"] >= 4 * row["episodes"]  # multi-turn: at least 4 calls an episode
        # exact continuity merges each episode into one sample, except where the random untrained model
        # emits special tokens that the echoed message text drops (history rewritten: no prefix, split)
        assert row["episodes"] <= row["samples"] < row["calls"] / 2
        assert row["merge_ratio"] >= 2
        assert row["tokens_unmerged"] > row["tokens"]
    # the rollout log lets `swarm inspect` show an episode after the fact
    html = tmp_path / "ep.html"
    r = subprocess.run(
        [sys.executable, "-m", "swarm", "inspect", str(out / "server"), "--model", str(model), "--html", str(html)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "samples" in r.stdout and html.read_text().startswith("<!doctype html>")
