"""The researcher reads a trial's `summary.json` as `swarm train` writes it: the per-step rows
come from the metrics file the summary names (`metrics`), not from a copy inside it."""

from __future__ import annotations

import json
from pathlib import Path

from researcher.trials import read_summary, step_rewards


def test_read_summary_follows_the_metrics_file(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    rows = [{"step": 1, "reward_mean": 0.25, "loss": 0.1}, {"step": 2, "reward_mean": 0.5, "loss": 0.0}]
    (tmp_path / "server" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew'
    )  # a torn last line is skipped
    (tmp_path / "summary.json").write_text(
        json.dumps({"metrics": "server/metrics.jsonl", "steps_done": 2, "wall_s": 1.0})
    )
    summary = read_summary(tmp_path)
    assert summary is not None and summary["steps"] == rows
    assert step_rewards(summary) == ([1.0, 2.0], [0.25, 0.5])
    # the older shape (a trial program writing its rows inline) still reads as it did
    (tmp_path / "summary.json").write_text(json.dumps({"steps": rows[:1]}))
    assert read_summary(tmp_path)["steps"] == rows[:1]
    # a summary naming a metrics file that is not there: no summary yet
    (tmp_path / "summary.json").write_text(json.dumps({"metrics": "server/none.jsonl"}))
    assert read_summary(tmp_path) is None
