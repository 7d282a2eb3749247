"""Chaos: a real training run while clients are SIGKILLed (and one is frozen into a zombie) and
the server is SIGKILLed once and restarted.

    swarm serve (subprocess, torch engine)  <-  3 x `swarm client` (subprocesses, chaos_agent.py)
    every 2-4 s: SIGKILL a random client, restart it (its cursor file resumes it)
    once:        SIGSTOP a client for longer than the lease, then SIGCONT (a zombie)
    once:        SIGKILL the server mid-run, restart it on the same port and out dir

Then, from the server's durable buffer (`buffer.sqlite`), its metrics and the clients'
acknowledgement logs: training reached `max_steps`; every acknowledged episode is in the
buffer and trained, dropped as stale (counted), or still buffered when training ended;
every trained row is in exactly one surviving step; no trained token came from a call
of a fenced holder (stale epoch); and the server never answered a 5xx.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from chaos_harness import (
    Cluster,
    buffer_rows,
    check_acknowledged,
    check_fencing,
    check_trained_once,
    count_5xx,
    metric_rows,
    read_acks,
    surviving_steps,
)


class Chaos(Cluster):
    """The processes of one chaos run; everything it starts is killed by PID in `teardown`."""

    def __init__(
        self,
        tmp: Path,
        model_dir: Path,
        engine: str,
        max_steps: int,
        lease_s: float,
        seeds: list[int],
        concurrency: int,
        extra: list[str] | None = None,
    ) -> None:
        super().__init__(
            tmp,
            model_dir,
            [
                "--group-size",
                "4",
                "--batch-groups",
                "2",
                "--checkpoint-every",
                "2",
                "--max-steps",
                str(max_steps),
                "--lease-seconds",
                str(lease_s),
                "--group-stall-s",
                str(3 * lease_s),
                "--max-staleness",
                "0",
                "--max-tokens",
                "8",
                *(extra or []),
            ],
            seeds,
            concurrency,
            engine=engine,
        )

    # -- the run ----------------------------------------------------------------------------
    def run(self, max_steps: int, lease_s: float, budget_s: float, seed: int = 0) -> int:
        rng = random.Random(seed)
        self.start_server()
        for slot in range(len(self.seeds)):
            self.start_client(slot)
        t_end = time.monotonic() + budget_s
        next_kill = time.monotonic() + rng.uniform(2, 4)
        frozen: tuple[int, float] | None = None
        server_killed = zombie_done = False
        assert self.server is not None
        while self.server.poll() is None:
            assert time.monotonic() < t_end, f"no progress in {budget_s}s: {self.status()}"
            now = time.monotonic()
            st = self.status()
            step = int(st.get("step", 0))
            # kill the server after an odd step (checkpoints are every 2: that step is lost and its
            # episodes are replayed) while the next window holds finished episodes (dropped as stale)
            mid_window = step % 2 == 1 and any(g["finished"] for g in st.get("groups", []))
            if not server_killed and step >= max_steps // 2 and (mid_window or step >= max_steps // 2 + 3):
                self.kill(self.server)
                self.events["server_sigkills"] += 1
                server_killed = True
                time.sleep(0.5)
                self.start_server()
                continue
            if not zombie_done and step >= 2:
                slot = 0
                if self.clients[slot].poll() is None:
                    os.kill(self.clients[slot].pid, signal.SIGSTOP)  # its leases lapse: a zombie
                    frozen = (slot, now + lease_s + 2.0)
                    self.events["client_sigstops"] += 1
                zombie_done = True
            if frozen is not None and now >= frozen[1]:
                os.kill(self.clients[frozen[0]].pid, signal.SIGCONT)
                frozen = None
            if now >= next_kill:
                slots = [s for s in self.clients if frozen is None or s != frozen[0]]
                slot = rng.choice(slots)
                self.kill(self.clients[slot])
                self.events["client_sigkills"] += 1
                self.start_client(slot)
                next_kill = now + rng.uniform(2, 4)
            for slot, p in self.clients.items():  # a client that gave up (e.g. during the restart)
                if p.poll() not in (None, 0) and self.server.poll() is None and (frozen is None or frozen[0] != slot):
                    self.events["client_exits"] += 1
                    self.start_client(slot)
            time.sleep(0.2)
        return self.server.wait()


def _analyse(chaos: Chaos, model_dir: Path, max_steps: int) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    acks = read_acks(chaos.tmp)
    rows = buffer_rows(chaos.out)
    # 1. every acknowledged episode is in the durable buffer, and accounted for
    acked_states = check_acknowledged(acks, rows)
    # 2. every trained row is in exactly one surviving step (the last record of each step number)
    steps = surviving_steps(metric_rows(chaos.out))
    assert max(steps) == max_steps and sorted(steps) == list(range(1, max_steps + 1))
    check_trained_once(rows, steps)
    trained = {i: r for i, r in rows.items() if r[0] == "trained"}
    assert all(1 <= r[1] <= max_steps for r in trained.values())
    # 3. fencing: every marker in trained tokens is the finishing holder's (its epoch, its episode)
    markers, compacted, unverified = check_fencing(chaos.out, rows, acks, tok)
    # only finishes in flight at the one server kill can lack their line (3 clients x 3 episodes)
    assert unverified <= 9, f"{unverified} compacted trained rows have no rollouts.jsonl line"
    # 4. the server never answered a 5xx
    fivexx = count_5xx(chaos.server_logs)
    assert fivexx == 0, "5xx answered: " + "".join(log.read_text()[-2000:] for log in chaos.server_logs)
    state = json.loads((chaos.out / "checkpoints" / "latest" / "server_state.json").read_text())
    counters = state.get("counters", {})
    return {
        "steps": max(steps),
        "acknowledged": len(acks),
        "buffer_rows": len(rows),
        "acked_trained": acked_states["trained"],
        "acked_dropped_stale": acked_states["dropped_stale"],
        "acked_buffered_at_end": acked_states["buffered"],
        "trained_rows": len(trained),
        "all_states": dict(Counter(r[0] for r in rows.values())),
        "http_5xx": fivexx,
        "markers_checked": markers,
        "trained_rows_compacted": compacted,
        "trained_rows_unverified": unverified,
        **dict(chaos.events),
        "server_counters": {
            k: counters.get(k, 0)
            for k in (
                "expired",
                "episodes_replayed",
                "episodes_rolled_back",
                "dropped_stale",
                "slots_abandoned",
                "calls_dropped",
                "resumes",
                "finished",
            )
        },
    }


def _chaos_run(
    tmp_path: Path, model_dir: Path, engine: str, max_steps: int, budget_s: float, extra: list[str] | None = None
) -> dict:
    lease_s = 2.0
    chaos = Chaos(tmp_path, model_dir, engine, max_steps, lease_s, seeds=[0, 0, 1], concurrency=3, extra=extra)
    try:
        rc = chaos.run(max_steps, lease_s, budget_s)
        assert rc == 0, chaos.server_logs[-1].read_text()[-3000:]
        time.sleep(0.5)
    finally:
        chaos.teardown()
    summary = _analyse(chaos, model_dir, max_steps)
    print("\nCHAOS SUMMARY " + json.dumps(summary, sort_keys=True))
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(420)
def test_chaos_torch_engine(tmp_path: Path, model_dir: Path) -> None:
    """The chaos with the real torch engine (random tiny Qwen2 on CPU). The fake engine's side of it, with
    more clients and steps, is the soak's (tests/chaos/test_soak.py), which checks the same fencing."""
    s = _chaos_run(tmp_path, model_dir, "torch", max_steps=6, budget_s=300, extra=["--device", "cpu"])
    assert s["server_sigkills"] == 1 and s["client_sigkills"] >= 2
