"""The `vllm` engine: a supervised vLLM server generates, the in-process torch trainer trains.

Generation is token-in/token-out over vLLM's `/v1/completions` (token-id prompt,
`return_token_ids`, the sampled tokens' raw logprobs, streamed); vLLM batches.
Training is `TorchEngine.train_step` (the same `policy_step` as the `torch`
engine), then the new weights reach vLLM before any later generation:

1. the trainer's tensors are written atomically to `candidate/model.safetensors`
   and validated (names, shapes, dtypes, finite) — a bad file is refused
   (`CheckpointRefused`) and vLLM keeps serving the last good weights;
2. the engine *drains*: new requests wait inside the engine, requests in flight
   finish on the old weights and carry the old version (pause mode `wait`). If
   they outlast `drain_timeout_s`, `/pause?mode=abort` ends them with
   `finish_reason: "abort"` and the tokens they had (still the old version);
3. `/pause?mode=wait` (nothing runs by now; it also holds anyone else's
   requests), `/collective_rpc roost_reload` (in-place reload + the tied-
   embeddings `lm_head` re-pack, worker/roost_vllm_ext.py), `/update_weight_version`,
   `/reset_prefix_cache`, `/resume`; the candidate becomes the last good file;
4. the waiting requests go out, labelled with the new version.

A reload vLLM fails leaves its model half-loaded (meta tensors; the next forward
kills the engine core, and an in-place reload of the old file fails too), so the
rollback is a restart of vLLM on the last good file. A vLLM that dies (crash,
kill, OOM) is restarted on the last good file by a watchdog, or by the next
request or sync that finds it gone; `counters()` (in the server's status) and each
step's metrics say how often. Every `Completion` carries the version of the
weights vLLM sampled it with, which can lag `policy_version` after a failed sync.

`top_logprobs = k` is vLLM's `logprobs: k` (ids via `return_tokens_as_token_ids`).
`response_format` is vLLM's own structured outputs (its guidance backend, the grammar
library of the torch engine, with the same compact JSON: `swarm.engine.vllm.server`), checked
first with that library here so a bad schema is the same `UnsupportedRequest` as there. vLLM
masks the logits *before* it computes even its "raw" logprobs, so under a constraint it reports
the grammar-renormalised ones; the trainer recomputes unmasked ones. A constrained request is
therefore not streamed token by token: once it is complete, one teacher-forced pass
(`prompt_logprobs`) over prompt + completion, still on the same weights, replaces them (and the
top-k) with the raw values, as the torch engine records (docs/constrained-decoding.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from swarm.engine.base import Completion, GenerateRequest, TokenChunk, TrainBatch, UnsupportedRequest
from swarm.engine.constrained import json_schema_of
from swarm.engine.vllm.server import VllmProcess, VllmSettings, find_python
from swarm.engine.vllm.weights import GOOD, CheckpointRefused, ServingDir, layout_of, unique_state, validate

log = logging.getLogger("swarm.engine.vllm")


class VllmEngineError(RuntimeError):
    """vLLM failed a request or a weight sync (the engine has recovered when this is raised)."""


class VllmEngine:
    def __init__(self, model_dir: Path, work_dir: Path, *, seed: int = 0, device: str | None = None,
                 settings: VllmSettings = VllmSettings(), served_name: str = "roost") -> None:
        python = find_python(settings.python)  # fail in one line before loading anything heavy
        from swarm.engine.torch_engine import TorchEngine  # lazy: torch and transformers take seconds

        self.trainer = TorchEngine(Path(model_dir), seed=seed, device=device, max_batch=1)
        self.model_dir = Path(model_dir)
        self.tokenizer = self.trainer.tokenizer
        self.max_positions = min(self.trainer.max_positions, settings.max_model_len or self.trainer.max_positions)
        self.settings = settings
        self.served_name = served_name
        self._eos = self._eos_ids()
        state = unique_state(self.trainer.model)
        self.serving = ServingDir(Path(work_dir) / "model", layout_of(state))
        self.serving.prepare(self.model_dir, state)
        self.process = VllmProcess(python, self.serving.root, served_name,
                                   dataclasses.replace(settings, max_model_len=self.max_positions),
                                   Path(work_dir) / "vllm.log", seed=seed)
        self._counters: Counter[str] = Counter()
        self._good_version = self._served_version = self.trainer.policy_version
        self._control = threading.RLock()  # one sync or restart at a time
        self._gate = threading.Condition()
        self._draining = False
        self._in_flight = 0
        self._closing = threading.Event()
        self.process.start()
        self._control_post("/update_weight_version", {"new_version": str(self._served_version)})
        self._watchdog = threading.Thread(target=self._watch, name="roost-vllm-watchdog", daemon=True)
        self._watchdog.start()

    # -- versions ---------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self.trainer.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        """Set on resume, right after `load` pushed those weights: the label follows."""
        self.trainer.policy_version = int(value)
        with self._control:
            if self._good_version == self._served_version:
                self._good_version = self._served_version = int(value)
                self._control_post("/update_weight_version", {"new_version": str(value)})

    @property
    def served_version(self) -> int:
        """The version of the weights vLLM serves now (labels new completions)."""
        return self._served_version

    def counters(self) -> dict[str, int]:
        """Supervision counters, shown in the swarm server's status."""
        keys = ("vllm_syncs", "vllm_sync_failures", "vllm_refused", "vllm_rollbacks", "vllm_restarts",
                "vllm_aborted_in_sync")
        return {k: int(self._counters[k]) for k in keys}

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
        reason, version = "length", self._served_version
        async for version, chunk in self._stream(request):
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
        body = self._body(request)
        async for item in self._sse(request, body, raw="response_format" in body):
            yield item

    async def _sse(self, request: GenerateRequest, body: dict[str, Any],
                   raw: bool = False) -> AsyncIterator[tuple[int, TokenChunk]]:
        """vLLM's streamed chunks; `raw` (a constrained request): one chunk of the whole completion
        with its raw logprobs, re-scored while still in flight (so on the same weights)."""
        k = request.params.top_logprobs
        while True:  # wait out a sync or restart without blocking the event loop
            with self._gate:
                if not self._draining:
                    self._in_flight += 1
                    version = self._served_version
                    break
            await asyncio.sleep(0.02)
        try:
            if not self.process.alive():
                await asyncio.to_thread(self._recover, "found dead before a request")
            async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None)) as client:
                async with client.stream("POST", self.process.url + "/v1/completions", json=body) as resp:
                    if resp.status_code != 200:
                        detail = (await resp.aread()).decode(errors="replace")[:500]
                        if resp.status_code == 400 and "response_format" in body:  # a schema vLLM refused
                            raise UnsupportedRequest("invalid_json_schema", f"vLLM refused the response_format: "
                                                                            f"{_error_message(detail)}")
                        raise VllmEngineError(f"vLLM answered {resp.status_code}: {detail}")
                    finished = False
                    chunks: list[TokenChunk] = []
                    async for line in resp.aiter_lines():
                        try:
                            chunk = _parse_chunk(line, k)
                        except json.JSONDecodeError:  # only the last line can be cut: vLLM closed the
                            log.warning("vLLM closed a stream mid-line; ending the request as aborted")
                            break  # stream early (a dying engine core), which ends as an abort below
                        if chunk is not None:
                            finished = chunk.finish_reason is not None
                            if raw:
                                chunks.append(chunk)
                            else:
                                yield version, chunk
                    if not finished:  # vLLM closed the stream early: an abort
                        aborted = TokenChunk([], [], "abort")
                        if raw:
                            chunks.append(aborted)
                        else:
                            yield version, aborted
                if raw:
                    for chunk in await self._unmasked(client, request.prompt_ids, chunks, k):
                        yield version, chunk
        except httpx.TransportError as exc:
            if not self._closing.is_set():
                await asyncio.to_thread(self._recover, f"request failed: {exc!r}")
            raise VllmEngineError(f"vLLM went away during a request ({exc!r}); it was restarted") from exc
        finally:
            with self._gate:
                self._in_flight -= 1
                self._gate.notify_all()

    def _body(self, request: GenerateRequest) -> dict[str, Any]:
        p = request.params
        room = self.max_positions - len(request.prompt_ids)
        if room <= 0:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens exceeds the context of {self.max_positions}")
        body: dict[str, Any] = {
            "model": self.served_name, "prompt": list(request.prompt_ids), "max_tokens": min(p.max_tokens, room),
            "temperature": p.temperature, "top_p": p.top_p, "logprobs": p.top_logprobs, "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stream": True, "skip_special_tokens": False, "ignore_eos": p.ignore_eos,
            "stop_token_ids": sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(self._eos))),
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        if p.response_format is not None and json_schema_of(p.response_format) is not None:
            body["response_format"] = json.loads(p.response_format)
        return body

    async def _unmasked(self, client: httpx.AsyncClient, prompt_ids: list[int], chunks: list[TokenChunk],
                        k: int) -> list[TokenChunk]:
        """`chunks` merged into one, its logprobs (and top-k) recomputed unmasked by a teacher-forced pass.

        The pass needs one position of room after the completion; a completion that filled the
        context keeps vLLM's grammar-renormalised logprobs (logged: the one case they are recorded).
        """
        ids = [t for c in chunks for t in c.token_ids]
        logps = [x for c in chunks for x in c.logprobs]
        tops = [t for c in chunks for t in (c.top_logprobs or [])] if k > 0 else None
        reason = next((c.finish_reason for c in reversed(chunks) if c.finish_reason), None)
        if ids and len(prompt_ids) + len(ids) < self.max_positions and reason != "abort":
            resp = await client.post(self.process.url + "/v1/completions", json={
                "model": self.served_name, "prompt": list(prompt_ids) + ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": k})
            if resp.status_code != 200:
                raise VllmEngineError(f"vLLM answered {resp.status_code} to a logprob pass: {resp.text[:300]}")
            rows = resp.json()["choices"][0]["prompt_logprobs"][len(prompt_ids):]
            logps = [float(row[str(tok)]["logprob"]) for row, tok in zip(rows, ids)]
            if tops is not None:
                tops = [sorted(((int(t), float(v["logprob"])) for t, v in row.items()),
                               key=lambda p: -p[1])[:k] for row in rows]
        elif ids:
            log.warning("constrained completion of %d tokens: no room for the unmasked logprob pass (%s); "
                        "recording vLLM's grammar-renormalised logprobs", len(ids), reason)
        return [TokenChunk(ids, logps, reason, top_logprobs=tops)]

    def logprobs(self, ids: list[int]) -> list[float]:
        """Teacher-forced logprob of each token after the first, as vLLM computes it (checks, tests)."""
        with self._gate:
            self._gate.wait_for(lambda: not self._draining)
            self._in_flight += 1
        try:
            resp = httpx.post(self.process.url + "/v1/completions", timeout=60, json={
                "model": self.served_name, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0})
            resp.raise_for_status()
            rows = resp.json()["choices"][0]["prompt_logprobs"][1:]
            return [float(row[str(tok)]["logprob"]) for row, tok in zip(rows, ids[1:])]
        finally:
            with self._gate:
                self._in_flight -= 1
                self._gate.notify_all()

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
        metrics["vllm_served_version"] = float(self._served_version)
        metrics.update({k: float(v) for k, v in self.counters().items()})
        return metrics

    def sync_weights(self) -> dict[str, float]:
        """Make vLLM serve the trainer's current weights as `policy_version` (after every `train_step`)."""
        path = self.serving.write_candidate(unique_state(self.trainer.model))
        return self._push(path, self.trainer.policy_version)

    def offer_weights(self, path: Path, version: int, *, validate_first: bool = True) -> dict[str, float]:
        """Serve the weights in safetensors file `path` as `version` (what a sync does with the trainer's).

        `CheckpointRefused` (nothing loaded) or `VllmEngineError` (rolled back) on failure.
        `validate_first=False` is for callers that validated the file already (tests timing a sync, and
        the test of the rollback of a reload vLLM itself fails).
        """
        tmp = self.serving.candidate.with_name(".offer.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, tmp)
        tmp.replace(self.serving.candidate)
        return self._push(self.serving.candidate, version, validate_first=validate_first)

    def _push(self, candidate: Path, version: int, validate_first: bool = True) -> dict[str, float]:
        t0 = time.perf_counter()
        if validate_first:
            try:
                validate(candidate, self.serving.layout)
            except CheckpointRefused:
                self._counters["vllm_refused"] += 1
                self.serving.discard_candidate()
                raise
        t_valid = time.perf_counter() - t0
        with self._control:
            if not self._healthy():
                self._recover("found dead before a weight sync")
            t_drain = time.perf_counter()
            drain_s = self._drain()
            try:
                t1 = time.perf_counter()
                self._control_post("/pause", params={"mode": "wait"})
                result = self._control_post("/collective_rpc", {"method": "roost_reload",
                                                                "args": [str(candidate.parent)]})
                reload_s = time.perf_counter() - t1
                self.serving.promote(candidate)
                self._good_version = self._served_version = int(version)
                self._control_post("/update_weight_version", {"new_version": str(version)})
                self._control_post("/reset_prefix_cache")
                self._control_post("/resume")
                self._counters["vllm_syncs"] += 1
            except VllmEngineError as exc:
                self._counters["vllm_sync_failures"] += 1
                self._counters["vllm_rollbacks"] += 1
                self.serving.discard_candidate()
                self._restart(f"weight reload failed ({exc}); rolling back to version {self._good_version}")
                raise VllmEngineError(f"vLLM could not load the weights of version {version}; serving "
                                      f"version {self._good_version} again (restarted)") from exc
            finally:
                self._undrain()
        worker = (result.get("results") or [{}])[0] if isinstance(result, dict) else {}
        return {"vllm_validate_s": t_valid, "vllm_wait_s": t_drain - t0 - t_valid, "vllm_drain_s": drain_s,
                "vllm_reload_s": reload_s,
                "vllm_worker_reload_s": float(worker.get("reload_s", 0.0))}

    def _drain(self) -> float:
        """Hold new requests; let those in flight finish (abort them after `drain_timeout_s`)."""
        t0 = time.perf_counter()
        with self._gate:
            self._draining = True
            if not self._gate.wait_for(lambda: self._in_flight == 0, timeout=self.settings.drain_timeout_s):
                log.warning("%d requests still running after %.0fs: aborting them for the weight sync",
                            self._in_flight, self.settings.drain_timeout_s)
                self._counters["vllm_aborted_in_sync"] += self._in_flight
                self._gate.release()
                try:
                    self._control_post("/pause", params={"mode": "abort"})  # they end with finish_reason abort
                finally:
                    self._gate.acquire()
                self._gate.wait_for(lambda: self._in_flight == 0, timeout=60)
        return time.perf_counter() - t0

    def _undrain(self) -> None:
        with self._gate:
            self._draining = False
            self._gate.notify_all()

    def _control_post(self, route: str, body: dict[str, Any] | None = None,
                      params: dict[str, str] | None = None) -> Any:
        try:
            resp = httpx.post(self.process.url + route, json=body, params=params, timeout=120)
        except httpx.HTTPError as exc:
            raise VllmEngineError(f"vLLM {route}: {exc!r}") from exc
        if resp.status_code != 200:
            raise VllmEngineError(f"vLLM {route} answered {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json()
        except json.JSONDecodeError:
            return None

    # -- supervision --------------------------------------------------------------
    def _healthy(self) -> bool:
        if not self.process.alive():
            return False
        try:
            return httpx.get(self.process.url + "/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def _recover(self, reason: str) -> None:
        """Restart vLLM on the last good weights unless another thread already did."""
        with self._control:
            if self._closing.is_set() or self._healthy():
                return
            with self._gate:
                self._draining = True
            try:
                self._restart(reason)
            finally:
                self._undrain()

    def _restart(self, reason: str) -> None:
        self._counters["vllm_restarts"] += 1
        log.warning("restarting vLLM (%s) on %s, version %d", reason, self.serving.root / GOOD,
                    self._good_version)
        self.process.stop()
        self.process.start()
        self._served_version = self._good_version
        self._control_post("/update_weight_version", {"new_version": str(self._good_version)})

    def _watch(self) -> None:
        while not self._closing.wait(2.0):
            if not self.process.alive() and not self._closing.is_set():
                try:
                    self._recover(f"process exited with {self.process.proc and self.process.proc.poll()}")
                except Exception:  # noqa: BLE001 - the watchdog must live on; the next request retries
                    log.exception("restarting vLLM failed")

    # -- persistence ----------------------------------------------------------------
    def save(self, path: Path) -> None:
        self.trainer.save(path)

    def load(self, path: Path) -> None:
        """Load a checkpoint into the trainer, then make vLLM serve it (raises if vLLM cannot)."""
        self.trainer.load(path)
        self.sync_weights()

    async def close(self) -> None:
        self._closing.set()
        with self._control:
            await asyncio.to_thread(self.process.stop)
        await self.trainer.close()


def _error_message(detail: str) -> str:
    """vLLM's error body (`{"error": {"message": ...}}`) to its message; the text as is otherwise."""
    try:
        body = json.loads(detail)
        return str(body["error"]["message"]) if isinstance(body.get("error"), dict) else str(body)
    except (json.JSONDecodeError, KeyError, AttributeError):
        return detail


def _top(row: dict[str, float] | None, k: int) -> list[tuple[int, float]]:
    """vLLM's top-logprob dict (keys `token_id:N`; it may add the sampled token) as the k best pairs."""
    pairs = [(int(key.rsplit(":", 1)[-1]), float(v)) for key, v in (row or {}).items()]
    return sorted(pairs, key=lambda p: -p[1])[:k]


def _parse_chunk(line: str, k: int = 0) -> TokenChunk | None:
    """One SSE line of a streamed `/v1/completions` into a `TokenChunk` (None: not a data chunk)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    if "error" in payload:
        raise VllmEngineError(f"vLLM stream error: {payload['error']}")
    choice = payload["choices"][0]
    ids = [int(t) for t in (choice.get("token_ids") or [])]
    logprobs = choice.get("logprobs") or {}
    lp = logprobs.get("token_logprobs") or []
    if len(lp) != len(ids):
        raise VllmEngineError(f"vLLM sent {len(ids)} tokens with {len(lp)} logprobs")
    tops = [_top(row, k) for row in (logprobs.get("top_logprobs") or [])] if k > 0 else None
    if tops is not None and len(tops) != len(ids):
        raise VllmEngineError(f"vLLM sent {len(ids)} tokens with {len(tops)} top-logprob rows")
    return TokenChunk(ids, [float(x) for x in lp], choice.get("finish_reason"), top_logprobs=tops)
