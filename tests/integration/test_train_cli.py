"""`swarm train` end to end: real server and client processes over loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swarm.model.build import build_untrained

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_train_writes_summary_and_cleans_up(tmp_path):
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "swarm", "train", "--task", "arith", "--model", str(model),
                        "--steps", "2", "--group-size", "2", "--batch-groups", "2", "--concurrency", "4",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [1, 2]
    assert all(0.0 <= s["reward_mean"] <= 1.0 for s in summary["steps"])
    assert summary["reward_first"] is not None and summary["reward_last"] is not None and summary["wall_s"] > 0
    assert summary["steps"][0]["episodes"] == 4
    # every process it started is gone: the server wrote its pid
    pid = json.loads((out / "server" / "server.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_train_rejects_bad_input(tmp_path):
    r = subprocess.run([sys.executable, "-m", "swarm", "train", "--task", "nope"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "unknown task 'nope'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "swarm", "train", "--model", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "config.json" in r.stderr
