"""The event topics between server components, and the trainer's events around one step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from swarm.config.train import TrainConfig
from swarm.engine.fake import FakeEngine
from swarm.samples import TrainSample
from swarm.server.batcher import Batch, Batcher, FinishedEpisode
from swarm.server.events import StepTopic, Topic
from swarm.server.trainer import GenerationGate, Trainer


def test_topic_calls_listeners_in_order_and_isolates_failures() -> None:
    topic: Topic[[int]] = Topic("numbers")
    heard: list[tuple[str, int]] = []

    def broken(n: int) -> None:
        raise RuntimeError("listener bug")

    topic.subscribe(lambda n: heard.append(("first", n)))
    topic.subscribe(broken)
    topic.subscribe(lambda n: heard.append(("last", n)))
    topic.publish(7)
    assert heard == [("first", 7), ("last", 7)]  # the broken listener is logged, the others still ran


def test_step_topic_awaits_in_order_and_propagates() -> None:
    topic: StepTopic[[dict[str, Any]]] = StepTopic("rows")

    async def slow(row: dict[str, Any]) -> None:
        await asyncio.sleep(0.01)
        row["order"] = [*row.get("order", []), "slow"]

    topic.subscribe(slow)
    topic.subscribe(lambda row: row.update(order=[*row["order"], "sync"]))
    row: dict[str, Any] = {}
    asyncio.run(topic.publish(row))
    assert row["order"] == ["slow", "sync"]

    def broken(row: dict[str, Any]) -> None:
        raise RuntimeError("checkpoint failed")

    topic.subscribe(broken)
    with pytest.raises(RuntimeError):
        asyncio.run(topic.publish({}))


class _Rows:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def write(self, record: dict) -> None:
        self.rows.append(record)


def _ready_batcher(claims_during_step: bool = True) -> Batcher:
    b = Batcher(group_size=1, batch_groups=1, claims_during_step=claims_during_step)
    g = b.admit("t", "e1")
    sample = TrainSample(
        input_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        rollout_logprobs=[0.0, -1.0, -1.0],
        episode_id="e1",
        group_id=g.group_id,
        reward=1.0,
    )
    b.finish(g.group_id, FinishedEpisode("e1", 1.0, [sample]))
    return b


@pytest.mark.parametrize("claims_during_step", [True, False])
def test_trainer_publishes_one_steps_events_in_order(model_dir: Path, claims_during_step: bool) -> None:
    engine = FakeEngine(model_dir)
    batcher = _ready_batcher(claims_during_step)
    rows = _Rows()
    trainer = Trainer(engine, batcher, GenerationGate(), TrainConfig(), rows)
    heard: list[Any] = []

    def taken(batch: Batch) -> None:
        heard.append(("taken", batch.window))

    async def done(step: int, row: dict[str, Any]) -> None:
        heard.append(("done", step, "reward_mean" in row))
        row["extra"] = 1.0

    trainer.batch_taken.subscribe(taken)
    trainer.batch_resolved.subscribe(lambda batch, step: heard.append(("resolved", step)))
    trainer.step_done.subscribe(done)
    trainer.window_reopened.subscribe(lambda version: heard.append(("reopened", version)))

    async def run() -> None:
        trainer.kick()
        await trainer.wait()

    asyncio.run(run())
    if claims_during_step:  # the next window opens as the batch is taken, naming the version that trains it
        assert heard == [("taken", 0), ("reopened", 1), ("resolved", 1), ("done", 1, True)]
    else:
        assert heard == [("taken", 0), ("resolved", 1), ("done", 1, True), ("reopened", engine.policy_version)]
    assert rows.rows[0]["extra"] == 1.0 and rows.rows[0]["step"] == 1  # listeners' fields reach the row
    assert batcher.window == 1 and not batcher.training


def test_a_failing_step_listener_fails_the_step_but_the_window_reopens(model_dir: Path) -> None:
    batcher = _ready_batcher()
    rows = _Rows()
    trainer = Trainer(FakeEngine(model_dir), batcher, GenerationGate(), TrainConfig(), rows)
    reopened: list[int] = []

    def broken(step: int, row: dict[str, Any]) -> None:
        raise OSError("disk full")

    trainer.step_done.subscribe(broken)
    trainer.window_reopened.subscribe(reopened.append)

    async def run() -> None:
        trainer.kick()
        await trainer.wait()

    asyncio.run(run())
    assert trainer.errors == 1 and trainer.step == 1 and rows.rows == []
    assert len(reopened) == 1 and not batcher.training


def test_the_trainer_steps_at_the_lr_its_schedule_gives_after_a_resume(model_dir: Path) -> None:
    """A resumed trainer (step 12 restored) goes on along the schedule, with nothing saved for it."""
    engine = FakeEngine(model_dir)
    cfg = TrainConfig(lr=1e-3, lr_warmup_steps=2, lr_decay_steps=20, lr_min_ratio=0.0)
    trainer = Trainer(engine, _ready_batcher(), GenerationGate(), cfg, _Rows(), step=12)

    async def run() -> None:
        trainer.kick()
        await trainer.wait()

    asyncio.run(run())
    assert engine.batches[0].config.lr == pytest.approx(cfg.at_step(12).lr) == pytest.approx(5e-4)
    assert trainer.config.lr == 1e-3  # the live value is the peak; the step's copy carries the schedule
