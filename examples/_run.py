"""The command line every example shares: run its workflow through a swarm server as a small fleet.

    python examples/arith_openai.py [--token TOKEN] [--url URL] [--size 64] [-n 8]

Kept out of the example files so each of them is only what a user copies: the dataset and the
workflow, written against the plain OpenAI client. Without --token the client reads ROOST_TOKEN.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def run_example(
    workflow: Callable[[dict, Any], float], dataset: Callable[[int, int], list[dict]], task_family: str
) -> None:
    from swarm.client import SwarmClient, run_fleet  # here: the examples' workflows import without swarm

    parser = argparse.ArgumentParser(description=f"run the {task_family} workflow through a swarm server")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default=None, help="the server's --token (default: $ROOST_TOKEN)")
    parser.add_argument("--size", type=int, default=64, help="tasks in the dataset")
    parser.add_argument("-n", type=int, default=8, help="attempts per task (the group size)")
    args = parser.parse_args()
    with SwarmClient(args.url, args.token) as client:
        stats = run_fleet(
            client, workflow, dataset(0, args.size), n=args.n, concurrency=8, epochs=1, task_family=task_family
        )
    print(f"{stats.finished} episodes, mean reward {stats.reward_mean:.3f}")
