"""Several LoRA policies served by one vLLM process (or each of N replicas): `swarm serve --engine vllm --policy a`.

    host = VllmPolicyHost(model_dir, work_dir, settings=settings, max_rank=8, max_loras=3)
    a = host.add("planner", LoraSettings(rank=8))    # a torch adapter and optimizer; vLLM serves "planner-v0"
    b = host.add("executor", LoraSettings(rank=8))
    await a.generate(request)                         # vLLM, with planner's adapter
    a.train_step(batch)                               # the torch step; then only planner's adapter travels

Training is the torch `PolicyHost`'s (swarm/engine/policies.py): one frozen base in this process, one
adapter and AdamW per policy, steps taking turns on that host. Its own generation is never used:
generation is one vLLM process serving the same base with LoRA enabled, `max_loras` adapters in a
batch (one per policy, and one for the version a sync switches in; policies added at run time past
that are still served, vLLM's worker swapping adapters in and out of its cache from their directories).
So a policy costs an adapter on both sides, never a model copy or a process.

Each policy has its own
* `AdapterPublisher` (adapters.py) over `WORK/adapters/NAME/`: after each of its steps only its adapter
  is written, validated and loaded as `{NAME}-v{N}` (two policies never share a name: it ends in `-v`
  and the version's digits), and its old version unloaded. The other policies' adapters are not touched;
* `DrainGate`: a sync drains the requests of its own policy only, so B's requests are admitted while A
  switches versions. A gate per policy, rather than one gate counting per adapter name, because the
  gate is also where a request reads its label (version and model name) at admission: a policy's gate
  gives both, unchanged (gate.py);
* `VllmPolicyEngine`: the `VllmEngine` (engine.py) of those parts, whose trainer is the policy's torch
  `PolicyEngine`: admission, recovery, labels, the step and its sync, save, load and counters are that
  engine's code, so one policy behaves as a single-policy vLLM engine does.

Shared: the process, and the `Supervisor` that restarts it. A restart holds every policy's gate
(`Gates`), and its `on_start` relabels every publisher: a restarted vLLM serves each policy's last good
adapter again. Syncs of different policies take turns on the supervisor's lock (tens of ms each); a
step of A runs on the torch host, not vLLM, which serves B meanwhile.

Replicas (`--vllm-replicas N`, docs/replicas.md): N such processes, each with its own supervisor and
`Gates`, and each policy a replica of its own on each (gate, publisher over `WORK/replica-i/adapters/
NAME/`, client) in a `ReplicaSet`, so its requests are routed and its adapter published to every
process exactly as a single-policy engine's are (replicas.py). A policy is added to, and removed from,
every process under all their supervisors' locks (taken in order): none restarts half-way.

A drain that times out (`--vllm-drain-timeout-s`) ends only its own policy's stragglers: vLLM's
`/pause?mode=abort` has no per-adapter form and would end every policy's requests, so the publisher
sets its gate's `aborting` instead and each of the policy's streams ends itself at its next chunk
("abort": the stream is closed, which vLLM aborts). Removing a policy ends its calls in flight the
same way, unloads its adapter names and deletes its directory; the torch side frees its adapter.
A rank above the `--max-lora-rank` vLLM started with (the widest of the policies at start) is refused.
The Tinker API (swarm/tinker) trains a policy's adapter on the torch host, as the swarm trainer does;
its samplers are served here like any policy, and its base sampler by `generate_base` (vLLM's base
model, no adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from swarm.config.lora import LoraSettings
from swarm.config.vllm import VllmSettings, max_lora_rank
from swarm.engine.base import Completion, EngineError, GenerateRequest, completion_of
from swarm.engine.lora import LoraError, save_adapter
from swarm.engine.policies import PolicyEngine, PolicyHost
from swarm.engine.vllm.adapters import AdapterPublisher, adapter_layout, copy_adapter
from swarm.engine.vllm.engine import VllmEngine, end_of_turn_id, eos_ids
from swarm.engine.vllm.errors import VllmEngineError
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.replicas import Replica, ReplicaSet, on_each
from swarm.engine.vllm.server import VllmProcess, find_python
from swarm.engine.vllm.stream import CompletionsClient
from swarm.engine.vllm.supervisor import Supervisor

__all__ = ["Gates", "VllmPolicyEngine", "VllmPolicyHost"]

log = logging.getLogger("swarm.engine.vllm")


class Gates:
    """Every policy's gate, as the one process's supervisor holds a gate: a restart holds them all."""

    def __init__(self) -> None:
        self.gates: dict[str, DrainGate] = {}

    def hold(self) -> None:
        for gate in list(self.gates.values()):
            gate.hold()

    def reopen(self) -> None:
        for gate in list(self.gates.values()):
            gate.reopen()


class VllmPolicyHost:
    """The torch trainer of every policy and the supervised vLLM process (one per replica) that serves them
    all (module docstring).

    `max_rank`: the widest adapter vLLM must take (`--max-lora-rank`); `max_loras`: adapters in one batch.
    """

    def __init__(
        self,
        model_dir: Path,
        work_dir: Path,
        *,
        max_rank: int,
        max_loras: int,
        seed: int = 0,
        device: str | None = None,
        settings: VllmSettings = VllmSettings(),
        served_name: str = "roost",
    ) -> None:
        python = find_python(settings.python)  # fail in one line before loading anything heavy
        self.trainer = PolicyHost(Path(model_dir), seed=seed, device=device, max_batch=1)
        self.model_dir = Path(model_dir)
        self.work_dir = Path(work_dir)
        self.settings = settings
        self.served_name = served_name
        self.max_rank = max_lora_rank(max_rank)
        longest = self.trainer.base.max_positions
        self.max_positions = min(longest, settings.max_model_len or longest)
        self.policies: dict[str, VllmPolicyEngine] = {}
        devices = settings.device_groups
        #: per replica: its process, the gates of every policy's requests there, and its supervisor
        self.processes = [
            VllmProcess(
                python,
                self.model_dir,
                served_name,
                settings,
                self.root(i) / "vllm.log",
                seed=seed + i,
                max_model_len=self.max_positions,
                lora_rank=self.max_rank,
                max_loras=max_loras,
                port=settings.port + i if settings.port else None,
                cuda_devices=devices[i] if devices else None,
            )
            for i in range(settings.replicas)
        ]
        tok = self.trainer.base.tokenizer
        #: per replica: a client of its base model (no adapter), for `generate_base`
        self.base_clients = [
            CompletionsClient(
                partial(getattr, p, "url"), served_name, self.max_positions, eos_ids(tok), end_id=end_of_turn_id(tok)
            )
            for p in self.processes
        ]
        self.gates = [Gates() for _ in self.processes]
        # a supervisor only holds and reopens its gate: `Gates` does that for every policy's on its replica
        self.supervisors = [
            Supervisor(process, gates, on_start=partial(self._relabel, i))  # type: ignore[arg-type]
            for i, (process, gates) in enumerate(zip(self.processes, self.gates))
        ]
        self.process, self.supervisor = self.processes[0], self.supervisors[0]  # one process: its names as before
        try:
            on_each(self.supervisors, lambda sup: sup.start())  # at once, each until healthy
        except BaseException:
            self._close()
            raise

    def root(self, i: int) -> Path:
        """Replica `i`'s folder: the work folder for the first, as with one process; `replica-i` in it else."""
        return self.work_dir if i == 0 else self.work_dir / f"replica-{i}"

    @contextlib.contextmanager
    def _all_held(self) -> Iterator[None]:
        """Every replica's supervisor lock, taken in order: no replica restarts meanwhile."""
        with contextlib.ExitStack() as stack:
            for sup in self.supervisors:
                stack.enter_context(sup.lock)
            yield

    def _relabel(self, i: int) -> None:
        """Replica `i`'s supervisor's `on_start`: a (re)started vLLM holds no adapter; every policy's last good
        one is loaded again under its version's name (all are tried; the first failure is raised after)."""
        failed: list[VllmEngineError] = []
        for policy in list(self.policies.values()):
            try:
                policy.replicas[i].publisher.relabel()
            except VllmEngineError as exc:
                log.error("vLLM replica %d could not load policy %s's adapter after a start: %s", i, policy.name, exc)
                failed.append(exc)
        if failed:
            raise failed[0]

    def add(self, name: str, settings: LoraSettings) -> VllmPolicyEngine:
        """A new policy: a fresh torch adapter and optimizer, its version 0 loaded into vLLM.

        ValueError for a name in use or not usable; `LoraError` for settings the model or vLLM cannot take.
        """
        if settings.rank > self.max_rank:
            raise LoraError(
                f"policy {name!r}: rank {settings.rank} is wider than the adapters this vLLM was started for "
                f"(--max-lora-rank {self.max_rank}, from the policies given at start); use a rank <= {self.max_rank}"
            )
        policy = self.trainer.add(name, settings)
        try:
            engine = VllmPolicyEngine(self, policy)
            try:
                with self._all_held():  # no restart meanwhile: it would not relabel this one yet
                    for r in engine.replicas:
                        if not r.supervisor.healthy():
                            r.supervisor.recover("found dead adding a policy")
                        r.publisher.relabel()
                        self.gates[r.index].gates[name] = r.gate
                    self.policies[name] = engine
            except BaseException:
                for r in engine.replicas:
                    self.gates[r.index].gates.pop(name, None)
                    r.publisher.close()
                    shutil.rmtree(r.publisher.root, ignore_errors=True)
                raise
        except BaseException:
            self.trainer.remove(name)
            raise
        return engine

    def remove(self, name: str) -> None:
        """Drop a policy: its calls in flight end ("abort"), its adapters leave vLLM and their directory is
        deleted, its torch adapter and optimizer are freed (its checkpoints stay on disk). KeyError if unknown."""
        engine = self.policies[name]
        engine.removed = True  # new calls are refused; those in flight end at their next chunk

        def late(running: int) -> None:  # unloading only forgets the name: these finish in vLLM by themselves
            log.warning("policy %s removed with %d calls still running in vLLM", name, running)

        for r in engine.replicas:
            r.gate.drain(self.settings.drain_timeout_s, late, abort_wait_s=0)
        with self._all_held():
            self.policies.pop(name, None)
            for r in engine.replicas:
                self.gates[r.index].gates.pop(name, None)
                r.publisher.unload()
        for r in engine.replicas:
            r.gate.reopen()  # a call that waited at the gate is refused past it (`_live`)
            r.publisher.close()
            shutil.rmtree(r.publisher.root, ignore_errors=True)
        self.trainer.remove(name)

    def policy(self, name: str) -> VllmPolicyEngine:
        return self.policies[name]

    async def generate_base(self, request: GenerateRequest) -> Completion:
        """A completion of the base with every adapter off (the Tinker API's base sampler), from the first
        replica whose process runs. The base never changes, so there is no gate to pass or version to
        label (0); a vLLM that died mid-request fails it, and its supervisor restarts the process."""
        client = next((c for p, c in zip(self.processes, self.base_clients) if p.alive()), self.base_clients[0])
        try:
            chunks = [chunk async for chunk in client.completions(request, client.body(request))]
        except httpx.TransportError as exc:
            raise VllmEngineError(f"vLLM could not be reached for a base sample ({exc!r})") from exc
        return completion_of(request, chunks, 0)

    async def close(self) -> None:
        await asyncio.to_thread(self._close)
        await self.trainer.close()

    def _close(self) -> None:
        on_each(self.supervisors, lambda sup: sup.close(), raise_first=False)
        for policy in self.policies.values():
            for r in policy.replicas:
                r.publisher.close()


class VllmPolicyEngine(VllmEngine):
    """One policy of a `VllmPolicyHost`: the `Engine` its `Swarm` drives.

    A `VllmEngine` whose parts are this policy's (gate, publisher, client) and the host's (process,
    supervisor), and whose trainer is the policy's torch `PolicyEngine`. `VllmEngine.__init__` is not
    run: it would load a model and start a process, both of which the host has.
    """

    def __init__(self, host: VllmPolicyHost, policy: PolicyEngine) -> None:
        self.host = host
        self.name = policy.name
        self.trainer = policy  # type: ignore[assignment]
        self.lora = policy.lora
        self.model_dir = host.model_dir
        self.tokenizer = policy.tokenizer
        self.max_positions = host.max_positions
        self.settings = host.settings
        self.served_name = policy.name
        self.removed = False
        peft, lock = host.trainer.peft, host.trainer.lock

        def save(path: Path) -> None:  # under the host's lock: `add` may change the modules it reads
            with lock:
                save_adapter(peft, path, adapter_name=policy.adapter)

        self._save_adapter = save
        with lock:
            layout = adapter_layout(peft, policy.adapter)
        replicas: list[Replica] = []
        for i, (process, supervisor) in enumerate(zip(host.processes, host.supervisors)):
            gate = DrainGate()
            publisher = AdapterPublisher(
                host.root(i) / "adapters" / policy.name,
                layout,
                policy.lora.rank,
                gate,
                supervisor,
                served_name=policy.name,
                version=policy.policy_version,
                drain_timeout_s=host.settings.drain_timeout_s,
                abort_by_pause=False,  # vLLM's /pause would end every policy's requests: this one's end themselves
            )
            # version 0: the fresh adapter (B = 0), loaded by the host; the other replicas copy the first's
            publisher.prepare(save if i == 0 else copy_adapter(replicas[0].publisher.good))  # type: ignore[arg-type]
            client = CompletionsClient(
                partial(getattr, process, "url"),
                policy.name,
                self.max_positions,
                self._eos_ids(),
                end_id=self._end_id(),
            )
            replicas.append(Replica(i, process, gate, supervisor, publisher, client))
        self.replicas = ReplicaSet(replicas)
        self._name_first()

    def _live(self) -> None:
        if self.removed:
            raise EngineError(f"policy {self.name!r} was removed")

    def _cut(self, replica: Replica) -> bool:
        """Removed, or this policy's sync gave up waiting for its requests on `replica` (that gate's
        `aborting`): end them by closing their streams; the other policies' requests run on (vLLM's
        /pause would end all)."""
        return self.removed or replica.gate.aborting

    def _formats(self) -> Any:
        return self.host.trainer.base.batcher

    async def close(self) -> None:
        """The host owns the process and the model: closing one policy's view closes nothing."""
        await asyncio.sleep(0)
