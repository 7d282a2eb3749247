"""A user's workflow that fails on some tasks: `FAILING_WORKFLOW`, written as `failing_flow.py` into a run's
working folder (`swarm train --workflow failing_flow:workflow`). Task t0 returns None unfinished, t1 raises
(at line `RAISES_AT`, which the traceback in the client's log names); the rest finish with reward 1.0.

Run it with `--concurrency` equal to the group size: a fleet hands out jobs in order, a group's episodes
after one another, and a worker takes its next job only when its last is done, so t0 and t1 have failed
before any other task is handed out. With more workers, those on later tasks could take the claims and
finish a short run before t1 was played (its failure then went unsaid: a CI flake under load)."""

FAILING_WORKFLOW = """
def dataset(seed, size):
    return [{"task_id": f"t{i}"} for i in range(size)]


def workflow(task, episode):
    if task["task_id"] == "t0":
        return None
    if task["task_id"] == "t1":
        raise LookupError("no such tool: " + task["task_id"])
    episode.openai.chat.completions.create(model=episode.model, messages=[{"role": "user", "content": "hi"}])
    return 1.0
"""

#: the line of failing_flow.py that raises (FAILING_WORKFLOW's first line is the file's line 1)
RAISES_AT = FAILING_WORKFLOW.splitlines().index('        raise LookupError("no such tool: " + task["task_id"])') + 1
