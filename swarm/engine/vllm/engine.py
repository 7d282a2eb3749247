"""The `vllm` engine: a supervised vLLM server generates, the in-process torch trainer trains.

`VllmEngine` composes four parts, each tested alone (tests/engine_vllm/test_vllm_stream.py,
test_vllm_publisher.py, test_vllm_supervisor.py, without vLLM):

* `stream.CompletionsClient`: token-in/token-out `/v1/completions` over SSE (raw logprobs,
  top-k, aborts, the unmasked logprob pass of a constrained request);
* `publisher.WeightPublisher`: after every `train_step` (the same `policy_step` as the
  `torch` engine) the new weights reach vLLM before any later generation (write, validate,
  drain, reload, relabel, resume; a rollback when vLLM cannot load them); with a LoRA rank
  (`lora=LoraSettings(rank=r)`) `adapters.AdapterPublisher` instead: vLLM serves the frozen base
  with LoRA enabled and each step's adapter alone is written, validated, loaded as a new named
  version (`{served}-v{N}`, the `model` new requests name) and the previous one unloaded;
* `supervisor.Supervisor` over `server.VllmProcess`: a vLLM that dies (crash, kill, OOM) is
  restarted on the last good file by a watchdog, or by the next request or sync that finds
  it gone;
* `gate.DrainGate`, which they share: every request is admitted through it, labelled with
  the version served at admission, and a sync or restart waits it out.

With `--vllm-replicas N` (`settings.replicas`) there are N such processes, each with its own four
parts (`replicas.Replica`); `replicas.ReplicaSet` routes each request (least loaded, an episode's
calls to one replica: `GenerateRequest.affinity`), pushes each step's weights to all of them and
restarts a dead one while the others serve (docs/replicas.md). The first replica's parts keep the
single-process names (`process`, `gate`, `supervisor`, `publisher`, `client`, `serving`).

This module is the glue: admission and recovery around each request, the trainer, and the
Engine interface. `counters()` (in the server's status) and each step's metrics say how
often syncs failed and vLLM restarted. Every `Completion` carries the version of the weights
vLLM sampled it with, which can lag `policy_version` after a failed sync.

`response_format` is vLLM's own structured outputs (its guidance backend, the grammar library
of the torch engine, with the same compact JSON: `swarm.engine.vllm.server`), checked first
with that library here so a bad schema is the same `UnsupportedRequest` as there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import torch

from swarm.chat.tool_grammar import END_OF_TURN
from swarm.config.lora import LoraSettings
from swarm.config.vllm import VllmSettings
from swarm.engine.base import Completion, GenerateRequest, TokenChunk, TrainBatch, completion_of
from swarm.engine.vllm.adapters import AdapterPublisher, adapter_layout, copy_adapter
from swarm.engine.vllm.errors import ReplicaGone, VllmEngineError
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.publisher import WeightPublisher
from swarm.engine.vllm.replicas import Replica, ReplicaSet
from swarm.engine.vllm.server import VllmProcess, find_python
from swarm.engine.vllm.stream import CompletionsClient
from swarm.engine.vllm.supervisor import Supervisor
from swarm.engine.vllm.weights import CheckpointRefused, ServingDir, layout_of, unique_state

__all__ = ["VllmEngine", "VllmEngineError", "end_of_turn_id", "eos_ids"]

log = logging.getLogger("swarm.engine.vllm")


def eos_ids(tok: Any) -> list[int]:
    """The ids that end a completion: the template's end of turn, end of text and the tokenizer's EOS."""
    ids = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    ids.add(tok.eos_token_id)
    return sorted(i for i in ids if isinstance(i, int) and i >= 0 and i != tok.unk_token_id)


def end_of_turn_id(tok: Any) -> int | None:
    """The template's end of turn (`<|im_end|>`) where it is one of the EOS ids: a constrained JSON
    answer ends with it, as on the torch engine (`Grammars.end_ids`); None leaves vLLM its own EOS."""
    end = tok.convert_tokens_to_ids(END_OF_TURN)
    return end if isinstance(end, int) and end in eos_ids(tok) else None


class VllmEngine:
    """The Engine over a supervised vLLM server (generation) and an in-process `TorchEngine` (training)."""

    def __init__(
        self,
        model_dir: Path,
        work_dir: Path,
        *,
        seed: int = 0,
        device: str | None = None,
        settings: VllmSettings = VllmSettings(),
        served_name: str = "roost",
        lora: LoraSettings | None = None,
    ) -> None:
        python = find_python(settings.python)  # fail in one line before loading anything heavy
        from swarm.engine.lora import save_adapter  # lazy: beside the trainer's
        from swarm.engine.torch_engine import TorchEngine  # lazy: torch and transformers take seconds

        self.lora = lora or LoraSettings()
        self.trainer = TorchEngine(Path(model_dir), seed=seed, device=device, max_batch=1, lora=self.lora)
        self.model_dir = Path(model_dir)
        work_dir = Path(work_dir)
        self.tokenizer = self.trainer.tokenizer
        self.max_positions = min(self.trainer.max_positions, settings.max_model_len or self.trainer.max_positions)
        self.settings = settings
        self.served_name = served_name
        self._save_adapter = lambda path: save_adapter(self.trainer.model, path)
        state = None if self.lora.enabled else unique_state(self.trainer.model)  # LoRA: only adapters travel
        self.replicas = ReplicaSet([])  # filled below: a replica is built from the first one's files
        for i in range(settings.replicas):
            self.replicas.add(self._replica(i, python, work_dir, seed, state))
        self._name_first()
        self.replicas.start()

    def _name_first(self) -> None:
        """The first replica's parts under the names the engine had with one process (checks, tests, bench)."""
        first = self.replicas[0]
        self.process, self.gate, self.supervisor = first.process, first.gate, first.supervisor
        self.publisher, self.client = first.publisher, first.client

    def _replica(
        self, i: int, python: Path, work_dir: Path, seed: int, state: dict[str, torch.Tensor] | None
    ) -> Replica:
        """Replica `i`: its process (own port, log, seed and devices), gate, supervisor, publisher and client.

        Replica 0 lives in `work_dir` as the single process always did; replica i in `work_dir/replica-i`,
        serving what replica 0 serves (a hard-linked weights file, or a copy of its adapter)."""
        settings, root = self.settings, (work_dir if i == 0 else work_dir / f"replica-{i}")
        first = self.replicas[0] if i else None
        serving: ServingDir | None = None
        if state is None:  # vLLM serves the frozen base as it is: only adapters travel
            served_dir = self.model_dir
        else:
            serving = ServingDir(root / "model", layout_of(state))
            if first is None:
                serving.prepare(self.model_dir, state)
                self.serving = serving
            else:
                serving.mirror(self.serving)
            served_dir = serving.root
        devices = settings.device_groups
        process = VllmProcess(
            python,
            served_dir,
            self.served_name,
            settings,
            root / "vllm.log",
            seed=seed + i,
            max_model_len=self.max_positions,
            lora_rank=self.lora.rank,
            port=settings.port + i if settings.port else None,
            cuda_devices=devices[i] if devices else None,
        )
        gate = DrainGate()
        supervisor = Supervisor(process, gate)
        publisher: WeightPublisher | AdapterPublisher
        if serving is None:
            publisher = AdapterPublisher(
                root / "adapters",
                adapter_layout(self.trainer.model),
                self.lora.rank,
                gate,
                supervisor,
                served_name=self.served_name,
                version=self.trainer.policy_version,
                drain_timeout_s=settings.drain_timeout_s,
            )
            first_good = (
                first.publisher.good if first is not None and isinstance(first.publisher, AdapterPublisher) else None
            )
            # version 0: the fresh adapter (B = 0), loaded at start
            publisher.prepare(self._save_adapter if first_good is None else copy_adapter(first_good))
        else:
            publisher = WeightPublisher(
                serving, gate, supervisor, version=self.trainer.policy_version, drain_timeout_s=settings.drain_timeout_s
            )
        supervisor.on_start = publisher.relabel  # every (re)start serves the last good file
        client = CompletionsClient(
            lambda: process.url, self.served_name, self.max_positions, self._eos_ids(), end_id=self._end_id()
        )
        return Replica(i, process, gate, supervisor, publisher, client)

    # -- versions ---------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self.trainer.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        """Set on resume, right after `load` pushed those weights: the label follows."""
        self.trainer.policy_version = int(value)
        self.replicas.adopt(int(value))

    @property
    def served_version(self) -> int:
        """The version of the weights vLLM serves now (labels new completions; replicas: the oldest served)."""
        return self.replicas.served_version

    def counters(self) -> dict[str, int]:
        """Supervision counters, shown in the swarm server's status (LoRA: adapters unloaded, and held now).

        Replicas: summed over them (a step's sync counts once per replica), with how many are up and the
        requests routed to each."""
        c = self.replicas.counters()
        out = {
            "vllm_syncs": c["syncs"],
            "vllm_sync_failures": c["sync_failures"],
            "vllm_refused": c["refused"],
            "vllm_rollbacks": c["rollbacks"],
            "vllm_restarts": c["restarts"],
            "vllm_aborted_in_sync": c["aborted_in_sync"],
        }
        if isinstance(self.publisher, AdapterPublisher):
            out["vllm_adapters_unloaded"] = c["unloaded"]
            out["vllm_adapters_loaded"] = len(self.publisher.loaded)
        if len(self.replicas) > 1:
            out["vllm_replicas_up"] = sum(r.up() for r in self.replicas)
            out.update({f"vllm_requests_r{r.index}": r.requests for r in self.replicas})
        return out

    def _eos_ids(self) -> list[int]:
        return eos_ids(self.tokenizer)

    def _end_id(self) -> int | None:
        return end_of_turn_id(self.tokenizer)

    # -- generation -------------------------------------------------------------
    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        async for _version, chunk in self._stream(request):
            yield chunk

    async def generate(self, request: GenerateRequest) -> Completion:
        labelled = [pair async for pair in self._stream(request)]
        version = labelled[-1][0] if labelled else self.served_version  # the last chunk's version labels it
        return completion_of(request, [chunk for _, chunk in labelled], version)

    async def _stream(self, request: GenerateRequest) -> AsyncIterator[tuple[int, TokenChunk]]:
        self._live()
        fmt = request.params.response_format
        if fmt is not None:  # compiled with the library vLLM's guidance backend runs, off the event loop:
            # a bad schema is refused with the torch engine's message, before vLLM sees it
            await asyncio.to_thread(self._formats().compile, fmt)
        body = self.client.body(request)  # the same for every replica: each names its own model below
        tried: set[int] = set()
        while True:  # a replica that went away before its first token: the request goes to another one
            replica = self.replicas.choose(request.affinity, tried)
            started = False
            try:
                async with self._admitted(replica) as (version, model):
                    self._live()  # e.g. its policy removed while it waited at the gate
                    body["model"] = model
                    async with aclosing(replica.client.completions(request, body)) as chunks:
                        async for chunk in chunks:
                            if self._cut(replica):  # closing the stream makes vLLM abort the request, only this one
                                yield version, TokenChunk([], [], "abort")
                                return
                            started = True
                            yield version, chunk
                return
            except ReplicaGone:
                tried.add(replica.index)
                if started or not self.replicas.others_up(tried):
                    raise
                log.warning("vLLM replica %d went away before answering: request sent to another", replica.index)

    def _live(self) -> None:
        """Raise if this engine may not take a request (a policy engine removed from its host)."""

    def _cut(self, replica: Replica) -> bool:
        """Whether the requests in flight on `replica` are to end now ("abort") by closing their streams."""
        return False

    def _formats(self) -> Any:
        """The torch batcher whose format compiler checks a `response_format` before vLLM sees it."""
        return self.trainer.batcher

    @asynccontextmanager
    async def _admitted(self, replica: Replica) -> AsyncIterator[tuple[int, str]]:
        """One request through `replica`'s gate (waiting out a sync or restart), labelled with the version
        served at admission and naming its model; a vLLM found dead, or gone during the request, is restarted
        (one process: before the error is raised; one replica of several: in the background, `ReplicaGone`)."""
        sup = replica.supervisor
        label = await replica.gate.enter(lambda: replica.label(self.served_name))
        try:
            if not sup.alive():
                await asyncio.to_thread(sup.recover, "found dead before a request")
            yield label
        except httpx.TransportError as exc:
            if len(self.replicas) > 1:
                if not sup.closing:
                    self.replicas.recover_later(replica, f"request failed: {exc!r}")
                raise ReplicaGone(f"vLLM replica {replica.index} went away during a request ({exc!r})") from exc
            if not sup.closing:
                await asyncio.to_thread(sup.recover, f"request failed: {exc!r}")
            raise VllmEngineError(f"vLLM went away during a request ({exc!r}); it was restarted") from exc
        finally:
            replica.gate.leave()

    def logprobs(self, ids: list[int], replica: int | None = None) -> list[float]:
        """Teacher-forced logprob of each token after the first, as vLLM computes it (checks, tests); on
        replica number `replica` (None: the one the router picks)."""
        r = self.replicas.choose() if replica is None else self.replicas[replica]
        _version, model = r.gate.enter_blocking(lambda: r.label(self.served_name))
        try:
            return r.client.logprobs(ids, model)
        finally:
            r.gate.leave()

    # -- training and weight sync ----------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        metrics = self.trainer.train_step(batch)
        t0 = time.perf_counter()
        try:
            sync = self.sync_weights()
            metrics.update(sync)
            metrics["vllm_sync_failed"] = 0.0
        except (CheckpointRefused, VllmEngineError) as exc:
            # the step stands; vLLM serves the last good weights and labels completions with their version
            log.error("weights of policy version %d did not reach vLLM: %s", self.policy_version, exc)
            metrics["vllm_sync_failed"] = 1.0
        metrics["vllm_sync_s"] = time.perf_counter() - t0
        metrics["vllm_served_version"] = float(self.served_version)
        metrics.update({k: float(v) for k, v in self.counters().items()})
        return metrics

    def sync_weights(self) -> dict[str, float]:
        """Make vLLM serve the trainer's current weights (LoRA: its adapter) as `policy_version` (after every
        `train_step`)."""
        version, publisher = self.trainer.policy_version, self.publisher
        if isinstance(publisher, AdapterPublisher):
            return self.replicas.publish(lambda: publisher.write(self._save_adapter, version), version)
        state = unique_state(self.trainer.model)
        return self.replicas.publish(lambda: publisher.serving.write_candidate(state), version)

    def offer_weights(self, path: Path, version: int, *, validate_first: bool = True) -> dict[str, float]:
        """Serve the weights in safetensors file `path` (LoRA: the adapter in directory `path`) as `version`
        (what a sync does with the trainer's).

        `CheckpointRefused` (nothing loaded) or `VllmEngineError` (rolled back) on failure.
        `validate_first=False` is for callers that validated the file already (tests timing a sync, and
        the test of the rollback of a reload vLLM itself fails).
        """
        return self.replicas.publish(
            lambda: self.publisher.stage(Path(path), version), version, validate_first=validate_first
        )

    # -- persistence ----------------------------------------------------------------
    def save(self, path: Path) -> None:
        self.trainer.save(path)

    def load(self, path: Path) -> None:
        """Load a checkpoint (LoRA: an adapter) into the trainer, then make vLLM serve it (raises if vLLM cannot)."""
        self.trainer.load(path)
        self.sync_weights()

    async def close(self) -> None:
        await asyncio.to_thread(self.replicas.close)
        await self.trainer.close()
