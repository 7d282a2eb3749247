"""`guess`: a multi-turn game with environment feedback.

The environment picks a secret integer in LOW..HIGH; the model guesses, the
environment answers "Higher." or "Lower." as the next user message, and the
whole conversation so far is sent again each turn (so consecutive calls share a
token prefix: the case timeline merging exploits). Found within `OPT_TURNS`
(what binary search needs at worst) earns 1.0, each later turn costs 0.15,
running out of `MAX_TURNS` earns 0. An unparsable or out-of-range reply wastes
a turn.
"""

from __future__ import annotations

import random
import re

from swarm.tasks.base import Task, completion_text

LOW, HIGH = 1, 16
MAX_TURNS = 8
OPT_TURNS = (HIGH - LOW + 1).bit_length()  # 5 for 1..16: binary search's worst case
MAX_TOKENS = 6
_NUMBER = re.compile(r"\s*(\d{1,3})\s*")


def intro() -> str:
    return f"Guess my number from {LOW} to {HIGH}."


INVALID = f"Say a number from {LOW} to {HIGH}."


def feedback(guess: int, secret: int) -> str:
    return "Higher." if guess < secret else "Lower."


def parse_guess(text: str) -> int | None:
    m = _NUMBER.fullmatch(text)
    if not m:
        return None
    value = int(m.group(1))
    return value if LOW <= value <= HIGH else None


def turn_reward(turn: int) -> float:
    """Reward for finding the secret on `turn` (1-based); stays in [0, 1]."""
    if turn > MAX_TURNS:
        return 0.0
    return max(0.0, 1.0 - 0.15 * max(0, turn - OPT_TURNS))


def dataset(seed: int, size: int) -> list[dict]:
    rng = random.Random(f"guess:{seed}")
    return [{"task_id": f"guess-{seed}-{i}", "secret": rng.randint(LOW, HIGH)} for i in range(size)]


def workflow(task: dict, episode) -> float:
    """Play one game with the plain OpenAI client, re-sending the full history each turn."""
    secret = int(task["secret"])
    messages = [{"role": "user", "content": intro()}]
    for turn in range(1, MAX_TURNS + 1):
        response = episode.openai.chat.completions.create(
            model=episode.model, messages=messages, max_tokens=MAX_TOKENS, temperature=1.0
        )
        text = completion_text(response)
        guess = parse_guess(text)
        if guess == secret:
            return turn_reward(turn)
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": INVALID if guess is None else feedback(guess, secret)})
    return 0.0


def play(secret: int, rng: random.Random, noise: float = 0.0) -> list[dict]:
    """One game by binary search; with probability `noise` a turn's guess is any
    number still consistent with the feedback instead of the midpoint."""
    lo, hi = LOW, HIGH
    messages = [{"role": "user", "content": intro()}]
    for _ in range(MAX_TURNS):
        guess = rng.randint(lo, hi) if rng.random() < noise else (lo + hi) // 2
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            break
        messages.append({"role": "user", "content": feedback(guess, secret)})
        lo, hi = (guess + 1, hi) if guess < secret else (lo, guess - 1)
    return messages


def transcripts(seed: int, size: int, noise: float = 0.0) -> list[list[dict]]:
    rng = random.Random(f"guess-transcripts:{seed}")
    return [play(rng.randint(LOW, HIGH), rng, noise) for _ in range(size)]


TASK = Task(
    name="guess",
    family="guess",
    description=f"multi-turn: find a secret number in {LOW}..{HIGH} from higher/lower feedback",
    dataset=dataset,
    workflow=workflow,
    transcripts=transcripts,
)
