"""The `Task` record and the helpers every task module shares.

A task is data plus a workflow. The data (`dataset`) is generated from a seed so
every client, server and test sees the same problems with the same `task_id`s;
the workflow is ordinary agent code against the plain `openai` client, exactly
what a user would write, so the built-in tasks exercise the same path as theirs.
`transcripts` are ideal (or deliberately noisy) conversations used only by the
embedded model's warm start. A task whose agent calls tools declares them in
`tools` (OpenAI function specs): its workflow passes them on every call, and its
transcripts are rendered with them, exactly as the server renders the prompts.

The registry (`get_task`, `list_tasks`) is in `swarm.tasks`' `__init__`, which
imports the task modules; this module imports none of them, so a task module
can import it without a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Workflow = Callable[[dict, Any], float]


@dataclass(frozen=True)
class Task:
    """A built-in task.

    `family` is what a client sends as `task_family` (metrics are grouped by
    it); for the built-in tasks it equals `name`.
    `dataset(seed, size)` is deterministic and prefix-stable: the first k items
    of a larger dataset equal `dataset(seed, k)`.
    `tools`: the function specs the workflow sends (`tools=`), None for a task without
    tools; the warm start and the tokenizer corpus render `transcripts` with them.
    `group_call`: the workflow makes one call and honours `episode.choices` (k > 1: it asks
    for n = k and returns a reward per choice), so `swarm train` samples a GRPO group in
    one call by default.
    `roles`: a team task's roles; its workflow plays a `TeamEpisode` (one member per role).
    """

    name: str
    family: str
    description: str
    dataset: Callable[[int, int], list[dict]]
    workflow: Workflow
    transcripts: Callable[[int, int], list[list[dict]]]
    tools: list[dict] | None = None
    group_call: bool = False
    #: the roles of a team task (one trainable policy each with `swarm train --shared-base`); () for one model
    roles: tuple[str, ...] = ()


def completion_text(response: Any) -> str:
    """The text of the first choice of a chat completion ('' when absent)."""
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError):
        return ""
    return content or ""
