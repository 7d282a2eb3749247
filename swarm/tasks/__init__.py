"""Built-in tasks: seeded datasets plus workflows written against the plain OpenAI client.

    from swarm.tasks import get_task
    task = get_task("arith")
    items = task.dataset(seed=0, size=100)      # [{"task_id": "arith-0-0", ...}, ...]
    reward = task.workflow(items[0], episode)   # episode.openai, episode.model

Nothing here imports torch or the client SDK.
"""

from swarm.tasks.base import Task, Workflow, completion_text, get_task, list_tasks

__all__ = ["Task", "Workflow", "completion_text", "get_task", "list_tasks"]
