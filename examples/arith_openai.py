"""A single-turn agent written with nothing but the plain OpenAI client.

Copy this file, change the prompt and the reward, and train on it:

    swarm model init                                  # the embedded tiny model (once)
    swarm serve --token secret &                      # a swarm server that trains it
    swarm client --token secret --workflow examples.arith_openai:workflow --n 8 -c 8   # until Ctrl-C
    # (--epochs 1: one pass over the dataset and it exits)

`swarm client` takes the tasks from `dataset(seed, size)` beside the workflow,
claims an episode per task and attempt, hands `workflow` an episode whose
`.openai` is an `openai.OpenAI` already pointed at the server (and `.model` the
name to ask for), and reports the returned reward. Nothing here knows about RL:
the same function runs against any OpenAI-compatible endpoint. `python -m
examples.arith_openai --url ... --token ...` does the same from Python.
"""

from __future__ import annotations

import random


def dataset(seed: int, size: int) -> list[dict]:
    """Problems with a unique `task_id` each: the server groups attempts by it."""
    rng = random.Random(f"arith:{seed}")
    items = []
    for i in range(size):
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        items.append({"task_id": f"arith-{seed}-{i}", "question": f"What is {a}+{b}?", "answer": str(a + b)})
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
    try:  # the shared command line: `python -m examples.X` or `python examples/X.py`
        from examples._run import run_example
    except ImportError:
        from _run import run_example

    run_example(workflow, dataset, "arith")


if __name__ == "__main__":
    main()
