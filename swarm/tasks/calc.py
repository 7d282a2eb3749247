"""`calc`: a tool-calling task: multiply two 2-digit numbers with a `multiply(a, b)` tool.

"What is 47*85?" -> the agent calls `multiply` through OpenAI function calling, the
workflow runs the tool locally and sends back the assistant's `tool_calls` and a
`role: "tool"` message with the product, and the model answers "3995". The
embedded 1M-parameter model cannot multiply two 2-digit numbers (it can barely add
a digit), but it can learn to copy the numbers into a call and the tool's result
into its answer: the reward needs the tool.

Reward: 1.0 for exactly the right final answer; 0.5 when the answer is wrong but a call
returned the right product (the model called `multiply` with the question's numbers and then
did not repeat the result); else 0.0. Why partial credit: the two copies (question -> call
arguments, tool result -> answer) are learned separately, and the 1M warm-started model
samples both right in one episode only rarely, so the plain outcome reward is almost always 0
and a GRPO group has nothing to compare. Paying for the right call gives a graded signal:
calls first, then the answer that repeats them. The credit is for a call whose *result* is the
product, so a malformed call or a miscopied argument earns nothing.

The tool spec is exactly what LangChain derives from the `@tool` function in
`examples/calc_langgraph.py`, so the model sees the same prompt whichever client
calls it (it is also kept small: the spec is in every prompt).
"""

from __future__ import annotations

import json
import random
from typing import Any

from swarm.tasks.base import Task

#: Products of 32..99 have four digits: every episode has the same layout, so copying the
#: numbers into the call and the result into the answer is a fixed-offset copy.
A_RANGE = (32, 99)
B_RANGE = (32, 99)
#: A call is about 30 tokens with the embedded tokenizer, an answer 5.
MAX_TOKENS = 40
#: call, answer, and one retry (a second call after a tool error)
MAX_TURNS = 3
TOOL_NAME = "multiply"
TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Multiply two integers.",
            "parameters": {
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "type": "object",
            },
        },
    }
]


def question(a: int, b: int) -> str:
    return f"What is {a}*{b}?"


def _problem(rng: random.Random) -> tuple[int, int]:
    return rng.randint(*A_RANGE), rng.randint(*B_RANGE)


def dataset(seed: int, size: int) -> list[dict]:
    rng = random.Random(f"calc:{seed}")
    out = []
    for i in range(size):
        a, b = _problem(rng)
        out.append({"task_id": f"calc-{seed}-{i}", "question": question(a, b), "answer": str(a * b)})
    return out


#: The reward of an episode whose call returned the product but whose answer is wrong.
RIGHT_CALL_REWARD = 0.5


def reward(completion: str, answer: str, right_call: bool = False) -> float:
    """1.0 when the final answer, stripped of whitespace, is exactly the product; else
    `RIGHT_CALL_REWARD` if a call returned the product; else 0.0."""
    if completion.strip() == answer:
        return 1.0
    return RIGHT_CALL_REWARD if right_call else 0.0


def run_tool(name: str, arguments: str | dict | None) -> str:
    """Execute one call as the agent would; a bad call gets an error the model can read."""
    if name != TOOL_NAME:
        return f"Error: unknown tool {name!r}"
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return "Error: arguments are not JSON"
    if not isinstance(args, dict):
        return "Error: arguments must be an object"
    a, b = args.get("a"), args.get("b")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (a, b)):
        return "Error: multiply needs integers a and b"
    return str(a * b)


def _call_dict(call: Any) -> dict:
    """A response's tool call as the dict the request sends back (OpenAI's shape)."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }


def workflow(task: dict, episode: Any) -> float:
    """Ask with `tools=`, run each call the model makes, send the results back, score the answer.

    Written with the plain OpenAI client only, exactly as a user's tool agent would be.
    """
    messages: list[dict] = [{"role": "user", "content": task["question"]}]
    right_call = False
    for _ in range(MAX_TURNS):
        response = episode.openai.chat.completions.create(
            model=episode.model, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, temperature=1.0
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return reward(message.content or "", task["answer"], right_call)
        messages.append(
            {"role": "assistant", "content": message.content, "tool_calls": [_call_dict(c) for c in message.tool_calls]}
        )
        results = [run_tool(c.function.name, c.function.arguments) for c in message.tool_calls]
        right_call = right_call or task["answer"] in results
        messages += [{"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(message.tool_calls, results)]
    return RIGHT_CALL_REWARD if right_call else 0.0


def estimate(product: int) -> int:
    """What answering without the tool looks like: the product rounded to two significant digits."""
    return round(product, -(len(str(product)) - 2))


def solved(a: int, b: int, call_id: str, slip: tuple[int, int] | None = None) -> list[dict]:
    """An episode with a call: call, tool result, the result as the answer (as the workflow sends
    it back). `slip`: the arguments actually written, when the model miscopied the question's."""
    x, y = slip or (a, b)
    result = str(x * y)
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": json.dumps({"a": x, "b": y})},
    }
    return [
        {"role": "user", "content": question(a, b)},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": result},
    ]


def _slip(a: int, b: int, rng: random.Random) -> tuple[int, int]:
    """One digit of one argument off by one (a miscopy), staying a 2-digit number."""
    values = [a, b]
    k = rng.randrange(2)
    step = rng.choice((1, 10)) * rng.choice((-1, 1))
    values[k] = values[k] + step if 10 <= values[k] + step <= 99 else values[k] - step
    return values[0], values[1]


#: Of the flawed warm-start episodes, the share that answers at once without the tool (the
#: rest miscopy an argument).
DIRECT_SHARE = 0.6


def transcripts(seed: int, size: int, noise: float = 0.0) -> list[list[dict]]:
    """Warm-start conversations; with probability `noise` the episode goes wrong: `DIRECT_SHARE` of
    the time by answering at once without the tool (an estimate), else by miscopying an argument
    (the answer then faithfully repeats the tool's wrong result).

    The noise is what leaves RL something to do: the warm-started policy calls the tool only
    part of the time and sometimes miscopies, and only a right call earns a reward. The
    miscopies also teach that the answer is the tool's result, not the model's own guess at
    the product (a clean answer is a function of the question, which a small model would
    rather approximate than copy). Render them with `TOOLS` (`render_chat(conv,
    tools=TOOLS)`), as the server does.
    """
    rng = random.Random(f"calc-transcripts:{seed}")
    out = []
    for i in range(size):
        a, b = _problem(rng)
        flawed, direct = rng.random() < noise, rng.random() < DIRECT_SHARE
        if flawed and direct:
            out.append(
                [{"role": "user", "content": question(a, b)}, {"role": "assistant", "content": str(estimate(a * b))}]
            )
        else:
            out.append(solved(a, b, f"call_{i}", _slip(a, b, rng) if flawed else None))
    return out


TASK = Task(
    name="calc",
    family="calc",
    description="multi-turn tool use: multiply two 2-digit numbers by calling multiply(a, b)",
    dataset=dataset,
    workflow=workflow,
    transcripts=transcripts,
    tools=TOOLS,
)
