"""A tool-calling agent written with nothing but the plain OpenAI client.

    swarm client --token secret --workflow examples.calc_openai:workflow --n 8 -c 8   # until Ctrl-C
    # (--epochs 1: one pass over the dataset and it exits)
    swarm train --workflow examples.calc_openai:workflow      # or the built-in: swarm train --task calc

The model gets "What is 47*85?" and a `multiply(a, b)` function (OpenAI function
calling: `tools=[...]`). When it answers with `tool_calls`, the agent runs the tool
itself, sends the assistant message with its calls back plus one `role: "tool"`
message per call (with the call's `tool_call_id`), and asks again; the model's first
answer without a call is final. Reward 1.0 for exactly the product. The swarm server
parses the calls out of the generated text, and renders the next turn from the exact
tokens it generated, so the whole episode trains as one sequence. `python -m
examples.calc_openai --url ... --token ...` runs it from Python.
"""

from __future__ import annotations

import json
import random

MAX_TURNS = 3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers.",
            "parameters": {
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "type": "object",
            },
        },
    }
]


def dataset(seed: int, size: int) -> list[dict]:
    rng = random.Random(f"calc:{seed}")
    items = []
    for i in range(size):
        a, b = rng.randint(32, 99), rng.randint(32, 99)
        items.append({"task_id": f"calc-{seed}-{i}", "question": f"What is {a}*{b}?", "answer": str(a * b)})
    return items


def multiply(arguments: str) -> str:
    """The tool, run by the agent (not the server). A bad call gets an error the model reads."""
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) * int(args["b"]))
    except (ValueError, KeyError, TypeError):
        return "Error: multiply needs integers a and b"


def workflow(task: dict, episode) -> float:
    messages: list[dict] = [{"role": "user", "content": task["question"]}]
    for _ in range(MAX_TURNS):
        response = episode.openai.chat.completions.create(
            model=episode.model, messages=messages, tools=TOOLS, max_tokens=40, temperature=1.0
        )
        message = response.choices[0].message
        if not message.tool_calls:  # a final answer
            return 1.0 if (message.content or "").strip() == task["answer"] else 0.0
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in message.tool_calls
                ],
            }
        )
        for c in message.tool_calls:
            result = multiply(c.function.arguments) if c.function.name == "multiply" else "Error: unknown tool"
            messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
    return 0.0


def main() -> None:
    try:  # the shared command line: `python -m examples.X` or `python examples/X.py`
        from examples._run import run_example
    except ImportError:
        from _run import run_example

    run_example(workflow, dataset, "calc")


if __name__ == "__main__":
    main()
