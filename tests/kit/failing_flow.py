"""A user's workflow that fails on some tasks: `FAILING_WORKFLOW`, written as `failing_flow.py` into a run's
working folder (`swarm train --workflow failing_flow:workflow`). Task t0 returns None unfinished, t1 raises
(at line `RAISES_AT`, which the traceback in the client's log names); the rest finish with reward 1.0, once
both have been played: the run cannot reach its steps before they fail (on a loaded machine the first jobs
were played after a short run had ended, and its failure went unsaid)."""

FAILING_WORKFLOW = """
import time
from pathlib import Path

HERE = Path(__file__).parent


def dataset(seed, size):
    return [{"task_id": f"t{i}"} for i in range(size)]


def workflow(task, episode):
    (HERE / f"{task['task_id']}.played").touch()
    if task["task_id"] == "t0":
        return None
    if task["task_id"] == "t1":
        raise LookupError("no such tool: " + task["task_id"])
    deadline = time.monotonic() + 120
    while not all((HERE / f"t{i}.played").exists() for i in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.05)
    episode.openai.chat.completions.create(model=episode.model, messages=[{"role": "user", "content": "hi"}])
    return 1.0
"""

#: the line of failing_flow.py that raises (FAILING_WORKFLOW's first line is the file's line 1)
RAISES_AT = FAILING_WORKFLOW.splitlines().index('        raise LookupError("no such tool: " + task["task_id"])') + 1
