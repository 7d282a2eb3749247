"""`duet`: a two-role task for multi-model training (a planner model and an executor model).

The planner reads a worded arithmetic problem ("Subtract 8 from 47.") and must
rewrite it as the question the executor understands ("What is 47-8?"); the
executor sees only the planner's text and answers with a number. Rewards per role:

    executor = 1.0 when its answer is right for the question it was given, else 0.0
    planner  = 0.5 when its rewrite is a well-formed question with the right value
             + 0.5 when the executor's answer solves the problem (a good plan is one
               the executor can use)

Each role is rewarded for its own part: the executor for answering what it was
asked (a wrong plan is the planner's fault, not the executor's), the planner for
the plan and for the team's result. Rewarding the executor only for the problem's
answer left it no signal on most episodes while the planner was still poor
(measured: 150 steps, executor flat at 0.07 while the planner rose 0.12 -> 0.21).

The executor's input is exactly the `arith` format, so an embedded model
warm-started on `arith` starts above zero as the executor. The planner's rewrite is
in the embedded model's warm start too (`transcripts`: the planner's turn, a wrong
number or operator in `noise` of them), as every built-in task's first skill is:
without it the planner never samples a well-formed question, neither role ever sees
a reward, and neither learns (measured: 300 steps, both rewards at 0). Played with
two servers (one model per role) through `TeamClient`, with one server of two
policies (`swarm train --task duet --shared-base`), or with one server for both
roles (calls tagged with the `X-Roost-Agent` header, per-role rewards as
`agent_rewards`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from swarm.tasks.arith import dataset as _arith_dataset
from swarm.tasks.base import Task, completion_text

PLANNER, EXECUTOR = "planner", "executor"
ROLES = (PLANNER, EXECUTOR)
PLAN_TOKENS = 16
ANSWER_TOKENS = 8
_QUESTION = re.compile(r"\s*What is (\d{1,4})\s*([+-])\s*(\d{1,4})\?\s*")
_WORDED = {
    "+": ("Add {b} to {a}.", "What is {a} plus {b}?", "Sum {a} and {b}."),
    "-": ("Subtract {b} from {a}.", "What is {a} minus {b}?", "Take {b} away from {a}."),
}


def planner_prompt(problem: str) -> str:
    return f"Rewrite as a question: {problem}"


def dataset(seed: int, size: int) -> list[dict]:
    """Prefix-stable: item i depends only on (seed, i)."""
    out = []
    for i, item in enumerate(_arith_dataset(seed, size)):
        a, op, b = _QUESTION.fullmatch(item["question"]).groups()  # type: ignore[union-attr]
        template = random.Random(f"duet:{seed}:{i}").choice(_WORDED[op])
        out.append(
            {
                "task_id": f"duet-{seed}-{i}",
                "problem": template.format(a=a, b=b),
                "question": item["question"],
                "answer": item["answer"],
            }
        )
    return out


def question_value(text: str) -> int | None:
    """The value of a well-formed "What is A+B?" / "What is A-B?" question, else None."""
    m = _QUESTION.fullmatch(text)
    if not m:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return a + b if op == "+" else a - b


def rewards(plan: str, reply: str, answer: str) -> dict[str, float]:
    """Each role's reward (see the module docstring): the executor's for answering the plan it got."""
    value = question_value(plan.strip())
    executor = 1.0 if value is not None and reply.strip() == str(value) else 0.0
    planned = 1.0 if value == int(answer) else 0.0
    solved = 1.0 if reply.strip() == answer else 0.0
    return {PLANNER: 0.5 * planned + 0.5 * solved, EXECUTOR: executor}


def play(task: dict, planner: Any, planner_model: str, executor: Any, executor_model: str) -> dict[str, float]:
    """The game itself, against two plain `openai.OpenAI` clients (they may be the same server)."""
    plan = completion_text(
        planner.chat.completions.create(
            model=planner_model,
            messages=[{"role": "user", "content": planner_prompt(task["problem"])}],
            max_tokens=PLAN_TOKENS,
            temperature=1.0,
        )
    )
    reply = completion_text(
        executor.chat.completions.create(
            model=executor_model,
            messages=[{"role": "user", "content": plan.strip() or "?"}],
            max_tokens=ANSWER_TOKENS,
            temperature=1.0,
        )
    )
    return rewards(plan, reply, task["answer"])


def team_workflow(task: dict, team: Any) -> dict[str, float]:
    """Two models: `team[role]` has `.openai` and `.model` (a `TeamEpisode`, or a dict of episodes)."""
    p, e = team[PLANNER], team[EXECUTOR]
    return play(task, p.openai, p.model, e.openai, e.model)


def workflow(task: dict, episode: Any) -> Any:
    """Team episode -> {role: reward}. One episode -> both roles on one server, tagged per agent;
    it finishes the episode itself with per-role `agent_rewards` (returns None) when it can,
    else returns the mean reward."""
    if isinstance(episode, Mapping) or hasattr(episode, "episodes"):
        return team_workflow(task, episode)
    tagged = callable(getattr(episode, "openai_client", None))
    planner = episode.openai_client(agent=PLANNER) if tagged else episode.openai
    executor = episode.openai_client(agent=EXECUTOR) if tagged else episode.openai
    per_role = play(task, planner, episode.model, executor, episode.model)
    mean = sum(per_role.values()) / len(per_role)
    if callable(getattr(episode, "finish", None)) and not getattr(episode, "done", False):
        episode.finish(mean, agent_rewards=per_role)
        return None
    return mean


def transcripts(seed: int, size: int, noise: float = 0.0) -> list[list[dict]]:
    """The planner's turn, for the warm start: the worded problem -> its question; with probability
    `noise` the question is wrong (an operand off by a few, or the other operator), so the planner
    samples a usable plan only part of the time and RL has room (the executor's format is arith's)."""
    rng = random.Random(f"duet-transcripts:{seed}")
    out = []
    for item in dataset(seed, size):
        a, op, b = _QUESTION.fullmatch(item["question"]).groups()  # type: ignore[union-attr]
        if rng.random() < noise:
            if rng.random() < 0.3:
                op = "-" if op == "+" else "+"
            elif rng.random() < 0.5:
                a = str(max(0, int(a) + rng.choice([-3, -2, -1, 1, 2, 3])))
            else:
                b = str(max(0, int(b) + rng.choice([-3, -2, -1, 1, 2, 3])))
        out.append(
            [
                {"role": "user", "content": planner_prompt(item["problem"])},
                {"role": "assistant", "content": f"What is {a}{op}{b}?"},
            ]
        )
    return out


TASK = Task(
    name="duet",
    family="duet",
    description="two roles: a planner rewrites a worded sum, an executor answers it",
    dataset=dataset,
    workflow=workflow,
    transcripts=transcripts,
    roles=ROLES,
)
