"""The training loop of a server: when a batch is ready, gate generation and step.

    finish -> batcher.ready() -> Trainer.kick() -> [gate closed] engine.train_step
           -> version+1 -> on_step (checkpoint, max-steps) -> [gate open] -> new window

`train_step` runs in a worker thread (`asyncio.to_thread`) so the event loop keeps
answering status, heartbeats and 429s while the weights change. The gate makes
new generate calls wait and lets in-flight ones finish before the step; with
on-policy admission nothing should be generating by then anyway, but the gate is
what keeps weights and generation apart once off-policy modes arrive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

from swarm.engine.base import Engine, TrainBatch, TrainConfig
from swarm.server.batcher import Batch, Batcher

log = logging.getLogger("swarm.server")


class GenerationGate:
    """Many generators or one trainer: a tiny async readers-writer gate."""

    def __init__(self) -> None:
        self._active = 0
        self._closed = False
        self._cond = asyncio.Condition()

    @property
    def closed(self) -> bool:
        return self._closed

    @asynccontextmanager
    async def generating(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._closed)
            self._active += 1
        try:
            yield
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._closed)
            self._closed = True
            await self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._closed = False
                self._cond.notify_all()


class MetricsLog:
    """One JSON object per line; appended and flushed per step (cheap, crash-tolerant)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def write(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True, default=float) + "\n")


class Trainer:
    def __init__(
        self,
        engine: Engine,
        batcher: Batcher,
        gate: GenerationGate,
        train_config: TrainConfig,
        metrics: MetricsLog,
        on_step: Callable[[int], Awaitable[dict[str, float]]],
        step: int = 0,
        on_reopen: Callable[[], None] | None = None,
        on_batch: Callable[[Batch], Batch] | None = None,
        on_outcome: Callable[[Batch, int | None], None] | None = None,
    ) -> None:
        self.engine = engine
        self.batcher = batcher
        self.gate = gate
        self.config = train_config
        self.metrics = metrics
        self.on_step = on_step
        self.on_reopen = on_reopen
        self.on_batch = on_batch  # a taken batch before it trains (failed-group policy)
        self.on_outcome = on_outcome  # (batch, step) once trained, (batch, None) if skipped or failed
        self.step = step
        self.errors = 0
        self.last_error: str | None = None
        self._task: asyncio.Task | None = None
        self._window_opened = time.monotonic()

    @property
    def window_age_s(self) -> float:
        """Seconds since the current window opened (quota borrowing waits on it)."""
        return time.monotonic() - self._window_opened

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def kick(self) -> None:
        """Start a step if a batch is ready and none runs (called after every finish)."""
        if not self.running and self.batcher.ready():
            batch = self.batcher.take()
            if self.on_batch is not None:
                batch = self.on_batch(batch)
            self._task = asyncio.get_running_loop().create_task(self._run(batch))

    async def wait(self) -> None:
        """Until the running step (if any) is done."""
        if self._task is not None:
            await asyncio.shield(self._task)

    def _outcome(self, batch: Batch, step: int | None) -> None:
        if self.on_outcome is not None:
            try:
                self.on_outcome(batch, step)
            except Exception:
                log.exception("on_outcome hook failed")

    async def _run(self, batch: Batch) -> None:
        started = time.monotonic()
        batch_trained = False
        try:
            async with self.gate.exclusive():
                gated = time.monotonic()
                samples = batch.samples
                if not samples:
                    log.warning("window %d has no samples (all episodes empty or dropped); skipped",
                                batch.window)
                    self._outcome(batch, None)
                    return
                metrics = await asyncio.to_thread(
                    self.engine.train_step, TrainBatch(samples=samples, config=self.config))
                trained = time.monotonic()
                self._outcome(batch, self.step + 1)  # rows marked before the new step is visible
                self.step += 1
                batch_trained = True
                extra = await self.on_step(self.step)
                record = {
                    "step": self.step,
                    "policy_version": self.engine.policy_version,
                    "window": batch.window,
                    "time": time.time(),
                    **batch.stats(),
                    "wall_window_s": started - self._window_opened,
                    "wall_gate_s": gated - started,
                    "wall_train_s": trained - gated,
                    **extra,
                }
                for k, v in (metrics or {}).items():
                    record[k if k not in record else f"engine/{k}"] = v
                self.metrics.write(record)
                log.info("step %d: reward %.3f over %d episodes, %d samples, %.2fs",
                         self.step, record["reward_mean"], record["episodes"], record["samples"],
                         record["wall_train_s"])
        except Exception as exc:  # a failed step must not take the server down
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if not batch_trained:
                self._outcome(batch, None)
            log.exception("training step failed; the batch of window %d is dropped", batch.window)
        finally:
            self.batcher.reopen()
            self._window_opened = time.monotonic()
            if self.on_reopen is not None:
                self.on_reopen()
