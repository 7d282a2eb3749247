"""Built-in tasks: seeded datasets plus workflows written against the plain OpenAI client.

    from swarm.tasks import get_task
    task = get_task("arith")
    items = task.dataset(seed=0, size=100)      # [{"task_id": "arith-0-0", ...}, ...]
    reward = task.workflow(items[0], episode)   # episode.openai, episode.model

The registry is the plain dict below: each task module defines a `TASK` and
imports only `swarm.tasks.base`, so nothing imports back into this package.
Nothing here imports torch or the client SDK.
"""

from swarm.tasks import arith, calc, duet, guess
from swarm.tasks.base import Task, Workflow, completion_text

_REGISTRY: dict[str, Task] = {t.name: t for t in (arith.TASK, guess.TASK, duet.TASK, calc.TASK)}


def get_task(name: str) -> Task:
    """The built-in task called `name`; `KeyError` lists the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(list_tasks())}") from None


def list_tasks() -> list[str]:
    return sorted(_REGISTRY)


__all__ = ["Task", "Workflow", "completion_text", "get_task", "list_tasks"]
