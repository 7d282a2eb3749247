"""`FakeEngine`: the Engine interface with scripted generation, for fast tests.

It loads a real Hugging Face tokenizer (so chat rendering, decoding and stop
strings behave as with a real model) but draws tokens from a seeded RNG instead
of a network, and its `train_step` only records the batch and bumps the policy
version. `save`/`load` write a small JSON next to the tokenizer, so checkpoint
and resume can be tested in milliseconds.

    engine = FakeEngine(model_dir, seed=0)                   # random ids, stop at eos
    engine = FakeEngine(model_dir, script=lambda ids: "42")  # always answers "42"

Determinism: a request with `seed` (or temperature 0) gets tokens that depend only
on the engine seed, the request seed and the prompt; others draw from one engine
RNG, so a fixed sequence of requests gives fixed outputs. The logprob of token t
is `token_logprob(t)`, a fixed function of the id, so tests can check alignment.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from pathlib import Path
from typing import AsyncIterator, Callable

from swarm.engine.base import Completion, GenerateRequest, SamplingParams, TokenChunk, TrainBatch

STATE_FILE = "fake_engine.json"
Script = Callable[[list[int]], "str | list[int]"]


def token_logprob(token_id: int) -> float:
    """The fake model's logprob of a sampled token: fixed per id, always in [-1.5, -0.5]."""
    return -0.5 - (token_id % 11) / 10.0


class FakeEngine:
    """Scripted, deterministic Engine. See the module docstring."""

    def __init__(
        self,
        model_dir: Path,
        seed: int = 0,
        *,
        script: Script | None = None,
        stop_probability: float = 0.08,
        token_delay_s: float = 0.0,
        train_delay_s: float = 0.0,
        chunk_tokens: int = 3,
    ) -> None:
        from transformers import AutoTokenizer  # lazy: transformers takes seconds; test fixtures import this module

        self.model_dir = Path(model_dir)
        self.seed = seed
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.script = script
        self.stop_probability = stop_probability
        self.token_delay_s = token_delay_s
        self.train_delay_s = train_delay_s
        self.chunk_tokens = max(1, chunk_tokens)
        self.policy_version = 0
        self.batches: list[TrainBatch] = []
        self.requests: list[GenerateRequest] = []
        self._rng = random.Random(f"fake-engine:{seed}")
        special = set(self.tokenizer.all_special_ids)
        self.eos_id = self.tokenizer.eos_token_id
        self._vocab = [i for i in range(len(self.tokenizer)) if i not in special]
        if (self.model_dir / STATE_FILE).exists():
            self.load(self.model_dir)

    # -- generation -----------------------------------------------------------
    def _plan(self, request: GenerateRequest) -> list[int]:
        """All ids this request would produce if nothing stops it early."""
        p = request.params
        if self.script is not None:
            out = self.script(list(request.prompt_ids))
            ids = self.tokenizer.encode(out, add_special_tokens=False) if isinstance(out, str) else list(out)
            return ids + ([self.eos_id] if self.eos_id is not None else [])
        if p.seed is not None or p.temperature == 0:
            digest = hashlib.sha256(f"{self.seed}:{p.seed}:{request.prompt_ids}".encode()).hexdigest()
            rng = random.Random(digest)
        else:
            rng = random.Random(self._rng.getrandbits(64))
        ids = []
        for _ in range(p.max_tokens):
            if self.eos_id is not None and rng.random() < self.stop_probability:
                ids.append(self.eos_id)
                break
            ids.append(rng.choice(self._vocab))
        return ids

    def _stops(self, params: SamplingParams, ids: list[int]) -> bool:
        if ids[-1] == self.eos_id or ids[-1] in params.stop_token_ids:
            return True
        if params.stop:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return any(s and s in text for s in params.stop)
        return False

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        self.requests.append(request)
        plan = self._plan(request)
        out: list[int] = []
        pending: list[int] = []
        for tok in plan[: request.params.max_tokens]:
            out.append(tok)
            pending.append(tok)
            stop = self._stops(request.params, out)
            if stop or len(pending) >= self.chunk_tokens or len(out) == request.params.max_tokens:
                reason = "stop" if stop else ("length" if len(out) == request.params.max_tokens else None)
                await asyncio.sleep(self.token_delay_s * len(pending))
                yield TokenChunk(pending, [token_logprob(t) for t in pending], reason)
                pending = []
                if reason:
                    return
        # plan shorter than max_tokens without an eos (a script without eos): a natural stop
        yield TokenChunk(pending, [token_logprob(t) for t in pending], "stop")

    async def generate(self, request: GenerateRequest) -> Completion:
        version = self.policy_version
        ids: list[int] = []
        logprobs: list[float] = []
        reason = "length"
        async for chunk in self.stream(request):
            ids += chunk.token_ids
            logprobs += chunk.logprobs
            reason = chunk.finish_reason or reason
        return Completion(list(request.prompt_ids), ids, logprobs, reason, version)

    # -- training -------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        for s in batch.samples:  # catch a server that builds malformed samples
            if not (len(s.input_ids) == len(s.loss_mask) == len(s.rollout_logprobs)):
                raise ValueError(f"sample of {s.episode_id}: ids/mask/logprobs lengths differ")
        if self.train_delay_s:
            time.sleep(self.train_delay_s)
        self.batches.append(batch)
        self.policy_version += 1
        tokens = sum(sum(s.loss_mask) for s in batch.samples)
        return {"loss": 0.0, "grad_norm": 0.0, "trained_tokens": float(tokens)}

    # -- persistence ----------------------------------------------------------
    def save(self, path: Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(path)  # a checkpoint is itself a loadable model dir
        config = self.model_dir / "config.json"
        if config.exists():
            (path / "config.json").write_bytes(config.read_bytes())
        state = {"policy_version": self.policy_version, "seed": self.seed, "steps": len(self.batches)}
        (path / STATE_FILE).write_text(json.dumps(state))

    def load(self, path: Path) -> None:
        state = json.loads((Path(path) / STATE_FILE).read_text())
        self.policy_version = int(state["policy_version"])

    async def close(self) -> None:
        return None
