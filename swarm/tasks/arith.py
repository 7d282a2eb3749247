"""`arith`: single-turn arithmetic with an exact-match reward.

A two-digit number plus a one-digit number ("What is 47+8?" -> "55"): answers
are two or three digit tokens, so an episode is one short call. The difficulty
is what the embedded 1M-parameter model learns reliably (every seed) in its
one-minute warm start; harder sums (two digits + two digits) are learned by
some seeds and not others in that budget. After the warm start the model
answers almost all of them greedily but only about a quarter when sampling at
temperature 1: the gap GRPO closes in minutes on a CPU. `OPS`/`B_RANGE` widen
the task (subtraction is supported) for bigger models.
"""

from __future__ import annotations

import random

from swarm.tasks.base import Task, completion_text

A_RANGE = (10, 99)
B_RANGE = (1, 9)
OPS = ("+",)
MAX_TOKENS = 8


def _problem(rng: random.Random) -> tuple[int, str, int, int]:
    op = rng.choice(OPS)
    a = rng.randint(*A_RANGE)
    b = rng.randint(B_RANGE[0], min(a, B_RANGE[1]) if op == "-" else B_RANGE[1])
    answer = a + b if op == "+" else a - b
    return a, op, b, answer


def question(a: int, op: str, b: int) -> str:
    return f"What is {a}{op}{b}?"


def dataset(seed: int, size: int) -> list[dict]:
    rng = random.Random(f"arith:{seed}")
    out = []
    for i in range(size):
        a, op, b, answer = _problem(rng)
        out.append({"task_id": f"arith-{seed}-{i}", "question": question(a, op, b), "answer": str(answer)})
    return out


def reward(completion: str, answer: str) -> float:
    """1.0 when the completion, stripped of whitespace, is exactly the answer."""
    return 1.0 if completion.strip() == answer else 0.0


def workflow(task: dict, episode) -> float | list[float]:
    """One call, one exact-match check. Written as a user would, with the plain client.

    When the fleet samples a group in one call (`episode.choices` k > 1, `swarm train
    --group-call`), the call asks for `n=k` and each choice gets its own reward.
    """
    k = getattr(episode, "choices", 1)
    response = episode.openai.chat.completions.create(
        model=episode.model,
        messages=[{"role": "user", "content": task["question"]}],
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        **({"n": k} if k > 1 else {}),
    )
    if k > 1:
        return [reward(c.message.content or "", task["answer"]) for c in response.choices]
    return reward(completion_text(response), task["answer"])


def _near_miss(answer: int, rng: random.Random) -> int:
    """A plausible wrong answer (an off-by-a-little or wrong-tens-digit slip)."""
    wrong = answer + rng.choice((-10, -2, -1, 1, 2, 10))
    return wrong if wrong >= 0 else answer + 1


def transcripts(seed: int, size: int, noise: float = 0.0) -> list[list[dict]]:
    """Warm-start conversations; with probability `noise` the answer is a near miss.

    The noise is deliberate: it keeps the warm-started policy's sampling entropy
    high while its most likely answer stays right, leaving RL something to sharpen.
    """
    rng = random.Random(f"arith-transcripts:{seed}")
    out = []
    for _ in range(size):
        a, op, b, answer = _problem(rng)
        said = _near_miss(answer, rng) if rng.random() < noise else answer
        out.append([{"role": "user", "content": question(a, op, b)}, {"role": "assistant", "content": str(said)}])
    return out


TASK = Task(
    name="arith",
    family="arith",
    description="single-turn two-digit addition/subtraction, exact match",
    dataset=dataset,
    workflow=workflow,
    transcripts=transcripts,
    group_call=True,
)
