"""`swarm eval` of a team run, in process, as the team training tests check it (tests/integration)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

ROLES = ("planner", "executor")


def eval_team_run(out: Path, json_out: Path) -> list[dict]:
    """`swarm eval --model OUT` (greedy, 2 problems): its rows, each role of duet beside the initial team."""
    from swarm.cli import app  # the test process imports the CLI only when a test gets here

    r = CliRunner().invoke(app, ["eval", "--model", str(out), "--n", "2", "-t", "0", "--json", str(json_out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(json_out.read_text())
    assert sorted((row["model_role"], row["task"]) for row in rows) == sorted(
        (kind, f"duet ({role})") for kind in ("initial", "trained") for role in ROLES
    )
    return rows
