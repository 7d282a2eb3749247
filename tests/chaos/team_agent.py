"""A team workflow for the team chaos test (imported by module path, not a test): duet's game, finished
here so that each member's acknowledged finish is logged to `$CHAOS_ACK_LOG` (one JSON line per role,
O_APPEND) before the fleet sees it. `ROLES` beside it is how `swarm train --team` knows its roles."""

from __future__ import annotations

import json
import os
from typing import Any

from swarm.tasks import duet

ROLES = duet.ROLES


def dataset(seed: int, size: int) -> list[dict]:
    return duet.dataset(seed, size)


def play(task: dict, team: Any) -> None:
    results = team.finish(duet.team_workflow(task, team))
    lines = "".join(json.dumps({"role": role, "episode_id": r.episode_id}) + "\n" for role, r in results.items())
    fd = os.open(os.environ["CHAOS_ACK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)
