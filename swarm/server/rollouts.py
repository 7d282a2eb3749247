"""The rollout log: `OUT/rollouts.jsonl`, one JSON line per finished episode, its calls as token ids.

The durable buffer (`buffer.py`) compacts trained rows' token ids away at each checkpoint, so this
file is the token-level record of every episode, for `swarm inspect` (`swarm/inspect.py` reads it)
and for the people debugging a run. It is appended after the buffer's commit: a kill -9 between
the two loses a line, never a trained row. A failed write is logged, never an error for the client
(`log_rollouts` turns it off).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from swarm.protocol import FinishRequest
from swarm.server.episodes import Episode

log = logging.getLogger("swarm.server")
ROLLOUTS = "rollouts.jsonl"


class RolloutLog:
    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / ROLLOUTS

    def append(self, ep: Episode, req: FinishRequest, model_dir: Path) -> None:
        record = {
            "episode_id": ep.id,
            "task_id": ep.task_id,
            "task_family": ep.task_family,
            "group_id": ep.group_id,
            "reward": req.reward,
            "agent_rewards": req.agent_rewards,
            "choice_rewards": req.choice_rewards,
            "status": req.status,
            "metrics": req.metrics,
            "policy_version": ep.policy_version,
            "model_dir": str(model_dir),
            "created_at": ep.created_at,
            "finished_at": time.time(),
            "calls": [dataclasses.asdict(c) for c in ep.calls],
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError:
            log.exception("could not append to %s", ROLLOUTS)


__all__ = ["ROLLOUTS", "RolloutLog"]
