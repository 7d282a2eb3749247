"""`Swarm`: the server's components wired together, and the operations routes call.

    claim  -> control.before_admit (paused, quotas) -> batcher.admit (on-policy window)
           -> registry.create -> signed key (lease epoch)
    call   -> (recorded by the OpenAI routes) -> episode.calls; lease renewed
    finish -> timeline.episode_samples -> durable buffer (fsync'd) -> batcher.finish -> trainer.kick
    abort  -> batcher.release
    expiry -> (leases.py sweeper) epoch+1, slot reopened, handed to the next claim of the task
    step   -> buffer rows marked trained -> checkpoint every k -> stop after max_steps
    start  -> resume checkpoint -> re-apply live settings -> replay untrained buffered episodes

Each component gets only what it uses and reports through events (`events.py`);
`_wire` below is the one place that says who hears what, in which order.
Everything here runs on the event loop; only `train_step` and checkpoint writes
go to worker threads. The Swarm holds no math: samples come from
`swarm.timeline`, advantages and losses live in the engine's algorithms.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarm.config.server import ServerConfig
from swarm.engine.base import Engine
from swarm.model.teacher import check_teacher, open_teacher
from swarm.protocol import (
    AbortRequest,
    AbortResponse,
    ClaimRequest,
    ClaimResponse,
    FinishRequest,
    FinishResponse,
    GroupStatus,
    StatusResponse,
)
from swarm.samples import Call
from swarm.server.batcher import Batcher, FinishedEpisode
from swarm.server.checkpoint import Checkpointer
from swarm.server.control import LiveControl
from swarm.server.counters import Counters
from swarm.server.episodes import Episode, EpisodeRegistry, KeySigner
from swarm.server.exceptions import Conflict, InvalidRequest, Refused, SwarmError, Unavailable
from swarm.server.generation_context import GenerationContext, GenerationLimits, context_length, engine_tokenizer
from swarm.server.leases import LeaseKeeper
from swarm.server.lockstep import Lockstep
from swarm.server.recovery import Durability
from swarm.server.render import ChatRenderer
from swarm.server.rollouts import RolloutLog
from swarm.server.tracking import TeeLog, server_sink
from swarm.server.trainer import GenerationGate, MetricsLog, MetricsSink, Trainer
from swarm.timeline import episode_samples

log = logging.getLogger("swarm.server")


class Swarm:
    """One server's components (built here, each given only what it uses) and the operations
    the routes call: claim, record, finish, abort, status, checkpoint, stop."""

    def __init__(self, config: ServerConfig, engine: Engine) -> None:
        if not (config.token and config.admin_token and config.secret):
            config = config.with_secrets()
        self.engine = engine
        self.model_name = config.served_model_name
        tokenizer = engine_tokenizer(engine, config.model_dir)
        self.renderer = ChatRenderer(tokenizer)
        # on-policy distillation: checked against the student's tokenizer (TeacherError: one line why)
        self.teacher = (
            open_teacher(check_teacher(config.teacher, tokenizer), str(getattr(engine, "device", "")) or config.device)
            if config.teacher
            else None
        )
        self.context_length = context_length(engine, config.model_dir)
        self.out_dir = Path(config.out_dir)
        self.counters = Counters()  # every component counts through this one object; status reads it
        self.gate = GenerationGate()
        self.batcher = Batcher(config.group_size, config.batch_groups, config.max_staleness, config.claims_during_step)
        # finished episodes on disk before the ack; replay on restart
        self.durability = Durability(config, self.batcher, self.counters)
        self.registry = EpisodeRegistry(
            KeySigner(config.secret or ""),
            config.lease_seconds,
            config.closed_episodes_kept,
            fallback=self.durability.closed_episode,
        )
        # lease expiry, hand-over, stalled groups (a sweeper task)
        self.leases = LeaseKeeper(self.registry, self.batcher, config, self.counters)
        self.checkpointer = Checkpointer(self.out_dir / "checkpoints", config.keep_checkpoints)
        self.tracking = server_sink(config, self.out_dir) if config.mlflow else None  # logs the model at the end
        self.metrics_log = MetricsLog(self.out_dir / "metrics.jsonl")
        self.rollouts = RolloutLog(self.out_dir)  # a JSON line per finished episode, for `swarm inspect`
        metrics: MetricsSink = self.metrics_log
        if self.tracking is not None:
            metrics = TeeLog(metrics, self.tracking)
        self.trainer = Trainer(engine, self.batcher, self.gate, config.train, metrics, teacher=self.teacher)
        if self.out_dir.parent.name == "policies":  # one of several (`for_policy`): its log lines say which
            self.trainer.label = f"{config.model_name} "
        # --deterministic: episodes' places (their calls' seeds) and each batch's fixed order
        self.lockstep = Lockstep(config.seed) if config.deterministic else None
        # the settings in force, live changes, pause/resume, per-family quotas
        self.control = LiveControl(config, self.trainer, self.batcher, self.registry, self.counters, self.out_dir)
        # what the generation core may touch: not this object, so it cannot reach the batcher or leases
        self.generation_context = GenerationContext(
            engine,
            self.gate,
            self.renderer,
            limits=lambda: GenerationLimits.of(self.config),
            counters=self.counters,
            context_length=self.context_length,
            record=self.record,
            open_episodes=lambda: self.registry.open.values(),
            step_done=self.trainer.step_done,
            call_seed=self.lockstep.seed_for if self.lockstep is not None else None,
        )
        self._admission = asyncio.Event()
        self.last_checkpoint: str | None = None
        self.checkpointed_step = 0
        self.stopping = False
        self.sealed = False  # stopping, and past the grace: nothing more is acknowledged before the last checkpoint
        self.stop_callback: Callable[[], None] | None = None
        self._stop_task: asyncio.Task | None = None
        self._wire()
        if config.resume:
            self.resume()
            self.control.restore()  # the operator's live changes outlive a crash
        # one metrics row per step: rows of steps the restart lost go to metrics.lost.jsonl
        lost = self.metrics_log.truncate_after(self.trainer.step)
        if config.resume and lost:
            self.trainer.redo_through = lost
            log.warning(
                "steps %d..%d were lost with the crash and will be trained again (rows marked redone; "
                "the lost rows are in %s)",
                self.trainer.step + 1,
                lost,
                self.metrics_log.lost_path.name,
            )
        self.durability.recover(config.resume, self.trainer.step, engine.policy_version)

    def _wire(self) -> None:
        """Who hears which event, in the order the listeners must run."""
        t = self.trainer
        t.batch_taken.subscribe(self.durability.apply_failed_policy)
        if self.lockstep is not None:  # after the failed-group policy: it may drop groups
            t.batch_taken.subscribe(self.lockstep.order)
        t.batch_resolved.subscribe(self.durability.resolved)  # buffer rows: trained at step s, or skipped
        t.step_recorded.subscribe(self._after_step)  # after the metrics row: checkpoint every k, max_steps
        t.step_done.subscribe(self.control.annotate_row)  # the live values the step ran with
        t.window_reopened.subscribe(lambda version: self.control.apply_pending())  # first: this window's B
        t.window_reopened.subscribe(self.durability.refill)  # restored groups that waited for room
        t.window_reopened.subscribe(lambda version: self.wake_claims())
        self.leases.slots_freed.subscribe(self.wake_claims)
        self.leases.slots_freed.subscribe(self.trainer.kick)  # a dropped slot may complete the last group
        self.leases.group_dropped.subscribe(self.durability.dropped_stalled)  # stalled_group_policy: drop
        self.control.admission_changed.subscribe(self.wake_claims)
        self.durability.groups_ready.subscribe(self._kick_soon)

    @property
    def config(self) -> ServerConfig:
        """The settings in force: as started, with the live changes made so far (`control`)."""
        return self.control.config

    # -- episodes -------------------------------------------------------------
    def _refuse_if_stopping(self) -> None:
        if self.stopping:
            raise Unavailable("stopping", "the server is stopping", retry_after=int(self.config.stop_grace_s) + 1)

    async def claim(self, req: ClaimRequest, base_url: str) -> ClaimResponse:
        """Admit a claim now, or (long poll, `wait_s`) as soon as the window has room, or `Refused`."""
        got = (await self.claim_many([req], base_url))[0]
        if isinstance(got, SwarmError):
            raise got
        return got

    async def claim_many(self, reqs: list[ClaimRequest], base_url: str) -> list[ClaimResponse | SwarmError]:
        """Claims sent together (the SDK batches concurrent ones), each admitted now in order, or its error.

        If none can be admitted, the long poll waits (up to the longest `wait_s`) until the
        window changes and tries again, answering as soon as at least one got in; the rest
        are `Refused` and come back in the client's next batch.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max((r.wait_s for r in reqs), default=0.0)
        out: list[ClaimResponse | SwarmError | None] = [None] * len(reqs)
        while True:
            changed = self._admission
            refused: dict[int, Refused] = {}
            for i, req in enumerate(reqs):
                try:
                    out[i] = self._claim_now(req, base_url)
                except Refused as r:
                    refused[i] = r
                except SwarmError as exc:  # stopping: every claim of the batch gets it
                    out[i] = exc
            left = deadline - loop.time()
            if len(refused) < len(reqs) or left <= 0:
                break
            borrows = [b for r in refused.values() if (b := (r.details or {}).get("borrow_in_s")) is not None]
            try:  # a quota refusal may turn into a borrowed slot before anything else changes
                await asyncio.wait_for(changed.wait(), min([left, *(b + 0.01 for b in borrows)]))
            except TimeoutError:
                pass
        for i, r in refused.items():
            self.counters.add("claims_rejected")
            # after a long poll, come straight back; otherwise give the window a moment
            retry = 0 if reqs[i].wait_s > 0 else max(1, round(self.config.retry_after_s))
            out[i] = Refused(r.code, r.message, retry_after=retry, details=r.details)
        return [o for o in out if o is not None]

    def wake_claims(self) -> None:
        """The window changed (new version, freed slot, stopping): long-polling claims retry."""
        self._admission.set()
        self._admission = asyncio.Event()

    def _kick_soon(self) -> None:
        """Start a step once the current callback is done (the trainer's own task may be ending)."""
        try:
            asyncio.get_running_loop().call_soon(self.trainer.kick)
        except RuntimeError:
            pass  # at boot: the app's startup kicks the trainer

    def _claim_now(self, req: ClaimRequest, base_url: str) -> ClaimResponse:
        self._refuse_if_stopping()
        ep = self.registry.by_claim_key(req.claim_key)
        if ep is None:
            reuse = self.leases.take(req.task_id)  # an expired episode of this task is handed over
            episode_id = reuse.id if reuse is not None else self.registry.new_id()
            try:
                self.control.before_admit(req)  # paused, over quota: raises Refused
                group = self.batcher.admit(req.task_id, episode_id)  # raises Refused
            except Refused:
                self.leases.put_back(reuse)
                raise
            self.control.admitted(req, group)
            if self.lockstep is not None:
                self.lockstep.admitted(episode_id, group)
            ep = self.registry.create(
                episode_id,
                req.task_id,
                req.task_family,
                group.group_id,
                req.recorded_metadata(),
                self.engine.policy_version,
                req.claim_key,
                epoch=reuse.epoch if reuse is not None else 1,
            )
            self.counters.add("claims")
        return ClaimResponse(
            episode_id=ep.id,
            base_url=base_url,
            api_key=self.registry.key_for(ep),
            lease_expires_at=ep.lease_expires_at,
            policy_version=ep.policy_version,
            model=self.model_name,
            group_id=ep.group_id,
            task_id=ep.task_id,
            lease_seconds=self.config.lease_seconds,
        )

    def begin_call(self, ep: Episode) -> None:
        """An LLM call of `ep` starts: only while it is open and the server is not stopping; renews its lease."""
        self.registry.require_open(ep)
        if self.stopping:
            raise Unavailable("stopping", "the server is stopping")
        self.leases.touch(ep)

    def record(self, ep: Episode, call: Call) -> None:
        """Keep a finished LLM call; a call that ends after its episode closed is dropped."""
        if ep.state != "open":
            self.counters.add("calls_dropped")
            return
        ep.calls.append(call)
        self.leases.touch(ep)
        self.counters.add("calls")
        self.counters.add("prompt_tokens", len(call.prompt_ids))
        self.counters.add("completion_tokens", len(call.completion_ids))

    async def finish(self, ep: Episode, req: FinishRequest) -> FinishResponse:
        """Finish `ep`: samples built, the row committed (group commit), then acknowledged.

        While the commit is in flight the episode is `finishing`: a retry with the same
        idempotency key waits for the same outcome, anything else gets 409, and its
        lease cannot lapse. The bookkeeping runs in its own task, so a client that hangs
        up mid-commit cannot leave a durable row half-recorded.
        """
        body = req.model_dump(exclude={"idempotency_key"})
        replay = bool(req.idempotency_key) and req.idempotency_key == ep.finish_key
        if replay and ep.finish_body is not None and body != ep.finish_body:
            raise Conflict(
                "idempotency_key_reused",
                f"idempotency key {req.idempotency_key!r} finished this episode with another body "
                f"(reward {ep.finish_body.get('reward')}); a retry sends the same body",
            )
        if ep.state == "finished" and replay:
            self.counters.add("finish_replays")
            return FinishResponse.model_validate(ep.finish_response)
        pending = ep.finishing
        if pending is not None and replay:
            self.counters.add("finish_replays")
            return await asyncio.shield(pending)
        self.registry.require_open(ep)
        if self.sealed:  # the last checkpoint's counters must match the buffer: a restart re-plays this one
            raise Unavailable("stopping", "the server is taking its last checkpoint; this episode was not recorded")
        ep.finish_key, ep.finish_body = req.idempotency_key, body
        ep.finishing = asyncio.get_running_loop().create_task(self._finish(ep, req, ep.lease_expires_at))
        ep.finishing.add_done_callback(_retrieved)  # its caller may have hung up: no "never retrieved"
        ep.lease_expires_at = math.inf  # the sweeper leaves it alone while it commits
        return await asyncio.shield(ep.finishing)

    async def _finish(self, ep: Episode, req: FinishRequest, lease: float) -> FinishResponse:
        try:
            return await self._commit_finish(ep, req)
        except BaseException:
            ep.lease_expires_at = max(lease, time.time() + self.config.lease_seconds)
            ep.finish_key = ep.finish_body = None
            raise
        finally:
            ep.finishing = None

    async def _commit_finish(self, ep: Episode, req: FinishRequest) -> FinishResponse:
        failed = req.status == "failed"  # an environment or tool crash: on record, never trained
        calls = ep.calls
        try:
            samples = (
                []
                if failed
                else episode_samples(
                    calls,
                    ep.id,
                    ep.group_id,
                    req.reward,
                    agent_rewards=req.agent_rewards,
                    merge_enabled=self.config.merge,
                    per_episode_norm=self.config.per_episode_norm,
                    choice_rewards=req.choice_rewards,
                )
            )
        except ValueError as exc:  # choice_rewards that do not fit the episode's calls
            raise InvalidRequest("invalid_choice_rewards", str(exc)) from None
        generating = [c for c in calls if c.completion_ids]
        finished = FinishedEpisode(
            ep.id,
            req.reward,
            samples,
            dict(req.metrics),
            calls=len(generating),
            tokens_unmerged=sum(len(c.prompt_ids) + len(c.completion_ids) for c in generating),
            drift=ep.drift,
            family=ep.task_family,
        )
        response = FinishResponse(
            episode_id=ep.id,
            reward=req.reward,
            samples=len(samples),
            calls=len(calls),
            group_id=ep.group_id,
            policy_version=self.engine.policy_version,
            step=self.trainer.step,
            unmatched_agents=sorted(set(req.agent_rewards or ()) - {c.agent for c in calls}),
        )
        await self.durability.persist(ep, req, finished, response)  # on disk before the ack (else Unavailable)
        if self.config.log_rollouts:
            self.rollouts.append(ep, req, self.config.model_dir)
        if failed:  # the slot is resolved without data; failed_group_policy decides the group at take
            self.batcher.release(ep.group_id, ep.id, drop=True)
            self.durability.failed_finish(ep.group_id)
            self.counters.add("finished_failed")
        else:
            self.batcher.finish(ep.group_id, finished)
        ep.reward = req.reward
        ep.finish_response = response.model_dump()
        self.registry.close(ep, "finished")
        self.counters.add("finished")
        self.trainer.kick()
        return response

    def abort(self, ep: Episode, req: AbortRequest) -> AbortResponse:
        if ep.state == "aborted":
            return AbortResponse(episode_id=ep.id)
        self.registry.require_open(ep)
        self.batcher.release(ep.group_id, ep.id, drop=not req.release)
        self.registry.close(ep, "aborted")
        self.counters.add("aborted")
        self.trainer.kick()  # a dropped slot may complete the last group
        self.wake_claims()
        return AbortResponse(episode_id=ep.id)

    def status(self) -> StatusResponse:
        groups = [
            GroupStatus(
                group_id=g.group_id,
                task_id=g.task_id,
                claimed=len(g.claimed),
                finished=len(g.finished),
                dropped=g.dropped,
            )
            for g in self.batcher.groups.values()
        ]
        return StatusResponse(
            model=self.model_name,
            step=self.trainer.step,
            policy_version=self.engine.policy_version,
            group_size=self.config.group_size,
            batch_groups=self.config.batch_groups,
            training=self.batcher.stepping,
            stopping=self.stopping,
            open_episodes=len(self.registry.open),
            buffered_groups=self.batcher.complete_groups(),
            groups=groups,
            counters={
                **self.counters.snapshot(),
                **self.durability.counts(),
                "train_errors": self.trainer.errors,
                **(self.engine.counters() if hasattr(self.engine, "counters") else {}),
            },
            last_checkpoint=self.last_checkpoint,
            max_steps=self.config.max_steps,
            **self.control.status_fields(),
        )

    # -- steps, checkpoints, stopping -----------------------------------------
    async def _after_step(self, step: int, row: dict[str, Any]) -> None:
        k = self.config.checkpoint_every
        if k and step % k == 0:
            await self.checkpoint()
        if self.config.max_steps is not None and step >= self.config.max_steps:
            self.request_stop(f"reached max_steps={self.config.max_steps}")

    def _state(self) -> dict[str, Any]:
        return {
            "step": self.trainer.step,
            "policy_version": self.engine.policy_version,
            "window": self.batcher.window + 1,
            "counters": self.counters.snapshot(),
            "model_name": self.model_name,
        }

    async def checkpoint(self) -> Path:
        path = await asyncio.to_thread(self.checkpointer.save, self.engine, self.trainer.step, self._state())
        self.last_checkpoint = str(path)
        self.checkpointed_step = self.trainer.step
        await asyncio.to_thread(self.durability.compact, self.checkpointed_step)
        if self.tracking is not None:
            self.tracking.checkpoint(self.trainer.step, path)
        log.info("checkpoint %s", path)
        return path

    def resume(self) -> Path | None:
        path = self.checkpointer.latest()
        if path is None:
            return None
        state = self.checkpointer.read_state(path)
        self.engine.load(path)
        self.engine.policy_version = int(state["policy_version"])
        self.trainer.step = self.checkpointed_step = int(state["step"])
        self.batcher.window = int(state.get("window", state["step"]))
        self.counters.merge({k: int(v) for k, v in state.get("counters", {}).items()})
        self.counters.add("resumes")
        self.last_checkpoint = str(path)
        log.info("resumed from %s: step %d, policy version %d", path, self.trainer.step, self.engine.policy_version)
        return path

    def request_stop(self, reason: str) -> None:
        """Refuse new work, let a running step finish, checkpoint, then exit after a grace."""
        if self.stopping:
            return
        self.stopping = True
        self.trainer.halt()  # no step after this one (an overlapped window may be ready already)
        self.wake_claims()
        log.info("%sstopping: %s", self.trainer.label, reason)
        self._stop_task = asyncio.get_running_loop().create_task(self._stop())

    async def _stop(self) -> None:
        """The running step ends; for `stop_grace_s` episodes in flight may still finish (new claims and
        calls get 503 'stopping'; a window claimed during the last step plays out and is acknowledged);
        then the server seals (a finish gets 503 'stopping'), waits for finishes being committed, and
        takes the last checkpoint, whose counters therefore match the buffer."""
        try:
            await self.trainer.wait()
            await asyncio.sleep(self.config.stop_grace_s)
            self.sealed = True
            committing = [ep.finishing for ep in list(self.registry.open.values()) if ep.finishing is not None]
            if committing:
                await asyncio.gather(*committing, return_exceptions=True)
            if self.config.checkpoint_on_stop and self.trainer.step > self.checkpointed_step:
                async with self.gate.exclusive():
                    await self.checkpoint()
        except Exception:
            log.exception("error while stopping")
        finally:
            if self.teacher is not None:
                await self.teacher.close()
            if self.stop_callback is not None:
                self.stop_callback()


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()
