"""`swarm train --engine vllm`: the real CLI, server, client fleet and vLLM processes, end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from swarm.model.build import build_untrained

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_swarm_train_with_the_vllm_engine(vllm_python, tmp_path):
    model = build_untrained(tmp_path / "model", seed=0)
    out = tmp_path / "run"
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home")}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarm",
            "train",
            "--engine",
            "vllm",
            "--vllm-python",
            str(vllm_python),
            "--task",
            "arith",
            "--model",
            str(model),
            "--steps",
            "2",
            "--group-size",
            "2",
            "--batch-groups",
            "2",
            "--concurrency",
            "4",
            "--no-mlflow",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    log = (out / "logs" / "server.log").read_text() if (out / "logs" / "server.log").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / summary["metrics"]).read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and summary["steps_done"] == 2
    # every step's weights reached vLLM before the next step's generation
    assert [row["vllm_served_version"] for row in rows] == [1.0, 2.0]
    assert all(row["vllm_sync_failed"] == 0 and row["vllm_restarts"] == 0 for row in rows)
    # the vLLM server the swarm server started is gone with it
    pids = [int(p) for p in re.findall(r"vLLM pid (\d+) healthy", log)]
    assert pids, log[-3000:]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
