"""A user's workflow that fails on some tasks: `FAILING_WORKFLOW`, written as `failing_flow.py` into a run's
working folder (`swarm train --workflow failing_flow:workflow`). Task t0 returns None unfinished, t1 raises
(at line 10, which the traceback in the client's log names); the rest finish with reward 1.0."""

FAILING_WORKFLOW = """
def dataset(seed, size):
    return [{"task_id": f"t{i}"} for i in range(size)]


def workflow(task, episode):
    if task["task_id"] == "t0":  # the first jobs, at once: long before any group of the run's steps is done
        return None
    if task["task_id"] == "t1":
        raise LookupError("no such tool: " + task["task_id"])
    episode.openai.chat.completions.create(model=episode.model, messages=[{"role": "user", "content": "hi"}])
    return 1.0
"""
