"""The training loop of a server: when a batch is ready, screen it, gate generation and step.

    finish -> batcher.ready() -> Trainer.kick() -> take, screen (staleness bound)
           -> [gate] engine.train_step -> version+1 -> step_done (checkpoint, max-steps, live values)
           -> metrics row -> window_reopened (pending live settings, replayed groups, waiting claims)

`train_step` runs in a worker thread (`asyncio.to_thread`) so the event loop keeps
answering status, heartbeats and claims while the weights change. How it shares the
engine with generation depends on `max_staleness` (k, see batcher.py):

* k = 0 (on-policy): the gate is held exclusively. New generate calls wait and
  in-flight ones finish before the step; with on-policy admission nothing should be
  generating by then anyway, but a call still in flight (a zombie of an expired
  lease, a slow stream) never sees the weights change under it. The next window
  opens (`window_reopened`) when the batch is taken (`claims_during_step`): its
  episodes are claimed and its agents run while the step trains, and their calls
  wait here, to reach the engine together with the new weights; the window's
  collection time (`wall_window_s`) counts from the step's end. Without
  `claims_during_step` the window opens after the step.
* k >= 1 (overlapped): the next window opens when the batch is taken
  (`window_reopened` is published then, naming the version that will train it), and
  the step holds the gate only `alongside` generation: calls keep being admitted.
  Each engine keeps a weight update from interleaving with a forward pass (the torch
  engine holds its model lock for the whole update, so its forward passes queue
  behind the step: claims, agent time, rendering and merging overlap the step, the
  engine's own generation resumes after it; a policy of several on one base holds
  it only for the optimizer's update, its step's forwards run beside generation).
  A call that spans an update keeps the version it started with, so its lag is
  over- never under-stated, and its recorded logprobs are those of the weights that
  actually sampled each token, which is what the PPO ratio needs
  (swarm/engine/policy_step.py uses them as the old logprobs).

Checkpoints taken under `gate.exclusive()` (on stop, on request) wait for a running
step in both modes, so saved weights and saved counters always agree.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from swarm.algorithms.choices import DistillMode
from swarm.config.train import TrainConfig
from swarm.engine.base import Engine, TrainBatch
from swarm.model.teacher import Teacher, distill_terms
from swarm.server.batcher import Batch, Batcher
from swarm.server.events import StepTopic, Topic

log = logging.getLogger("swarm.server")


class GenerationGate:
    """Many generators, or one exclusive holder; an overlapped step runs alongside generators.

    generating()  shared by any number of generate calls
    exclusive()   alone: no generation, no step (an on-policy step; a checkpoint)
    alongside()   an overlapped step: generation goes on; excludes `exclusive` holders
    """

    def __init__(self) -> None:
        self._active = 0
        self._closed = False
        self._stepping = False  # an `alongside` holder is in
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
            await self._cond.wait_for(lambda: self._active == 0 and not self._stepping)
        try:
            yield
        finally:
            async with self._cond:
                self._closed = False
                self._cond.notify_all()

    @asynccontextmanager
    async def alongside(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._closed and not self._stepping)
            self._stepping = True
        try:
            yield
        finally:
            async with self._cond:
                self._stepping = False
                self._cond.notify_all()


class MetricsSink(Protocol):
    """Where a step's metrics row goes: `MetricsLog`, or `tracking.TeeLog` (the log, then MLflow)."""

    def write(self, record: dict) -> None: ...


class MetricsLog:
    """One JSON object per line; appended and flushed per step (cheap, crash-tolerant).

    One row per step: a restart that restored step s first moves every row after s
    (steps whose weights the crash lost) to `metrics.lost.jsonl` (`truncate_after`);
    the steps trained again write fresh rows marked `"redone": true`.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def lost_path(self) -> Path:
        return self.path.with_name(self.path.stem + ".lost.jsonl")

    def truncate_after(self, step: int) -> int:
        """Keep the rows of steps <= `step` (atomically rewritten); append the others to
        `metrics.lost.jsonl`. Returns the highest step moved (0: none). A torn last line
        (the crash hit a write) is dropped."""
        if not self.path.is_file():
            return 0
        keep: list[str] = []
        lost: list[str] = []
        for line in self.path.read_text().splitlines():
            try:
                row_step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue
            (keep if row_step <= step else lost).append(line)
        if not lost:
            return 0
        with open(self.lost_path, "a") as f:
            f.write("".join(x + "\n" for x in lost))
            f.flush()
            os.fsync(f.fileno())
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(x + "\n" for x in keep))
        os.replace(tmp, self.path)
        return max(int(json.loads(x)["step"]) for x in lost)

    def write(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True, default=float) + "\n")


class Trainer:
    """Takes a ready batch, trains it under the gate, and tells listeners how it went.

    Events, published in this order around one step (listeners are wired by `Swarm`):

        batch_taken(batch)            before it trains; listeners may drop groups from it
        batch_resolved(batch, step)   trained as `step`, or None: skipped (no samples) or failed
        step_done(step, row)          after a trained step, before its metrics row is written;
                                      listeners may add fields to `row` (awaited; a failure fails the step)
        step_recorded(step, row)      its metrics row is written: checkpoints listen here, so a kill -9
                                      can never leave a checkpointed step without its metrics row
        window_reopened(version)      the next window is open; policy `version` will train it
                                      (k = 0: after the step; k >= 1: as the batch is taken)

    Before `batch_taken`, the batch is screened against `batcher.max_staleness`
    (`Batch.screen`): episodes over the bound are in `batch.stale`, never trained.
    """

    def __init__(
        self,
        engine: Engine,
        batcher: Batcher,
        gate: GenerationGate,
        train_config: TrainConfig,
        metrics: MetricsSink,
        step: int = 0,
        teacher: Teacher | None = None,
    ) -> None:
        self.engine = engine
        self.teacher = teacher  # on-policy distillation: scores each batch's tokens before its step
        self.label = ""  # "NAME " for one policy of several: its log lines name it
        self.batcher = batcher
        self.gate = gate
        self.config = train_config  # replaced by live control between steps; a running step keeps its own
        self.metrics = metrics
        self.step = step
        self.errors = 0
        self.last_error: str | None = None
        self.redo_through = 0  # steps up to this one were trained before a crash lost them: rows say `redone`
        self.batch_taken: Topic[[Batch]] = Topic("batch taken")
        self.batch_resolved: Topic[[Batch, int | None]] = Topic("batch resolved")
        self.step_done: StepTopic[[int, dict[str, Any]]] = StepTopic("step done")
        self.step_recorded: StepTopic[[int, dict[str, Any]]] = StepTopic("step recorded")
        self.window_reopened: Topic[[int]] = Topic("window reopened")
        self._task: asyncio.Task | None = None
        self._halted = False
        self._window_opened = time.monotonic()

    @property
    def window_age_s(self) -> float:
        """Seconds since the current window opened (quota borrowing waits on it)."""
        return time.monotonic() - self._window_opened

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def halt(self) -> None:
        """Take no further batch (the server is stopping; `max_steps` is reached). A running step
        completes; a window that is ready meanwhile stays in the durable buffer for a restart."""
        self._halted = True

    def kick(self) -> None:
        """Start a step if a batch is ready and none runs (called after every finish)."""
        if not self._halted and not self.running and self.batcher.ready():
            version = self.engine.policy_version  # the policy this step computes its gradient at
            batch = self.batcher.take()
            stale = batch.screen(version, self.batcher.max_staleness, self.batcher.replay_staleness)
            if stale:
                log.warning(
                    "window %d: %d episode(s) more than %d version(s) from policy %d dropped",
                    batch.window,
                    len(stale),
                    self.batcher.max_staleness,
                    version,
                )
            self.batch_taken.publish(batch)
            self._task = asyncio.get_running_loop().create_task(self._run(batch, self._window_opened))
            if self.batcher.opens_at_take:  # the next window is open already; version+1 trains it
                self._opened(version + 1)

    def _opened(self, version: int) -> None:
        self._window_opened = time.monotonic()
        self.window_reopened.publish(version)

    async def wait(self) -> None:
        """Until the running step (if any) is done."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self, batch: Batch, window_opened: float) -> None:
        started = time.monotonic()
        batch_trained = False
        overlapped = self.batcher.overlapped
        try:
            async with self.gate.alongside() if overlapped else self.gate.exclusive():
                gated = time.monotonic()
                samples = batch.samples
                if not samples:
                    log.warning("window %d has no samples (all episodes empty or dropped); skipped", batch.window)
                    self.batch_resolved.publish(batch, None)
                    return
                config = self.config.at_step(self.step)  # the lr schedule's value now
                token_adv, distilled, teacher_model = None, {}, None
                if self.teacher is not None and config.distill_coef:
                    if config.distill_mode == DistillMode.full:  # the step reads the teacher's logits itself
                        teacher_model = self.teacher.model  # type: ignore[attr-defined]  # local: ServerConfig
                    else:
                        token_adv, distilled = await distill_terms(
                            self.teacher, samples, config.distill_coef, config.teacher_temperature
                        )
                batch_in = TrainBatch(samples=samples, config=config, token_advantages=token_adv, teacher=teacher_model)
                metrics = await asyncio.to_thread(self.engine.train_step, batch_in)
                trained = time.monotonic()
                self.batch_resolved.publish(batch, self.step + 1)  # rows marked before the new step is visible
                self.step += 1
                batch_trained = True
                record = {
                    "step": self.step,
                    "policy_version": self.engine.policy_version,
                    "window": batch.window,
                    "time": time.time(),
                    **batch.stats(),
                    "wall_window_s": started - window_opened,
                    "wall_gate_s": gated - started,
                    "wall_train_s": trained - gated,
                    **distilled,
                }
                for k, v in (metrics or {}).items():
                    record[k if k not in record else f"engine/{k}"] = v
                if self.step <= self.redo_through:
                    record["redone"] = True
                await self.step_done.publish(self.step, record)
                self.metrics.write(record)
                await self.step_recorded.publish(self.step, record)
                log.info(
                    "%sstep %d: reward %.3f over %d episodes, %d samples, %.2fs",
                    self.label,
                    self.step,
                    record["reward_mean"],
                    record["episodes"],
                    record["samples"],
                    record["wall_train_s"],
                )
        except Exception as exc:  # a failed step must not take the server down
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if not batch_trained:
                self.batch_resolved.publish(batch, None)
            log.exception("training step failed; the batch of window %d is dropped", batch.window)
        finally:
            self.batcher.reopen()
            if not self.batcher.opens_at_take:
                self._opened(self.engine.policy_version)
            else:  # the window that filled meanwhile may be ready: step again at once
                if not overlapped:  # its calls waited for this step: its collection starts now
                    self._window_opened = time.monotonic()
                asyncio.get_running_loop().call_soon(self.kick)
