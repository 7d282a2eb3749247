"""A multi-turn agent with environment feedback, written with the plain OpenAI client.

    swarm client --token secret --workflow examples.guess_openai:workflow --n 8 -c 8

The environment thinks of a number; each turn the model guesses and the
environment answers "Higher." or "Lower." as the next user message. The whole
conversation is sent again every turn, as any chat agent does; the swarm server
notices that each call extends the previous one token for token and trains the
episode as one merged sequence. Reward: 1.0 if found within 5 guesses, 0.15 less
for each later one, 0.0 after 8. A reply that is not a number in range wastes a
turn. `python -m examples.guess_openai --url ... --token ...` runs it from Python.
"""

from __future__ import annotations

import argparse
import random

LOW, HIGH, MAX_TURNS, FREE_TURNS = 1, 16, 8, 5


def dataset(seed: int, size: int) -> list[dict]:
    rng = random.Random(f"guess:{seed}")
    return [{"task_id": f"guess-{seed}-{i}", "secret": rng.randint(LOW, HIGH)}
            for i in range(size)]


def workflow(task: dict, episode) -> float:
    secret = task["secret"]
    messages = [{"role": "user", "content": f"Guess my number from {LOW} to {HIGH}."}]
    for turn in range(1, MAX_TURNS + 1):
        response = episode.openai.chat.completions.create(
            model=episode.model, messages=messages, max_tokens=6, temperature=1.0)
        text = response.choices[0].message.content or ""
        try:
            guess = int(text.strip())
        except ValueError:
            guess = None
        if guess == secret:
            return max(0.0, 1.0 - 0.15 * max(0, turn - FREE_TURNS))
        if guess is None or not LOW <= guess <= HIGH:
            feedback = f"Say a number from {LOW} to {HIGH}."
        else:
            feedback = "Higher." if guess < secret else "Lower."
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": feedback}]
    return 0.0


def main() -> None:
    from swarm.client import SwarmClient, run_fleet  # here: workflow and dataset above run without swarm

    parser = argparse.ArgumentParser(description="run the guess workflow through a swarm server")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", required=True)
    parser.add_argument("--size", type=int, default=64, help="tasks in the dataset")
    parser.add_argument("-n", type=int, default=8, help="attempts per task (the group size)")
    args = parser.parse_args()
    with SwarmClient(args.url, args.token) as client:
        stats = run_fleet(client, workflow, dataset(0, args.size), n=args.n, concurrency=8,
                          epochs=1, task_family="guess")
    print(f"{stats.finished} episodes, mean reward {stats.reward_mean:.3f}")


if __name__ == "__main__":
    main()
