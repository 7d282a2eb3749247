"""`TinkerService`: the Tinker API's state on a policy server: sessions (leases), training models
(LoRA policies of the shared base), sampler snapshots, and the work each request queues.

    session  create_session -> heartbeats; silent longer than the lease: expired, its models freed as
             when the SDK finishes it (a sweeper, while sessions live); their saves stay on disk
    model    create_model(base, rank) -> a policy `SESSION-train-N` on the base (the swarm trainer refuses it)
    request  forward_backward / optim_step / save / load -> a future in the model's lane (in order)
    sampler  save_weights_for_sampler -> a frozen snapshot policy `SESSION-train-N.NAME`: the SDK's
             sampling client and the OpenAI/Anthropic routes (`model`) both serve it

What the server around it must do is behind `PolicyHooks` (the app implements it): add a policy (a
`PolicyEngine` of the torch host, and a `Swarm` whose claims are refused with 409
`policy_trained_by_primitives`, so the OpenAI proxy serves it under its name), remove one, name
the policies the swarm trainer trains (which this API refuses with 409 `policy_trained_by_swarm`),
and sample: a policy's generation and the base's go through the engine that serves them (the torch
host's batcher, or vLLM with the policy's adapter), and `publish` makes that engine serve what the
primitives changed (vLLM: the adapter written and loaded as a new version; torch: nothing to do).
The primitives themselves always run on the torch host, which trains on either engine.
So this package needs nothing of the server's modules, and the server mounts it as a plug-in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from swarm.config.lora import LoraSettings
from swarm.engine.base import GenerateRequest, SamplingParams
from swarm.engine.policies import PolicyEngine
from swarm.tinker import checkpoints as ckpt
from swarm.tinker.compute import GradStash
from swarm.tinker.errors import TinkerError
from swarm.tinker.futures import FutureTable, Outcome, UserError

SDK_HEARTBEAT_S = 10.0  # the tinker SDK heartbeats its session this often, whatever the server says
LIVE, EXPIRED, FINISHED = "live", "expired", "finished"  # a session's states (never back to live)
SNAPSHOTS_KEPT = 4  # sampler snapshots live at once (each an adapter and a Swarm); older ones reload on use
POLICY_NAME_MAX = 64

log = logging.getLogger("swarm.tinker")


class PolicyHooks(Protocol):
    async def add(self, name: str, settings: LoraSettings) -> PolicyEngine:
        """A new policy: its torch `PolicyEngine` (what the primitives train)."""
        ...

    async def remove(self, name: str) -> None: ...

    def swarm_policies(self) -> list[str]: ...

    async def generate(self, name: str | None, request: GenerateRequest) -> Any:
        """A `Completion` of policy `name` (None: the base, every adapter off) from the serving engine."""
        ...

    def publish(self, name: str) -> dict[str, float]:
        """Make the serving engine serve policy `name`'s current weights (blocking: called off the loop);
        the sync's timings. Raises when the engine could not take them (it serves the last good ones)."""
        ...


@dataclass
class Session:
    """A session, kept after it ends so its ids answer why: 410 expired (the lease lapsed), 404
    finished (the SDK closed it, and a retried finish is answered again)."""

    id: str
    last_seen: float = field(default_factory=time.monotonic)
    models: int = 0
    state: str = LIVE


@dataclass
class Model:
    id: str
    session: Session
    policy: PolicyEngine
    rank: int
    stash: GradStash = field(default_factory=GradStash)
    seqs: dict[int, tuple[str, str]] = field(default_factory=dict)  # seq_id -> (body fingerprint, request id)
    last_seq: int = 0


class TinkerService:
    def __init__(
        self,
        host: Any,
        root: Path,
        base_names: list[str],
        max_context: int,
        lease_s: float,
        hooks: PolicyHooks,
        lora: LoraSettings,
        tokenizer_id: str | None = None,
    ) -> None:
        self.host = host
        self.root = Path(root)
        self.base_names = base_names  # what `base_model` may say: the first is reported
        # what the SDK's `get_tokenizer` loads (`AutoTokenizer.from_pretrained`): the model directory's
        # absolute path, so a client on the server's machine loads it with no hub (default: the name)
        self.tokenizer_id = tokenizer_id or base_names[0]
        self.max_context = max_context
        self.lease_s = max(lease_s, 3 * SDK_HEARTBEAT_S)  # the episode lease, but three heartbeats at least
        self.hooks = hooks
        self.lora = lora
        self.futures = FutureTable(self.root / "futures.boots")  # the ledger: future_lost after a restart
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, ckpt.TinkerPath | None] = {}  # sampling session -> its weights (None: base)
        self.snapshots: OrderedDict[str, PolicyEngine] = OrderedDict()  # tinker uri -> served snapshot
        self._snap_lock = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None

    # -- sessions: leases -----------------------------------------------------------
    def create_session(self) -> str:
        """A new session (called on the event loop); its lease is watched from now on."""
        sid = f"s{secrets.token_hex(4)}"
        self.sessions[sid] = Session(sid)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return sid

    def session(self, sid: str) -> Session:
        """A live session, its lease renewed; 404 unknown or finished (or of a server before a
        restart), 410 lapsed."""
        s = self.sessions.get(sid)
        if s is None:
            raise TinkerError(404, "session_not_found", f"no session {sid!r} on this server (it restarted?)")
        if s.state != LIVE or self._lapsed(s):
            raise self._ended(s)
        s.last_seen = time.monotonic()
        return s

    def _ended(self, s: Session) -> TinkerError:
        """The refusal of a request to session `s`, which is not live: 404 finished, 410 expired."""
        if s.state == FINISHED:
            return TinkerError(404, "session_not_found", f"session {s.id} finished: the SDK closed it")
        return TinkerError(
            410,
            "session_expired",
            f"session {s.id} sent no heartbeat for more than the lease ({self.lease_s:g}s): its models "
            "are no longer held; load their last saved state into a new training client",
        )

    def _lapsed(self, s: Session) -> bool:
        return time.monotonic() - s.last_seen > self.lease_s

    async def _sweep(self) -> None:
        """While a session is live: every third of the lease (10 s at most), the lapsed ones expire.
        A lapsed session is refused (410) at once; this frees what it held, which no request of its
        client would otherwise do (its models served to the OpenAI routes, their adapters)."""
        while any(s.state == LIVE for s in self.sessions.values()):
            await asyncio.sleep(min(SDK_HEARTBEAT_S, self.lease_s / 3))
            lapsed = [s for s in self.sessions.values() if s.state == LIVE and self._lapsed(s)]
            for s in lapsed:
                s.state = EXPIRED
                log.info("tinker session %s expired (no heartbeat for %gs): its models are freed", s.id, self.lease_s)
            await asyncio.gather(*(self._free_models(s.id) for s in lapsed))

    async def finish_session(self, sid: str) -> None:
        """The SDK closed its session (404 unknown; a finish again is done already)."""
        s = self.sessions.get(sid)
        if s is None:
            raise TinkerError(404, "session_not_found", f"no session {sid!r} on this server (it restarted?)")
        if s.state != FINISHED:
            s.state = FINISHED
            await self._free_models(sid)

    async def _free_models(self, sid: str) -> None:
        """Session `sid`'s training models removed (adapter, optimizer, their `Swarm`: gone from the
        OpenAI routes), each after the work already queued in its lane. Their saves stay on disk, and
        sampler snapshots stay served (a tinker:// path any client may sample). A failure is logged:
        the session's other models are freed all the same."""
        models = [self.models.pop(k) for k in [k for k, m in self.models.items() if m.session.id == sid]]
        for m in models:
            try:
                done = self.futures.submit(m.id, lambda: None)  # after the lane's earlier work
                await self.futures.wait(done, 600)
                await self.hooks.remove(m.policy.name)
            except Exception:  # noqa: BLE001 - one model's failure must not keep the others held
                log.exception("tinker model %s of session %s: not freed", m.id, sid)

    # -- models ---------------------------------------------------------------------
    def check_base(self, base_model: str | None) -> None:
        if base_model is not None and base_model not in self.base_names:
            raise TinkerError(
                404, "unknown_base_model", f"base model {base_model!r} is not served; served: {self.base_names[0]}"
            )

    async def create_model(self, sid: str, seq: int, base_model: str, rank: int) -> Model:
        session = self.session(sid)
        self.check_base(base_model)
        model_id = f"{sid}:train:{seq}"
        if model_id in self.models:
            return self.models[model_id]  # the SDK retried a create that went through
        if rank < 0:
            raise TinkerError(400, "invalid_request", f"lora_config.rank must be >= 1 (a LoRA rank), got {rank}")
        if rank == 0:
            raise TinkerError(
                400,
                "full_finetune_unsupported",
                "rank 0 (full fine-tuning) cannot share the base with other policies; give a LoRA rank >= 1",
            )
        settings = self.lora.model_copy(update={"rank": rank, "lr_scale": 1.0})  # Tinker's lr is the lr
        try:
            policy = await self.hooks.add(ckpt.folder_name(model_id), settings)
        except ValueError as exc:  # LoraError included: a rank wider than a layer
            raise TinkerError(400, "invalid_lora", str(exc)) from None
        if session.state != LIVE:  # expired or finished while its policy was added: not kept
            await self.hooks.remove(policy.name)
            raise self._ended(session)
        model = Model(model_id, session, policy, rank)
        self.models[model_id] = model
        session.models += 1
        return model

    def model(self, model_id: str) -> Model:
        """The model a training request names; 404 unknown, 409 a swarm-trained policy, 410 lease lost."""
        m = self.models.get(model_id)
        if m is None:
            if model_id in self.hooks.swarm_policies():
                raise TinkerError(
                    409,
                    "policy_trained_by_swarm",
                    f"{model_id!r} is a policy the swarm trainer trains from episodes; the primitives train "
                    "only models made by create_model (or loaded with create_training_client_from_state)",
                )
            owner = self.sessions.get(model_id.split(":", 1)[0])
            if owner is not None and owner.state == EXPIRED:  # freed by its session's expiry: say so
                raise self._ended(owner)
            raise TinkerError(404, "model_not_found", f"no training model {model_id!r} on this server")
        self.session(m.session.id)
        return m

    def accept(self, m: Model, seq_id: int | None, fingerprint: str) -> str | None:
        """Ordering and fencing by the SDK's per-model `seq_id`: the request id of the same request
        sent again (a retry), None for a new one; 409 `seq_conflict` for a second client's."""
        if seq_id is None:
            return None
        seen = m.seqs.get(seq_id)
        if seen is not None:
            if seen[0] == fingerprint:
                return seen[1]
            raise TinkerError(
                409,
                "seq_conflict",
                f"model {m.id} already took another request as seq_id {seq_id}: a second client trains it",
            )
        if seq_id <= m.last_seq:
            raise TinkerError(
                409,
                "seq_conflict",
                f"model {m.id} is at seq_id {m.last_seq}; seq_id {seq_id} comes from a second client or too late",
            )
        return None

    def submit(
        self, m: Model, seq_id: int | None, fingerprint: str, work: Callable[[], Any], thread: bool = True
    ) -> str:
        """Queue `work` in the model's lane (after its earlier requests); its request id."""
        again = self.accept(m, seq_id, fingerprint)
        if again is not None:
            return again
        rid = self.futures.submit(m.id, work, thread=thread)
        if seq_id is not None:
            m.seqs[seq_id] = (fingerprint, rid)
            m.last_seq = seq_id
        return rid

    def published(self, m: Model) -> dict[str, float]:
        """(In the model's lane, after an optim_step) its new weights served under its name: the OpenAI
        routes sample the training model as it is now. A failed sync does not undo the step, which the
        client would otherwise retry: it is reported in the step's metrics (`publish_failed`) and logged."""
        try:
            return self.hooks.publish(m.policy.name)
        except Exception as exc:  # noqa: BLE001 - any engine's failure: the step stands, the old weights serve on
            log.error("model %s: the weights of its optim_step did not reach the serving engine: %s", m.id, exc)
            return {"publish_failed": 1.0}

    # -- checkpoints --------------------------------------------------------------------
    def save(self, m: Model, kind: str, name: str) -> ckpt.TinkerPath:
        """(In the model's lane) write the model's state at tinker://ID/KIND/NAME, atomically."""
        path = ckpt.TinkerPath(m.id, kind, name)
        ckpt.save(m.policy, self.root, path, {"model_id": m.id, "rank": m.rank, "kind": kind, "name": name})
        return path

    def training_run(self, model_id: str) -> str:
        """`model_id` if its checkpoints can be listed: a model of this server, or one with saves on disk
        (of an ended session, or of a process before a restart); 404 `model_not_found` else."""
        if model_id not in self.models and ckpt.run_folder(self.root, model_id) is None:
            raise TinkerError(404, "model_not_found", f"no training run {model_id!r} on this server (nor saves of it)")
        return model_id

    def folder(self, uri: str) -> tuple[ckpt.TinkerPath, Path]:
        try:
            path = ckpt.parse(uri)
            return path, ckpt.existing(self.root, path)
        except ckpt.PathError as exc:
            raise TinkerError(404 if exc.code == "checkpoint_not_found" else 400, exc.code, exc.message) from None

    def check_rank(self, m: Model, folder: Path) -> None:
        rank = int(ckpt.read_meta(folder).get("rank", -1))
        if rank != m.rank:
            raise TinkerError(
                400, "rank_mismatch", f"{folder.name} holds a rank-{rank} adapter; model {m.id} is rank {m.rank}"
            )

    # -- sampling ---------------------------------------------------------------------
    def snapshot_name(self, path: ckpt.TinkerPath) -> str:
        name = f"{ckpt.folder_name(path.model_id)}.{path.name}"
        if len(name) > POLICY_NAME_MAX:
            raise TinkerError(
                400, "name_too_long", f"sampler name {path.name!r} makes the model name {name!r} longer than 64"
            )
        return name

    async def snapshot(self, path: ckpt.TinkerPath) -> PolicyEngine:
        """The served snapshot policy of a sampler checkpoint: published now if it is not live (a
        fresh adapter loaded from disk; the oldest beyond `SNAPSHOTS_KEPT` is unpublished)."""
        _, folder = self.folder(path.uri)
        async with self._snap_lock:
            live = self.snapshots.get(path.uri)
            if live is not None and live.optimizer is not None:
                self.snapshots.move_to_end(path.uri)
                return live
            name = self.snapshot_name(path)
            if live is not None or name in self.host.policies:
                await self.hooks.remove(name)  # an older save under the same name: replaced
            rank = int(ckpt.read_meta(folder).get("rank", self.lora.rank))
            policy = await self.hooks.add(name, self.lora.model_copy(update={"rank": rank, "lr_scale": 1.0}))
            await asyncio.to_thread(ckpt.load, policy, folder, False)
            await asyncio.to_thread(self.hooks.publish, name)
            self.snapshots[path.uri] = policy
            while len(self.snapshots) > SNAPSHOTS_KEPT:
                old, engine = self.snapshots.popitem(last=False)
                await self.hooks.remove(engine.name)
            return policy

    def create_sampler(self, sid: str, seq: int, base_model: str | None, model_path: str | None) -> str:
        """A sampling session of `model_path`'s weights or of the base (the SDK demands one of the two:
        400 without either, as its own client refuses it)."""
        if not (base_model or model_path):
            raise TinkerError(400, "invalid_request", "create_sampling_session needs base_model or model_path")
        self.session(sid)
        path = None
        if model_path:
            path, _ = self.folder(model_path)  # 404 checkpoint_not_found: never saved for sampling
        else:
            self.check_base(base_model or self.base_names[0])
        sampler = f"{sid}:sample:{seq}"
        self.samplers[sampler] = path
        return sampler

    def sampler_path(self, sampler: str | None, model_path: str | None) -> ckpt.TinkerPath | None:
        if sampler is not None:
            if sampler not in self.samplers:
                raise TinkerError(404, "sampler_not_found", f"no sampling session {sampler!r} on this server")
            return self.samplers[sampler]
        if model_path:
            path, _ = self.folder(model_path)
            return path
        return None

    async def sample(
        self, path: ckpt.TinkerPath | None, ids: list[int], params: SamplingParams, n: int, prompt_topk: int | None
    ) -> tuple[list[Any], Any]:
        """`n` completions of `ids` (and, `prompt_topk` not None, the prompt's logprobs and top-k)."""
        from swarm.tinker.compute import prompt_logprobs  # lazy: torch, once a sample is asked

        policy = await self.snapshot(path) if path is not None else None
        name = policy.name if policy is not None else None  # None: the base, every adapter off in its rows

        def one(i: int) -> GenerateRequest:
            seed = params.seed + i if params.seed is not None else None
            return GenerateRequest(list(ids), dataclasses.replace(params, seed=seed))

        outs = await asyncio.gather(*(self.hooks.generate(name, one(i)) for i in range(n)))
        prompt = None
        if prompt_topk is not None:
            prompt = await asyncio.to_thread(prompt_logprobs, policy, self.host, ids, prompt_topk)
        return list(outs), prompt


def done(value: dict[str, Any]) -> Outcome:
    return Outcome(json=value)


__all__ = ["Model", "PolicyHooks", "Session", "TinkerError", "TinkerService", "UserError", "done"]
