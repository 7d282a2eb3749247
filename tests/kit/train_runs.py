"""`swarm train` as the integration tests run it: a real command in a subprocess, on an untrained model,
under its own ROOST_HOME, with the small batches that keep a run to seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from swarm.model.build import build_untrained

#: two groups of two, four episodes in flight: a step in well under a second on the embedded model's shape
SMALL = ("--group-size", "2", "--batch-groups", "2", "--concurrency", "4")


def swarm_train(
    tmp: Path, *args: str, task: str = "arith", steps: int = 2, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`swarm train --task TASK --model tmp/model --steps STEPS ARGS --out tmp/run` (the model built
    untrained, ROOST_HOME tmp/home), checked to exit 0: (the process, the run folder). `ARGS` come after
    the defaults, so they win (the last value of an option counts)."""
    model = build_untrained(tmp / "model", seed=0)
    out = tmp / "run"
    cmd = [sys.executable, "-m", "swarm", "train", "--task", task, "--model", str(model), "--steps", str(steps)]
    r = subprocess.run(
        [*cmd, *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "ROOST_HOME": str(tmp / "home")},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r, out


def run_metrics(out: Path) -> list[dict]:
    """A run's metrics rows (summary.json names the file; it holds no copy of them)."""
    summary = json.loads((out / "summary.json").read_text())
    return [json.loads(line) for line in (out / summary["metrics"]).read_text().splitlines()]
