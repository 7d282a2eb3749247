"""Crash recovery that keeps the work (issue 14, item 2), in process: a restart from an older
checkpoint replays every acknowledged episode within `replay_staleness` (default: all of them),
rebuilds its counters from the buffer, and keeps one metrics row per step (redone steps marked,
lost rows in metrics.lost.jsonl). The real `kill -9` version is tests/chaos/test_crash_recovery.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from swarm.testing import RunningServer, wait_until

KW = dict(group_size=1, batch_groups=1, checkpoint_every=3, checkpoint_on_stop=False, max_staleness=0, secret="s")


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _episode(srv: RunningServer, task: str) -> str:
    ep = httpx.post(f"{srv.url}/swarm/v1/episodes", json={"task_id": task}, headers=_h(srv.token)).json()
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers=_h(ep["api_key"]),
        json={"model": ep["model"], "max_tokens": 3, "messages": [{"role": "user", "content": task}]},
    )
    assert r.status_code == 200, r.text
    assert (
        httpx.post(
            f"{srv.url}/swarm/v1/episodes/{ep['episode_id']}/finish", json={"reward": 1.0}, headers=_h(ep["api_key"])
        ).status_code
        == 200
    )
    return ep["episode_id"]


def _five_steps_then_crash(make_server) -> list[str]:
    """Steps 1..5 (checkpoint at 3), then the server goes without a last checkpoint: 4 and 5 are lost."""
    srv = make_server(**KW)
    ids = []
    for step in range(1, 6):
        ids.append(_episode(srv, f"t{step}"))
        wait_until(lambda step=step: srv.swarm.trainer.step == step)
    srv.stop()
    return ids


def _rows(out: Path) -> dict[str, tuple]:
    db = sqlite3.connect(out / "buffer.sqlite")
    try:
        return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, state, trained_step FROM episodes")}
    finally:
        db.close()


def _metrics(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_restart_replays_the_lost_steps_and_marks_them_redone(make_server, tmp_path: Path) -> None:
    ids = _five_steps_then_crash(make_server)
    srv = make_server(**KW)
    assert srv.swarm.checkpointed_step == 3  # resumed there (replayed groups may already be training)
    wait_until(lambda: srv.swarm.trainer.step == 5)  # both lost steps trained again, nothing stale
    rows = _rows(tmp_path / "out")
    assert {i: rows[i] for i in ids} == {
        ids[0]: ("trained", 1),
        ids[1]: ("trained", 2),
        ids[2]: ("trained", 3),
        ids[3]: ("trained", 4),
        ids[4]: ("trained", 5),
    }
    # replayed in order: the redone step 4 trains the episode of version 3 at version 3, step 5 that of 4 at 4
    assert [s.policy_version for b in srv.engine.batches for s in b.samples] == [3, 4]
    c = srv.swarm.status().counters
    assert c["finished"] == 5 and c["episodes_trained"] == 5 and c.get("dropped_stale", 0) == 0
    assert c["episodes_rolled_back"] == 2 and c["episodes_replayed"] == 2
    rows_now = _metrics(tmp_path / "out" / "metrics.jsonl")
    assert [m["step"] for m in rows_now] == [1, 2, 3, 4, 5]  # one row per step
    assert [m.get("redone", False) for m in rows_now] == [False, False, False, True, True]
    assert [m["policy_lag_max"] for m in rows_now[3:]] == [0, 0]
    assert [m["step"] for m in _metrics(tmp_path / "out" / "metrics.lost.jsonl")] == [4, 5]


def test_replay_staleness_bounds_what_a_restart_keeps(make_server, tmp_path: Path) -> None:
    ids = _five_steps_then_crash(make_server)
    srv = make_server(**KW, replay_staleness=0)  # the stated rule: episodes 0 versions from the restored policy
    wait_until(lambda: srv.swarm.trainer.step == 4)
    wait_until(lambda: _rows(tmp_path / "out")[ids[4]][0] == "dropped_stale")
    assert srv.swarm.trainer.step == 4
    c = srv.swarm.status().counters
    assert c["finished"] == 5 and c["dropped_stale"] == 1 and c["episodes_trained"] == 4


@pytest.mark.parametrize("resume", [True, False])
def test_counters_are_rebuilt_from_the_buffer(make_server, tmp_path: Path, resume: bool) -> None:
    """The checkpoint says 3 finished; the buffer holds 5 acknowledgements. A fresh start (no resume)
    counts none of the earlier run's rows and moves its metrics aside."""
    _five_steps_then_crash(make_server)
    srv = make_server(**{**KW, "group_size": 2}, resume=resume)  # group of 2: nothing trains meanwhile
    c = srv.swarm.status().counters
    if resume:
        assert c["finished"] == 5 and c["resumes"] == 1
    else:
        assert c.get("finished", 0) == 0 and srv.swarm.trainer.step == 0
        assert not _metrics(tmp_path / "out" / "metrics.jsonl")
        _episode(srv, "fresh")
        assert srv.swarm.status().counters["finished"] == 1
