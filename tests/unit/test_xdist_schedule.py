"""The suite's xdist scheduler (tests/conftest.py) after a worker is lost: what it ran stays done,
what it had left goes to the next worker (not the test it died in), and every worker is handed tests or
shut down."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("xdist")


def _suite_conftest() -> Any:
    """tests/conftest.py as a module of its own (`import conftest` finds whichever is first on the path)."""
    spec = importlib.util.spec_from_file_location("suite_conftest", Path(__file__).parents[1] / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Node:
    """A worker as the scheduler sees it: it is sent test indexes, or told to shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))

    def shutdown(self) -> None:
        self.shutting_down = True


COLLECTION = [f"tests/m{m}.py::test_{t}" for m in range(10) for t in range(3)]


def _scheduler() -> Any:
    config = SimpleNamespace(
        getvalue=lambda name: ["2*popen"] if name == "tx" else None, option=SimpleNamespace(loadscopereorder=False)
    )
    return _suite_conftest().pytest_xdist_make_scheduler(config, None)


def _join(sched: Any, node: Node) -> None:
    sched.add_node(node)
    sched.add_node_collection(node, COLLECTION)


def _state(sched: Any, node: Node, index: int) -> bool:
    nodeid = COLLECTION[index]
    return sched.assigned_work[node][sched._split_scope(nodeid)][nodeid]


def _next_pending(sched: Any, node: Node) -> int | None:
    for i in (i for batch in node.sent for i in batch):
        if not _state(sched, node, i):
            return i
    return None


def test_a_lost_worker_leaves_its_finished_units_done_and_its_unfinished_one_first() -> None:
    sched = _scheduler()
    a, b = Node("gw0"), Node("gw1")
    _join(sched, a)
    _join(sched, b)
    sched.schedule()
    done = 0
    while done < 7:  # worker a runs two modules and the first test of a third; b sits on its first test
        i = _next_pending(sched, a)
        assert i is not None
        sched.mark_test_complete(a, i)
        done += 1
    finished = [scope for scope, unit in sched.assigned_work[a].items() if all(unit.values())]
    current = sched._split_scope(COLLECTION[_next_pending(sched, a)])
    assert len(finished) == 2 and sum(sched.assigned_work[a][current].values()) == 1

    crashed = sched.remove_node(a)  # a dies running the third module's second test

    assert crashed == f"{current}::test_1"
    assert next(iter(sched.workqueue)) == current  # first in line
    assert not set(finished) & set(sched.workqueue)  # nothing a finished is run again
    c = Node("gw2")
    _join(sched, c)
    sched.schedule()
    assert c.sent[0] == [COLLECTION.index(f"{current}::test_2")]  # not the test a died in: xdist reports it failed
    # from here every worker runs all it is sent: the queue empties and each is sent tests, then shut down
    for _ in range(len(COLLECTION)):
        for node in (b, c):
            i = _next_pending(sched, node)
            if i is not None:
                sched.mark_test_complete(node, i)
    assert sched.tests_finished and not sched.workqueue
    assert all(batch for node in (b, c) for batch in node.sent)  # no worker was sent an empty batch
    assert b.shutting_down and c.shutting_down
    ran = {COLLECTION[i] for node in (a, b, c) for batch in node.sent for i in batch}
    assert ran == set(COLLECTION)


def test_a_worker_lost_in_the_last_test_of_its_unit_leaves_nothing_of_it_to_run() -> None:
    """The test a worker died in is not run again (a worker killed for memory would take the next one
    down too): when it was its unit's last, the unit does not go back at all, and the run ends."""
    sched = _scheduler()
    a, b = Node("gw0"), Node("gw1")
    _join(sched, a)
    _join(sched, b)
    sched.schedule()
    for _ in range(2):  # a runs its first module's first two tests and dies in the third
        i = _next_pending(sched, a)
        assert i is not None
        sched.mark_test_complete(a, i)
    unit = sched._split_scope(COLLECTION[_next_pending(sched, a)])
    assert sched.remove_node(a) == f"{unit}::test_2"
    assert unit not in sched.workqueue
    c = Node("gw2")
    _join(sched, c)
    sched.schedule()
    for _ in range(len(COLLECTION)):
        for node in (b, c):
            i = _next_pending(sched, node)
            if i is not None:
                sched.mark_test_complete(node, i)
    assert sched.tests_finished and not sched.workqueue and b.shutting_down and c.shutting_down
    ran = [COLLECTION[i] for node in (b, c) for batch in node.sent for i in batch]
    assert not [t for t in ran if t.startswith(unit)]  # nothing of a's unit ran again
