"""A single-turn agent written with nothing but the plain OpenAI client.

Copy this file, change the prompt and the reward, and train on it:

    swarm model init                                  # the embedded tiny model (once)
    swarm serve --token secret &                      # a swarm server that trains it
    swarm client --token secret --workflow examples.arith_openai:workflow --n 8 -c 8

`swarm client` takes the tasks from `dataset(seed, size)` beside the workflow,
claims an episode per task and attempt, hands `workflow` an episode whose
`.openai` is an `openai.OpenAI` already pointed at the server (and `.model` the
name to ask for), and reports the returned reward. Nothing here knows about RL:
the same function runs against any OpenAI-compatible endpoint. `python -m
examples.arith_openai --url ... --token ...` does the same from Python.
"""

from __future__ import annotations

import argparse
import random


def dataset(seed: int, size: int) -> list[dict]:
    """Problems with a unique `task_id` each: the server groups attempts by it."""
    rng = random.Random(f"arith:{seed}")
    items = []
    for i in range(size):
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        items.append({"task_id": f"arith-{seed}-{i}", "question": f"What is {a}+{b}?",
                      "answer": str(a + b)})
    return items


def workflow(task: dict, episode) -> float:
    """Ask once; reward 1.0 for exactly the right number, else 0.0."""
    response = episode.openai.chat.completions.create(
        model=episode.model,
        messages=[{"role": "user", "content": task["question"]}],
        max_tokens=8,
        temperature=1.0,  # sample: RL learns from the spread of a group's answers
    )
    answer = (response.choices[0].message.content or "").strip()
    return 1.0 if answer == task["answer"] else 0.0


def main() -> None:
    from swarm.client import SwarmClient, run_fleet  # here: workflow and dataset above run without swarm

    parser = argparse.ArgumentParser(description="run the arith workflow through a swarm server")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", required=True)
    parser.add_argument("--size", type=int, default=64, help="tasks in the dataset")
    parser.add_argument("-n", type=int, default=8, help="attempts per task (the group size)")
    args = parser.parse_args()
    with SwarmClient(args.url, args.token) as client:
        stats = run_fleet(client, workflow, dataset(0, args.size), n=args.n, concurrency=8,
                          epochs=1, task_family="arith")
    print(f"{stats.finished} episodes, mean reward {stats.reward_mean:.3f}")


if __name__ == "__main__":
    main()
