"""A multi-turn agent with environment feedback, written with the plain OpenAI client.

    swarm client --token secret --workflow examples.guess_openai:workflow --n 8 -c 8   # until Ctrl-C
    # (--epochs 1: one pass over the dataset and it exits)

The environment thinks of a number; each turn the model guesses and the
environment answers "Higher." or "Lower." as the next user message. The whole
conversation is sent again every turn, as any chat agent does; the swarm server
notices that each call extends the previous one token for token and trains the
episode as one merged sequence. Reward: 1.0 if found within 5 guesses, 0.15 less
for each later one, 0.0 after 8. A reply that is not a number in range wastes a
turn. `python -m examples.guess_openai --url ... --token ...` runs it from Python.
"""

from __future__ import annotations

import random

LOW, HIGH, MAX_TURNS, FREE_TURNS = 1, 16, 8, 5


def dataset(seed: int, size: int) -> list[dict]:
    rng = random.Random(f"guess:{seed}")
    return [{"task_id": f"guess-{seed}-{i}", "secret": rng.randint(LOW, HIGH)} for i in range(size)]


def workflow(task: dict, episode) -> float:
    secret = task["secret"]
    messages = [{"role": "user", "content": f"Guess my number from {LOW} to {HIGH}."}]
    for turn in range(1, MAX_TURNS + 1):
        response = episode.openai.chat.completions.create(
            model=episode.model, messages=messages, max_tokens=6, temperature=1.0
        )
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
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": feedback}]
    return 0.0


def main() -> None:
    try:  # the shared command line: `python -m examples.X` or `python examples/X.py`
        from examples._run import run_example
    except ImportError:
        from _run import run_example

    run_example(workflow, dataset, "guess")


if __name__ == "__main__":
    main()
