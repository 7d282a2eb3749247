"""LLM-judge rewards for a group of trajectories, scored together against a rubric (RULER-style).

    from swarm.rewards import Judge

    judge = Judge(base_url="http://127.0.0.1:8000/v1", api_key=token, model="judge", rubric="Correct and brief.")
    rewards = judge.group([transcript_a, transcript_b, transcript_c, transcript_d])   # -> [0.9, 0.2, 0.6, 0.6]

Why a group at once: a judge asked "how good is this one?" scores on a scale it invents afresh
each time; shown the group side by side it ranks, and a ranking is what GRPO uses anyway (the
advantage is the reward relative to the group's mean). So the judge sees every trajectory of the
group, numbered, and answers one JSON object with a score in [0, 1] per trajectory, constrained by
`response_format` (json_schema: exactly one score per trajectory), which any OpenAI-compatible
server that honours it enforces (Roost's own evaluation calls through llguidance, vLLM, hosted
APIs). The judge is any endpoint; the worker token of a `swarm serve` makes evaluation calls that
are never recorded or trained.

A judge that fails (a timeout, an HTTP error, an answer that is not the JSON asked for: a missing
or extra score, a value outside [0, 1], not a number) is asked again up to `retries` times; then
`JudgeError` says what it answered, or, when `fallback` is set, every trajectory of the group gets
`fallback` and the failure is logged. Never a silent 0 for the whole group.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("swarm.rewards")

Trajectory = str | Sequence[dict[str, Any]]  # a text, or chat messages (role, content)


class JudgeError(RuntimeError):
    """The judge gave no usable scores after every try; `answers` holds what it said each time."""

    def __init__(self, message: str, answers: list[str]) -> None:
        super().__init__(message)
        self.answers = answers


def render(trajectory: Trajectory, max_chars: int) -> str:
    """One trajectory as the judge reads it: a text as is, messages as `role: content` lines."""
    if isinstance(trajectory, str):
        text = trajectory
    else:
        text = "\n".join(f"{m.get('role', '?')}: {m.get('content') or ''}" for m in trajectory)
    return text if len(text) <= max_chars else text[: max_chars - 15] + " …[truncated]"


def schema(n: int) -> dict[str, Any]:
    """The judge's answer: exactly `n` scores in [0, 1], in the trajectories' order."""
    return {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "number", "minimum": 0, "maximum": 1},
                "minItems": n,
                "maxItems": n,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    }


def prompt(rubric: str, trajectories: Sequence[Trajectory], max_chars: int) -> list[dict[str, str]]:
    shown = "\n\n".join(f"### Trajectory {i + 1}\n{render(t, max_chars)}" for i, t in enumerate(trajectories))
    return [
        {
            "role": "system",
            "content": "You judge attempts at the same task side by side. Score each from 0 (worst) to 1 (best) "
            "against the rubric, relative to the others: better attempts get higher scores; equally good "
            f'ones equal scores. Answer only JSON: {{"scores": [one number per trajectory, in order]}}.\n\n'
            f"Rubric: {rubric}",
        },
        {"role": "user", "content": f"{len(trajectories)} trajectories:\n\n{shown}"},
    ]


def parse(text: str, n: int) -> list[float]:
    """The scores in `text`; ValueError saying what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, list):
        raise ValueError('no "scores" list')
    if len(scores) != n:
        raise ValueError(f"{len(scores)} scores for {n} trajectories")
    out = []
    for s in scores:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 <= s <= 1:
            raise ValueError(f"score {s!r} is not a number in [0, 1]")
        out.append(float(s))
    return out


@dataclass
class Judge:
    """A judge model behind an OpenAI-compatible endpoint, and how to ask it."""

    rubric: str
    model: str
    base_url: str | None = None
    api_key: str | None = None
    client: Any = None  # an `openai.OpenAI` (or anything with its chat.completions.create); made from the above
    retries: int = 2
    timeout_s: float = 60.0
    max_tokens: int = 256
    temperature: float = 0.0
    max_chars: int = 4000  # per trajectory, so a long transcript cannot push the others out of the context
    fallback: float | None = None  # every trajectory's reward when the judge fails; None: JudgeError
    answers: list[str] = field(default_factory=list, repr=False)  # the last group's raw answers

    def __post_init__(self) -> None:
        if self.client is None:
            from openai import OpenAI  # lazy: a workflow that never judges need not load it

            self.client = OpenAI(
                base_url=self.base_url, api_key=self.api_key or "none", timeout=self.timeout_s, max_retries=0
            )
        if self.fallback is not None and not 0 <= self.fallback <= 1:
            raise ValueError(f"fallback must be in [0, 1], not {self.fallback}")

    def group(self, trajectories: Sequence[Trajectory]) -> list[float]:
        """A reward in [0, 1] per trajectory, judged together."""
        n = len(trajectories)
        if n == 0:
            return []
        self.answers = []
        problems = []
        for _ in range(self.retries + 1):
            try:
                response = self.client.chat.completions.create(
                    model=self.model,
                    messages=prompt(self.rubric, trajectories, self.max_chars),
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                    response_format={"type": "json_schema", "json_schema": {"name": "scores", "schema": schema(n)}},
                )
                text = response.choices[0].message.content or ""
            except Exception as exc:  # noqa: BLE001 - any failure of the call is a failed try, said below
                problems.append(f"{type(exc).__name__}: {exc}")
                self.answers.append("")
                continue
            self.answers.append(text)
            try:
                return parse(text, n)
            except ValueError as exc:
                problems.append(f"{exc}: {text[:200]!r}")
        why = "; ".join(problems)
        if self.fallback is not None:
            log.warning("judge failed %d times (%s); every trajectory gets %s", len(problems), why, self.fallback)
            return [self.fallback] * n
        raise JudgeError(f"the judge gave no usable scores in {len(problems)} tries: {why}", self.answers)


def judge_group(trajectories: Sequence[Trajectory], rubric: str, model: str, **settings: Any) -> list[float]:
    """`Judge(rubric, model, **settings).group(trajectories)`: one group, one call (plus retries)."""
    return Judge(rubric=rubric, model=model, **settings).group(trajectories)


__all__ = ["Judge", "JudgeError", "judge_group", "parse", "prompt", "render", "schema"]
