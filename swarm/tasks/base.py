"""The `Task` record and the registry of built-in tasks.

A task is data plus a workflow. The data (`dataset`) is generated from a seed so
every client, server and test sees the same problems with the same `task_id`s;
the workflow is ordinary agent code against the plain `openai` client, exactly
what a user would write, so the built-in tasks exercise the same path as theirs.
`transcripts` are ideal (or deliberately noisy) conversations used only by the
embedded model's warm start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Workflow = Callable[[dict, Any], float]


@dataclass(frozen=True)
class Task:
    """A built-in task.

    `family` is what a client sends as `task_family` (metrics are grouped by
    it); for the built-in tasks it equals `name`.
    `dataset(seed, size)` is deterministic and prefix-stable: the first k items
    of a larger dataset equal `dataset(seed, k)`.
    """

    name: str
    family: str
    description: str
    dataset: Callable[[int, int], list[dict]]
    workflow: Workflow
    transcripts: Callable[[int, int], list[list[dict]]]


_REGISTRY: dict[str, Task] = {}


def register(task: Task) -> Task:
    if task.name in _REGISTRY:
        raise ValueError(f"task {task.name!r} already registered")
    _REGISTRY[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The built-in task called `name`; `KeyError` lists the known names."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(list_tasks())}") from None


def list_tasks() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def _load_builtins() -> None:
    # Imported lazily so `base` has no import cycle with the task modules.
    from swarm.tasks import arith, guess  # noqa: F401
    from swarm.tasks import duet  # noqa: F401


def completion_text(response: Any) -> str:
    """The text of the first choice of a chat completion ('' when absent)."""
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError):
        return ""
    return content or ""
