"""Bounded staleness (`max_staleness` k): claims go on while a step trains (k >= 1), nothing further
than k versions from the training policy is ever trained (dropped whole and counted instead), each
step logs its policy lag, and the PPO ratio is taken against the recorded rollout logprobs."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.client import SwarmClient
from swarm.config.train import TrainConfig
from swarm.engine.fake import FakeEngine
from swarm.samples import TrainSample
from swarm.server.batcher import Batch, Batcher, FinishedEpisode, Group, episode_lag, policy_lag
from swarm.server.exceptions import Refused
from swarm.server.trainer import GenerationGate, Trainer
from swarm.testing import RunningServer, wait_until

MESSAGES = [{"role": "user", "content": "What is 1+1?"}]


def _episode(eid: str, group_id: str, *versions: int, reward: float = 1.0) -> FinishedEpisode:
    samples = [
        TrainSample([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5], eid, group_id, reward, policy_version=v) for v in versions
    ]
    return FinishedEpisode(eid, reward, samples)


def _play(client: SwarmClient, task: str, reward: float = 1.0, **claim: Any):
    ep = client.claim(task, **claim)
    ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
    ep.finish(reward)
    return ep


def _rows(srv: RunningServer) -> list[dict]:
    path = srv.swarm.out_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _trained_lags(engine: FakeEngine, first_version: int = 0) -> list[int]:
    """The fake engine trains batch i at version first_version + i: every trained sample's lag."""
    return [policy_lag(first_version + i, s.policy_version) for i, b in enumerate(engine.batches) for s in b.samples]


# -- the rule (pure) ---------------------------------------------------------------------------------
def test_lag_is_the_distance_in_versions_and_an_episode_counts_its_worst_sample() -> None:
    assert policy_lag(5, 5) == 0 and policy_lag(5, 3) == 2
    assert policy_lag(2, 4) == 2  # a sample of a step a restart rolled back: as stale as one 2 steps old
    assert episode_lag(_episode("e", "g", 5, 3, 4).samples, 5) == 2
    assert episode_lag([], 9) == 0  # nothing of it trains


def test_screen_drops_whole_episodes_over_the_bound_and_reports_the_lag() -> None:
    g1 = Group(
        "a#w0g0",
        "a",
        3,
        finished=[_episode("fresh", "a#w0g0", 5), _episode("lag1", "a#w0g0", 4, 5), _episode("old", "a#w0g0", 5, 3)],
    )
    g2 = Group("b#w0g1", "b", 1, finished=[_episode("lost", "b#w0g1", 7)])  # rolled back: |5 - 7| = 2
    batch = Batch(window=0, groups=[g1, g2])
    stale = batch.screen(5, max_staleness=1)
    assert [e.episode_id for e in stale] == ["old", "lost"]
    assert [e.episode_id for e in batch.episodes] == ["fresh", "lag1"]
    assert g1.complete and g1.dropped == 1 and g2.complete and g2.dropped == 1  # groups complete smaller
    assert all(policy_lag(5, s.policy_version) <= 1 for s in batch.samples)
    stats = batch.stats()
    assert stats["policy_lag_max"] == 1 and stats["policy_lag_mean"] == pytest.approx(1 / 3)
    assert stats["offpolicy_samples"] == 1 and stats["dropped_stale"] == 2 and stats["dropped"] == 2


def test_overlapped_batcher_opens_the_next_window_when_a_batch_is_taken() -> None:
    on = Batcher(group_size=1, batch_groups=1, max_staleness=0, claims_during_step=False)
    over = Batcher(group_size=1, batch_groups=1, max_staleness=1)
    for b in (on, over):
        g = b.admit("a", "e1")
        b.finish(g.group_id, _episode("e1", g.group_id, 0))
        b.take()
        assert b.stepping
    with pytest.raises(Refused) as r:
        on.admit("b", "e2")
    assert r.value.code == "training" and on.training
    g = over.admit("b", "e2")  # k = 1: admitted while the step trains, into the next window
    assert not over.training and over.window == 1 and g.group_id.startswith("b#w1")
    over.finish(g.group_id, _episode("e2", g.group_id, 0))
    assert not over.ready()  # one batch out at a time: this window waits for the step
    with pytest.raises(Refused) as r:
        over.admit("c", "e3")
    assert r.value.code == "window_full"  # and no window fills further ahead (lag stays <= 1)
    over.reopen()
    assert over.ready() and over.window == 1  # reopen does not skip a window
    with pytest.raises(ValueError):
        Batcher(1, 1, max_staleness=-1)


def test_gate_lets_generation_run_alongside_a_step_but_a_checkpoint_waits_for_it() -> None:
    async def run() -> list[str]:
        gate = GenerationGate()
        order: list[str] = []
        step_may_end = asyncio.Event()

        async def step() -> None:
            async with gate.alongside():
                order.append("step in")
                await step_may_end.wait()
                order.append("step out")

        async def checkpoint() -> None:
            async with gate.exclusive():
                order.append("checkpoint")

        s = asyncio.create_task(step())
        await asyncio.sleep(0)
        async with gate.generating():  # not blocked by the step
            order.append("generated")
        c = asyncio.create_task(checkpoint())
        await asyncio.sleep(0.05)
        assert "checkpoint" not in order  # waits for the step
        step_may_end.set()
        await asyncio.gather(s, c)
        return order

    assert asyncio.run(run()) == ["step in", "generated", "step out", "checkpoint"]


# -- the trainer's guard (real Trainer and FakeEngine, no HTTP) -----------------------------------------------
class _Rows:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def write(self, record: dict) -> None:
        self.rows.append(record)


def test_trainer_never_trains_a_sample_older_than_k(model_dir: Path) -> None:
    engine = FakeEngine(model_dir)
    engine.policy_version = 6
    batcher = Batcher(group_size=2, batch_groups=2, max_staleness=1)
    episodes = {"a": [("a0", 6), ("a1", 5)], "b": [("b0", 4), ("b1", 7)]}  # b0 is two versions old
    for task, eps in episodes.items():
        for eid, v in eps:
            g = batcher.admit(task, eid)
            batcher.finish(g.group_id, _episode(eid, g.group_id, v))
    rows = _Rows()
    trainer = Trainer(engine, batcher, GenerationGate(), TrainConfig(), rows)
    stale: list[str] = []
    reopened: list[int] = []
    trainer.batch_resolved.subscribe(lambda batch, step: stale.extend(e.episode_id for e in batch.stale))
    trainer.window_reopened.subscribe(reopened.append)

    async def run() -> None:
        trainer.kick()
        assert reopened == [7]  # overlapped: the next window opened as the batch was taken
        await trainer.wait()

    asyncio.run(run())
    [batch] = engine.batches
    assert sorted(s.episode_id for s in batch.samples) == ["a0", "a1", "b1"]
    assert max(policy_lag(6, s.policy_version) for s in batch.samples) == 1 and stale == ["b0"]
    [row] = rows.rows
    assert row["policy_lag_max"] == 1 and row["dropped_stale"] == 1 and row["offpolicy_samples"] == 2
    assert row["policy_lag_mean"] == pytest.approx(2 / 3) and row["episodes"] == 3


# -- a real server on loopback -------------------------------------------------------------------------------
def test_claims_are_admitted_and_served_while_a_slowed_step_trains(make_server, model_dir) -> None:
    srv = make_server(engine=FakeEngine(model_dir, train_delay_s=3.0), group_size=1, batch_groups=1, max_staleness=1)
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", wait=False)
    wait_until(lambda: srv.swarm.batcher.stepping)
    ep = client.claim("b", wait=False)  # no 429: the next window is open while step 1 trains
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)  # generation too
    ep.finish(0.5)
    assert srv.swarm.trainer.step == 0 and srv.swarm.batcher.stepping  # all of it during the step
    assert ep.policy_version == 0 and r.system_fingerprint == "roost-policy-v0"
    assert client.status().training
    # b's window trains right after; the step counts before its metrics row is written: wait for the row
    wait_until(lambda: srv.swarm.trainer.step == 2 and len(_rows(srv)) == 2, timeout=20)
    rows = _rows(srv)
    assert [(m["step"], m["policy_lag_max"], m["dropped_stale"]) for m in rows] == [(1, 0, 0), (2, 1, 0)]
    assert _trained_lags(srv.engine) == [0, 1]


def test_max_steps_is_not_exceeded_by_a_window_that_filled_during_the_last_step(make_server, model_dir) -> None:
    srv = make_server(
        engine=FakeEngine(model_dir, train_delay_s=1.5), group_size=1, batch_groups=1, max_staleness=1, max_steps=1
    )
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", wait=False)
    wait_until(lambda: srv.swarm.batcher.stepping)
    late = _play(client, "b", wait=False)  # its window is ready before step 1 ends
    srv.thread.join(15)
    assert not srv.thread.is_alive() and srv.swarm.trainer.step == 1 and len(srv.engine.batches) == 1
    db = sqlite3.connect(srv.swarm.out_dir / "buffer.sqlite")
    try:
        [(state,)] = db.execute("SELECT state FROM episodes WHERE id=?", (late.id,)).fetchall()
    finally:
        db.close()
    assert state == "buffered"  # acknowledged and kept for a restart, not trained past max_steps


def test_on_policy_k0_without_claims_during_step_refuses_claims_while_a_step_trains(make_server, model_dir) -> None:
    srv = make_server(
        engine=FakeEngine(model_dir, train_delay_s=1.0), group_size=1, batch_groups=1, claims_during_step=False
    )
    assert srv.swarm.config.max_staleness == 0  # the default: on-policy
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", wait=False)
    wait_until(lambda: srv.swarm.batcher.stepping)
    r = httpx.post(
        f"{srv.url}/swarm/v1/episodes", json={"task_id": "b"}, headers={"Authorization": f"Bearer {srv.token}"}
    )
    assert r.status_code == 429 and r.json()["error"]["code"] == "training"
    _play(client, "b")  # waits out the step
    wait_until(lambda: srv.swarm.trainer.step == 2 and len(_rows(srv)) == 2)  # the row is written after the count
    assert _trained_lags(srv.engine) == [0, 0] and [m["policy_lag_max"] for m in _rows(srv)] == [0, 0]


def test_on_policy_claims_during_a_step_wait_at_the_gate_and_train_at_lag_0(make_server, model_dir) -> None:
    """The default: the next window's episode is claimed while the step trains; its call waits
    for the new weights, so what it generates trains at lag 0, as without early claims."""
    srv = make_server(engine=FakeEngine(model_dir, train_delay_s=1.0), group_size=1, batch_groups=1)
    assert srv.swarm.config.claims_during_step and srv.swarm.config.max_staleness == 0
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", wait=False)
    wait_until(lambda: srv.swarm.batcher.stepping)
    early = client.claim("b", wait=False)  # no 429: admitted into the next window at once
    assert srv.swarm.batcher.stepping and srv.swarm.trainer.step == 0
    early.openai.chat.completions.create(model=early.model, messages=MESSAGES, max_tokens=4)
    assert srv.swarm.trainer.step == 1  # the call was answered only after the step
    early.finish(1.0)
    wait_until(lambda: srv.swarm.trainer.step == 2 and len(_rows(srv)) == 2)  # the row is written after the count
    assert _trained_lags(srv.engine) == [0, 0] and [m["policy_lag_max"] for m in _rows(srv)] == [0, 0]
    assert srv.swarm.counters["expired"] == 0


def test_a_window_claimed_during_the_last_step_is_acknowledged_before_the_last_checkpoint(
    make_server, model_dir
) -> None:
    """At max_steps the next window's episodes may already wait at the gate: they play out during
    the stop grace and are acknowledged (kept for a restart), and the last checkpoint counts them."""
    srv = make_server(
        engine=FakeEngine(model_dir, train_delay_s=1.0), group_size=1, batch_groups=1, max_steps=1, stop_grace_s=1.5
    )
    client = SwarmClient(srv.url, srv.token)
    _play(client, "a", wait=False)
    wait_until(lambda: srv.swarm.batcher.stepping)
    late = client.claim("b", wait=False)
    late.openai.chat.completions.create(model=late.model, messages=MESSAGES, max_tokens=4)
    late.finish(1.0)  # the server is stopping, but an episode in flight still finishes
    srv.thread.join(15)
    assert not srv.thread.is_alive() and srv.swarm.trainer.step == 1
    db = sqlite3.connect(srv.swarm.out_dir / "buffer.sqlite")
    try:
        states = dict(db.execute("SELECT id, state FROM episodes").fetchall())
    finally:
        db.close()
    assert states[late.id] == "buffered" and len(states) == 2
    saved = json.loads((srv.swarm.out_dir / "checkpoints" / "latest" / "server_state.json").read_text())
    assert saved["counters"]["finished"] == len(states)


def test_leases_stand_still_while_a_step_holds_generation_back(make_server, model_dir) -> None:
    """An episode whose call waits at the gate cannot renew its lease through that call: the step's
    time is not counted against it (a 0.5 s lease outlives a 2 s step without any heartbeat)."""
    srv = make_server(engine=FakeEngine(model_dir, train_delay_s=2.0), group_size=1, batch_groups=1, lease_seconds=0.5)
    client = SwarmClient(srv.url, srv.token, heartbeats=False)
    _play(client, "a", wait=False)
    wait_until(lambda: srv.swarm.batcher.stepping)
    early = client.claim("b", wait=False)
    early.openai.chat.completions.create(model=early.model, messages=MESSAGES, max_tokens=4)
    early.finish(1.0)  # not 409: the lease did not run out at the gate
    wait_until(lambda: srv.swarm.trainer.step == 2)
    assert srv.swarm.counters["expired"] == 0 and _trained_lags(srv.engine) == [0, 0]


@pytest.mark.parametrize("k", [0, 1])
def test_a_busy_fleet_never_trains_beyond_k(make_server, model_dir, k: int) -> None:
    """Eight client threads play groups of a task in order while slowed steps train: every trained
    sample is within k versions of the policy that trained it, and with k = 1 the overlap happens."""
    srv = make_server(engine=FakeEngine(model_dir, train_delay_s=0.15), group_size=2, batch_groups=2, max_staleness=k)
    steps = 6
    jobs = itertools.count()
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        client = SwarmClient(srv.url, srv.token)
        try:
            while not stop.is_set():
                with lock:
                    j = next(jobs)
                ep = client.claim(f"t{j // 2}", stop=stop)
                ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4)
                ep.finish(float(j % 2))
        except BaseException as exc:  # noqa: BLE001 - reported below unless it is the stop
            if not stop.is_set():
                errors.append(exc)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: srv.swarm.trainer.step >= steps or bool(errors), timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    lags = _trained_lags(srv.engine)
    assert len(srv.engine.batches) >= steps and max(lags) <= k
    rows = _rows(srv)
    assert all(m["policy_lag_max"] <= k and m["dropped_stale"] == 0 for m in rows)
    if k:  # episodes of the next window were played while a step trained, and trained one version later
        assert sum(m["offpolicy_samples"] for m in rows) > 0 and 1 in lags
    assert srv.swarm.counters.get("dropped_stale", 0) == 0


def test_restart_replays_within_k_and_drops_older_episodes_counted(make_server, tmp_path: Path) -> None:
    """Four steps, no checkpoint, then a restart at version 0: with k = 1 the episodes of versions 0 and
    1 are trained again (lag <= 1), those of versions 2 and 3 are dropped and counted (replay_staleness = 1;
    the default replays them all, tests/server/test_recovery.py)."""
    kw = dict(
        group_size=1,
        batch_groups=1,
        checkpoint_every=0,
        checkpoint_on_stop=False,
        max_staleness=1,
        replay_staleness=1,
        secret="s",
    )
    srv = make_server(**kw)
    client = SwarmClient(srv.url, srv.token)
    ids = []
    for step in range(1, 5):
        ids.append(_play(client, f"t{step}").id)
        wait_until(lambda step=step: srv.swarm.trainer.step == step)
    srv.stop()
    srv2 = make_server(**kw)
    wait_until(lambda: srv2.swarm.trainer.step == 2)
    assert [[s.episode_id for s in b.samples] for b in srv2.engine.batches] == [[ids[0]], [ids[1]]]
    assert max(_trained_lags(srv2.engine)) <= 1
    c = srv2.swarm.status().counters
    assert c["dropped_stale"] == 2 and c["buffer_dropped_stale"] == 2 and c["episodes_replayed"] == 2
    client2 = SwarmClient(srv2.url, srv2.token)
    later = _play(client2, "fresh")  # the server goes on
    wait_until(lambda: srv2.swarm.trainer.step == 3)
    assert srv2.engine.batches[2].samples[0].episode_id == later.id and client2.status().step == 3


# -- the off-policy correction ---------------------------------------------------------------------------
def test_ppo_ratio_is_taken_against_the_recorded_rollout_logprobs(model_dir: Path) -> None:
    """`policy_step` must use a sample's recorded logprobs as the old ones: recorded = the model's own
    gives ratio 1 (nothing clipped, KL 0); recorded from a policy that liked those tokens much more
    (an older one) gives a ratio far below 1 - eps: the clip binds on every token of the sample with a
    negative advantage (for the positive one the unclipped term is the pessimistic one), half the tokens."""
    import torch  # lazy: torch and transformers load in seconds; the rest of this module needs neither
    from transformers import AutoModelForCausalLM

    from swarm.engine.policy_step import policy_step

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = [[1, 5, 6, 7, 8], [1, 5, 9, 10, 11]]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids)).logits[:, :-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, 1:, None])[..., 0].tolist()

    def batch(shift: float) -> list[TrainSample]:
        return [
            TrainSample(
                x,
                [0, 0, 1, 1, 1],
                [0.0] + [lp + shift for lp in lp_row],
                f"e{i}",
                "g",
                reward=float(i == 0),
                policy_version=0,
            )
            for i, (x, lp_row) in enumerate(zip(ids, own))
        ]

    def step(shift: float) -> dict[str, float]:
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights untouched: only the ratio differs
        return policy_step(model, opt, batch(shift), TrainConfig(lr=0.0, clip_eps=0.2))

    on = step(0.0)
    assert on["clipfrac"] == pytest.approx(0.0) and on["kl"] == pytest.approx(0.0, abs=1e-5)
    off = step(1.0)  # ratio exp(-1) ~ 0.37
    assert off["clipfrac"] == pytest.approx(0.5, abs=1e-6) and off["kl"] > 0.1
