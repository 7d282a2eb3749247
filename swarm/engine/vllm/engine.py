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
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from swarm.config.lora import LoraSettings
from swarm.config.vllm import VllmSettings
from swarm.engine.base import Completion, GenerateRequest, TokenChunk, TrainBatch
from swarm.engine.vllm.adapters import AdapterPublisher, adapter_layout
from swarm.engine.vllm.errors import VllmEngineError
from swarm.engine.vllm.gate import DrainGate
from swarm.engine.vllm.publisher import WeightPublisher
from swarm.engine.vllm.server import VllmProcess, find_python
from swarm.engine.vllm.stream import CompletionsClient
from swarm.engine.vllm.supervisor import Supervisor
from swarm.engine.vllm.weights import CheckpointRefused, ServingDir, layout_of, unique_state

__all__ = ["VllmEngine", "VllmEngineError"]

log = logging.getLogger("swarm.engine.vllm")


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
        if self.lora.enabled:  # vLLM serves the frozen base as it is: only adapters travel
            served_dir = self.model_dir
        else:
            state = unique_state(self.trainer.model)
            self.serving = ServingDir(work_dir / "model", layout_of(state))
            self.serving.prepare(self.model_dir, state)
            served_dir = self.serving.root
        self.process = VllmProcess(
            python,
            served_dir,
            served_name,
            settings,
            work_dir / "vllm.log",
            seed=seed,
            max_model_len=self.max_positions,
            lora_rank=self.lora.rank,
        )
        self.gate = DrainGate()
        self.supervisor = Supervisor(self.process, self.gate)
        self.publisher: WeightPublisher | AdapterPublisher
        if self.lora.enabled:
            self.publisher = AdapterPublisher(
                work_dir / "adapters",
                adapter_layout(self.trainer.model),
                self.lora.rank,
                self.gate,
                self.supervisor,
                served_name=served_name,
                version=self.trainer.policy_version,
                drain_timeout_s=settings.drain_timeout_s,
            )
            self._save_adapter = lambda path: save_adapter(self.trainer.model, path)
            self.publisher.prepare(self._save_adapter)  # version 0: the fresh adapter (B = 0), loaded at start
        else:
            self.publisher = WeightPublisher(
                self.serving,
                self.gate,
                self.supervisor,
                version=self.trainer.policy_version,
                drain_timeout_s=settings.drain_timeout_s,
            )
        self.supervisor.on_start = self.publisher.relabel  # every (re)start serves the last good file
        self.client = CompletionsClient(lambda: self.process.url, served_name, self.max_positions, self._eos_ids())
        self.supervisor.start()

    # -- versions ---------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self.trainer.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        """Set on resume, right after `load` pushed those weights: the label follows."""
        self.trainer.policy_version = int(value)
        self.publisher.adopt(int(value))

    @property
    def served_version(self) -> int:
        """The version of the weights vLLM serves now (labels new completions)."""
        return self.publisher.served_version

    def counters(self) -> dict[str, int]:
        """Supervision counters, shown in the swarm server's status (LoRA: adapters unloaded, and held now)."""
        c = self.publisher.counters
        out = {
            "vllm_syncs": c["syncs"],
            "vllm_sync_failures": c["sync_failures"],
            "vllm_refused": c["refused"],
            "vllm_rollbacks": c["rollbacks"],
            "vllm_restarts": self.supervisor.restarts,
            "vllm_aborted_in_sync": c["aborted_in_sync"],
        }
        if isinstance(self.publisher, AdapterPublisher):
            out["vllm_adapters_unloaded"] = c["unloaded"]
            out["vllm_adapters_loaded"] = len(self.publisher.loaded)
        return out

    def _label(self) -> tuple[int, str]:
        """What a request admitted now is labelled with, and the vLLM model it names (LoRA: that version's)."""
        p = self.publisher
        return p.served_version, (p.served_model if isinstance(p, AdapterPublisher) else self.served_name)

    def _eos_ids(self) -> list[int]:
        tok = self.tokenizer
        ids = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
        ids.add(tok.eos_token_id)
        return sorted(i for i in ids if isinstance(i, int) and i >= 0 and i != tok.unk_token_id)

    # -- generation -------------------------------------------------------------
    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        async for _version, chunk in self._stream(request):
            yield chunk

    async def generate(self, request: GenerateRequest) -> Completion:
        ids: list[int] = []
        logps: list[float] = []
        tops: list[list[tuple[int, float]]] | None = [] if request.params.top_logprobs > 0 else None
        reason, version = "length", self.served_version
        async for at, chunk in self._stream(request):
            version = at
            ids.extend(chunk.token_ids)
            logps.extend(chunk.logprobs)
            if tops is not None:
                tops.extend(chunk.top_logprobs or [])
            reason = chunk.finish_reason or reason
        return Completion(list(request.prompt_ids), ids, logps, reason, version, top_logprobs=tops)

    async def _stream(self, request: GenerateRequest) -> AsyncIterator[tuple[int, TokenChunk]]:
        fmt = request.params.response_format
        if fmt is not None:  # compiled with the library vLLM's guidance backend runs, off the event loop:
            # a bad schema is refused with the torch engine's message, before vLLM sees it
            await asyncio.to_thread(self.trainer.batcher.compile, fmt)
        body = self.client.body(request)
        async with self._admitted() as (version, model):
            body["model"] = model
            async for chunk in self.client.completions(request, body):
                yield version, chunk

    @asynccontextmanager
    async def _admitted(self) -> AsyncIterator[tuple[int, str]]:
        """One request through the gate (waiting out a sync or restart), labelled with the version served
        at admission and naming its model; a vLLM found dead, or gone during the request, is restarted."""
        label = await self.gate.enter(self._label)
        try:
            if not self.supervisor.alive():
                await asyncio.to_thread(self.supervisor.recover, "found dead before a request")
            yield label
        except httpx.TransportError as exc:
            if not self.supervisor.closing:
                await asyncio.to_thread(self.supervisor.recover, f"request failed: {exc!r}")
            raise VllmEngineError(f"vLLM went away during a request ({exc!r}); it was restarted") from exc
        finally:
            self.gate.leave()

    def logprobs(self, ids: list[int]) -> list[float]:
        """Teacher-forced logprob of each token after the first, as vLLM computes it (checks, tests)."""
        _version, model = self.gate.enter_blocking(self._label)
        try:
            return self.client.logprobs(ids, model)
        finally:
            self.gate.leave()

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
        if isinstance(self.publisher, AdapterPublisher):
            return self.publisher.publish(self._save_adapter, self.trainer.policy_version)
        return self.publisher.publish(unique_state(self.trainer.model), self.trainer.policy_version)

    def offer_weights(self, path: Path, version: int, *, validate_first: bool = True) -> dict[str, float]:
        """Serve the weights in safetensors file `path` (LoRA: the adapter in directory `path`) as `version`
        (what a sync does with the trainer's).

        `CheckpointRefused` (nothing loaded) or `VllmEngineError` (rolled back) on failure.
        `validate_first=False` is for callers that validated the file already (tests timing a sync, and
        the test of the rollback of a reload vLLM itself fails).
        """
        return self.publisher.offer(path, version, validate_first=validate_first)

    # -- persistence ----------------------------------------------------------------
    def save(self, path: Path) -> None:
        self.trainer.save(path)

    def load(self, path: Path) -> None:
        """Load a checkpoint (LoRA: an adapter) into the trainer, then make vLLM serve it (raises if vLLM cannot)."""
        self.trainer.load(path)
        self.sync_weights()

    async def close(self) -> None:
        await asyncio.to_thread(self.supervisor.close)
        if isinstance(self.publisher, AdapterPublisher):
            self.publisher.close()
        await self.trainer.close()
