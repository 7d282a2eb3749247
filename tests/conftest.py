"""The whole suite: which tests must share one pytest-xdist worker.

CI runs `pytest -n 2`: most integration tests wait on processes and sockets more than they
compute, so two workers on two cores finish the suite in well under the time of one. The tests of
a group below run on one worker, one after another, because they share something a second worker
would duplicate or disturb:

* vllm: the session's vLLM server (a minute of start-up and gigabytes each);
* slurm: the one-node Slurm cluster, whose time-limit and queue tests count on an idle node (and
  whose session fixture holds one of its two CPUs with the time-limit job: twice would hold both);
* model-build: the default recipe's build, which runs the CPU flat out for minutes, and the README
  test, which uses that build (ROOST_HOME's; one worker builds it once, then both tests use it, and
  the other worker is never left waiting on the build's lock);
* frameworks: the agent-framework suite's scripted server (tests/frameworks/conftest.py).

Groups are given to xdist by its scheduler hook, not by `xdist_group` marks: with pytest 9 the
`--dist loadgroup` marks no longer group anything (xdist 3.8 renames nodeids through an attribute
pytest no longer reads), and tests of a group then ran on both workers. Without xdist
(`pytest tests`) nothing here applies.
"""

from __future__ import annotations

from typing import Any

import pytest

GROUPS = {
    "tests/engine_vllm/": "vllm",
    "tests/researcher/test_live_planner.py": "vllm",
    "tests/scheduler/": "slurm",
    "tests/verl/test_slurm_job.py": "slurm",
    "tests/test_model_build.py": "model-build",
    "tests/integration/test_readme_commands.py": "model-build",
    "tests/frameworks/": "frameworks",  # one scripted server per session, not one per worker
}


def group_of(nodeid: str) -> str:
    """The unit xdist hands to one worker: a group above, else the test itself."""
    for prefix, group in GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return nodeid


@pytest.hookimpl(optionalhook=True)  # the client-only and verl venvs run their tests without xdist
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling  # lazy: only a run under xdist asks

    class GroupScheduling(LoadScopeScheduling):
        """Load balancing, a group at a time: every test of a group goes to the worker that took it."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
