"""`Counters`: the one interface the server's components count through, read like a `Counter`."""

from __future__ import annotations

import threading

from swarm.server.counters import Counters


def test_add_set_merge_and_read_like_a_counter() -> None:
    c = Counters()
    c.add("calls")
    c.add("calls", 2)
    c.add("prompt_drift", False)  # adding 0 (a bool, as the core counts drift) still shows the name
    assert c["calls"] == 3 and c["never"] == 0 and "never" not in c
    assert c.get("never") is None and c.get("never", 7) == 7 and c.get("calls", 7) == 3
    assert c.snapshot() == {"calls": 3, "prompt_drift": 0} and type(c.snapshot()["prompt_drift"]) is int
    c.set("finished", 5)  # rebuilt from the buffer: overwritten, not added
    c.set("finished", 4)
    c.merge({"finished": 1, "resumes": 1})  # a checkpoint's counters on top
    assert dict(c) == {"calls": 3, "prompt_drift": 0, "finished": 5, "resumes": 1} == {**c}
    assert len(c) == 4 and sorted(c) == ["calls", "finished", "prompt_drift", "resumes"]


def test_a_snapshot_is_a_copy() -> None:
    c = Counters()
    c.add("x")
    snap = c.snapshot()
    c.add("x")
    snap["y"] = 1
    assert snap == {"x": 1, "y": 1} and c.snapshot() == {"x": 2}


def test_threads_lose_no_counts() -> None:
    c = Counters()

    def work() -> None:
        for _ in range(2000):
            c.add("n")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c["n"] == 16000
