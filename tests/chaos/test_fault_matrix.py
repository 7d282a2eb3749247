"""Fault matrix: one fault per case, injected into a short real run, and the same verdict for each.

    swarm serve (FakeEngine, n=4, B=2, lease 1.5 s)  <-  2 `swarm client` twins x 4 episodes (chaos_agent.py)

    client_sigkill_mid_episode   SIGKILL a client while it holds open episodes; restart it
    client_sigstop_then_cont     SIGSTOP a client past its lease, then SIGCONT it (a zombie: fenced, re-plays)
    client_sigstop_forever       SIGSTOP a client and leave it frozen: its twin and the stall bound carry on
    server_kill9_mid_step        kill -9 the server while it trains a step; restart on the same out dir
    server_kill9_after_ack       kill -9 the server the instant a client logs an acknowledgement
    two_policies_kill9_mid_step  a server of two policies (--policy a --policy b), one client each:
                                 kill -9 while one trains; each policy resumes from its own checkpoint

Each case: training makes a step, the fault lands, training makes two more steps (liveness),
then the server stops. Verdict from the server's files: every acknowledged episode is in the
durable buffer (trained, dropped by the staleness rule, or still buffered), every trained row is
in exactly one surviving step, and no 5xx was ever answered. Agents think 0.3-0.8 s per turn
(`CHAOS_TURN_S`) so that a fault lands mid-episode.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from chaos_harness import (
    Cluster,
    buffer_rows,
    check_acknowledged,
    check_trained_once,
    count_5xx,
    metric_rows,
    read_acks,
    surviving_steps,
)

LEASE_S = 1.5
STALL_S = 3.0


def _wait(
    cluster: Cluster,
    what: str,
    cond: Callable[[dict], bool],
    timeout_s: float,
    poll_s: float = 0.1,
    policy: str | None = None,
) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        st = cluster.status(policy)
        if st and cond(st):
            return st
        assert cluster.server is not None and cluster.server.poll() is None, cluster.server_logs[-1].read_text()[-3000:]
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s; status {st}"
        time.sleep(poll_s)


def _ack_lines(tmp: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in tmp.glob("ack*.log"))


# -- the faults: each returns notes for the case's own assertions ----------------------------------
def client_sigkill_mid_episode(c: Cluster) -> dict:
    _wait(c, "client 0 mid-episode", lambda st: st["open_episodes"] > 0, 30, poll_s=0.05)
    c.kill(c.clients[0])
    c.start_client(0)
    return {}


def client_sigstop_then_cont(c: Cluster) -> dict:
    _wait(c, "client 0 mid-episode", lambda st: st["open_episodes"] > 0, 30, poll_s=0.05)
    os.kill(c.clients[0].pid, signal.SIGSTOP)
    time.sleep(LEASE_S + 1.5)  # past the lease and a sweep: its episodes expire, its keys go stale
    os.kill(c.clients[0].pid, signal.SIGCONT)
    return {"thawed_at": time.time(), "zombie_pid": c.clients[0].pid}


def client_sigstop_forever(c: Cluster) -> dict:
    _wait(c, "client 0 mid-episode", lambda st: st["open_episodes"] > 0, 30, poll_s=0.05)
    os.kill(c.clients[0].pid, signal.SIGSTOP)  # teardown thaws and kills it
    return {}


def server_kill9_mid_step(c: Cluster) -> dict:
    assert c.server is not None
    deadline = time.monotonic() + 30
    caught = False
    while time.monotonic() < deadline:  # the fake engine's step is short: poll hard, settle for the next best
        st = c.status()
        if st.get("training"):
            caught = True
            break
        time.sleep(0.005)
    c.kill_server()
    time.sleep(0.3)
    c.start_server()
    return {"caught_training": caught}


def server_kill9_after_ack(c: Cluster) -> dict:
    seen = _ack_lines(c.tmp)
    deadline = time.monotonic() + 30
    while _ack_lines(c.tmp) == seen:
        assert time.monotonic() < deadline, "no acknowledgement within 30s"
        time.sleep(0.002)
    c.kill_server()
    acked_before_kill = read_acks(c.tmp)
    time.sleep(0.3)
    c.start_server()
    return {"acked_before_kill": sorted(acked_before_kill)}


FAULTS = [
    client_sigkill_mid_episode,
    client_sigstop_then_cont,
    client_sigstop_forever,
    server_kill9_mid_step,
    server_kill9_after_ack,
]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", FAULTS, ids=[f.__name__ for f in FAULTS])
def test_fault(fault: Callable[[Cluster], dict], tmp_path: Path, model_dir: Path) -> None:
    c = Cluster(
        tmp_path,
        model_dir,
        [
            "--group-size",
            "4",
            "--batch-groups",
            "2",
            "--checkpoint-every",
            "2",
            "--lease-seconds",
            str(LEASE_S),
            "--group-stall-s",
            str(STALL_S),
            "--max-staleness",
            "0",
            "--max-tokens",
            "8",
        ],
        seeds=[0, 0],
        concurrency=4,
        env={"CHAOS_TURN_S": "0.3,0.8"},
    )
    try:
        c.start_server()
        for slot in range(2):
            c.start_client(slot)
        before = _wait(c, "a first step", lambda st: st["step"] >= 1, 60)["step"]
        notes = fault(c)
        after = _wait(c, "two steps after the fault", lambda st: st["step"] >= before + 2, 90)
        c.stop_clients()
        rc = c.stop_server()
        assert rc == 0, c.server_logs[-1].read_text()[-3000:]
    finally:
        c.teardown()

    state = json.loads((c.out / "checkpoints" / "latest" / "server_state.json").read_text())
    acks = read_acks(tmp_path)
    rows = buffer_rows(c.out)
    acked = check_acknowledged(acks, rows)  # no acknowledged episode lost
    check_trained_once(rows, surviving_steps(metric_rows(c.out), int(state["step"])))
    assert count_5xx(c.server_logs) == 0, "".join(log.read_text()[-2000:] for log in c.server_logs)
    counters = after["counters"]
    print(
        f"\n{fault.__name__}: acked {len(acks)} {dict(acked)}, steps {state['step']}, "
        f"expired {counters.get('expired', 0)}, replayed {counters.get('episodes_replayed', 0)}, "
        f"{ {k: v for k, v in notes.items() if k != 'acked_before_kill'} }"
    )
    if fault.__name__.startswith("client_"):  # the victim's leases lapsed (no abort was ever sent)
        assert counters.get("expired", 0) >= 1, counters
    if fault is client_sigstop_then_cont:  # the zombie was fenced, then went on playing new episodes
        assert any(a["pid"] == notes["zombie_pid"] and a["time"] > notes["thawed_at"] for a in acks.values()), (
            "the thawed client never acked again"
        )
    if fault is server_kill9_after_ack:
        assert set(notes["acked_before_kill"]) <= set(rows)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(180)
def test_two_policies_kill9_mid_step(tmp_path: Path, model_dir: Path) -> None:
    """The same verdict, per policy: each has its own buffer, checkpoints and metrics under
    OUT/policies/NAME, and a kill -9 loses no episode either acknowledged."""
    c = Cluster(
        tmp_path,
        model_dir,
        ["--policy", "a", "--policy", "b", "--group-size", "4", "--batch-groups", "2", "--checkpoint-every", "2"]
        + ["--lease-seconds", str(LEASE_S), "--group-stall-s", str(STALL_S), "--max-tokens", "8"],
        seeds=[0, 1],
        concurrency=4,
        env={"CHAOS_TURN_S": "0.2,0.5"},
        slot_args={0: ["--policy", "a"], 1: ["--policy", "b"]},
    )
    policies = ("a", "b")
    try:
        c.start_server()
        for slot in range(2):
            c.start_client(slot)
        before = {
            p: _wait(c, f"a first step of {p}", lambda st: st["step"] >= 1, 60, policy=p)["step"] for p in policies
        }
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(c.status(p).get("training") for p in policies):
            time.sleep(0.005)
        c.kill_server()
        time.sleep(0.3)
        c.start_server()
        for p in policies:
            _wait(c, f"two steps of {p} after the kill", lambda st, p=p: st["step"] >= before[p] + 2, 90, policy=p)
        c.stop_clients()
        rc = c.stop_server()
        assert rc == 0, c.server_logs[-1].read_text()[-3000:]
    finally:
        c.teardown()
    assert count_5xx(c.server_logs) == 0, "".join(log.read_text()[-2000:] for log in c.server_logs)
    for slot, name in enumerate(policies):
        out = c.out / "policies" / name
        state = json.loads((out / "checkpoints" / "latest" / "server_state.json").read_text())
        rows = buffer_rows(out)
        acked = check_acknowledged(read_acks(tmp_path, f"ack{slot}.log"), rows)
        check_trained_once(rows, surviving_steps(metric_rows(out), int(state["step"])))
        assert state["model_name"] == name
        print(f"policy {name}: acked {dict(acked)}, steps {state['step']}")
