"""The agent the chaos test's `swarm client` processes run (imported by module path, not a test).

Every prompt carries a marker naming the process and the lease epoch of the key it
holds, `[pid=P epoch=E ep=ID]`, so the test can prove from the trained tokens that
no call of a fenced (stale-epoch) holder ever trained. After an acknowledged
finish the episode id is appended to `$CHAOS_ACK_LOG` (one JSON line, O_APPEND).
`$CHAOS_TURN_S` ("lo,hi", default "0.05,0.25") is the agent's think time after each
call: the fault matrix lengthens it so that a fault lands mid-episode.
"""

from __future__ import annotations

import json
import os
import random
import time


def dataset(seed: int, size: int) -> list[dict]:
    return [{"task_id": f"c{seed}-{i}"} for i in range(size)]


def play(task: dict, episode) -> None:
    epoch = episode.api_key.split(".")[2]
    marker = f"[pid={os.getpid()} epoch={epoch} ep={episode.id}]"
    rng = random.Random()
    lo, hi = (float(x) for x in os.environ.get("CHAOS_TURN_S", "0.05,0.25").split(","))
    for turn in range(rng.randint(1, 3)):
        episode.openai.chat.completions.create(
            model=episode.model,
            max_tokens=6,
            messages=[{"role": "user", "content": f"{marker} turn {turn} of {task['task_id']}"}],
        )
        time.sleep(rng.uniform(lo, hi))
    result = episode.finish(rng.random())
    line = (
        json.dumps(
            {
                "episode_id": result.episode_id,
                "pid": os.getpid(),
                "epoch": int(epoch),
                "task_id": task["task_id"],
                "group_id": result.group_id,
                "time": time.time(),
            }
        )
        + "\n"
    )
    fd = os.open(os.environ["CHAOS_ACK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
