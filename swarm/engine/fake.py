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

`top_logprobs = k` gives, per token, k (id, `token_logprob(id)`) pairs: the sampled token
and its k-1 successors in id order, sorted most likely first (`fake_top_logprobs`), so the
sampled token is always among them with its own logprob.

`response_format` is honoured with the torch engine's grammar machinery
(`swarm.engine.constrained`, llguidance): an invalid schema raises the same
`UnsupportedRequest`; a script's output is returned as scripted (writing JSON that fits is
the test's business); otherwise random tokens are drawn from those the grammar allows
(half the time from the ones that close a string, array or object, so outputs stay short)
and EOS comes as soon as the grammar accepts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from swarm.chat.tokenizers import load_tokenizer
from swarm.engine.base import Completion, GenerateRequest, SamplingParams, TokenChunk, TrainBatch

STATE_FILE = "fake_engine.json"
Script = Callable[[list[int]], "str | list[int]"]


def token_logprob(token_id: int) -> float:
    """The fake model's logprob of a sampled token: fixed per id, always in [-1.5, -0.5]."""
    return -0.5 - (token_id % 11) / 10.0


def fake_top_logprobs(token_id: int, k: int, vocab: int) -> list[tuple[int, float]]:
    """The fake's k most likely tokens where `token_id` was sampled: it and its successors, best first."""
    ids = [(token_id + j) % vocab for j in range(min(k, vocab))]
    return sorted(((i, token_logprob(i)) for i in ids), key=lambda p: (-p[1], p[0]))


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
        history: int | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.seed = seed
        self.tokenizer = load_tokenizer(self.model_dir)  # no torch: a fake-engine server starts without it
        self.script = script
        self.stop_probability = stop_probability
        self.token_delay_s = token_delay_s
        self.train_delay_s = train_delay_s
        self.chunk_tokens = max(1, chunk_tokens)
        self.policy_version = 0
        # what tests inspect: every request and batch in process (history=None), or the last `history`
        # of each where a long-running server must not keep them all (`swarm serve --engine fake`)
        self.batches: deque[TrainBatch] = deque(maxlen=history)
        self.requests: deque[GenerateRequest] = deque(maxlen=history)
        self.steps = 0
        self._rng = random.Random(f"fake-engine:{seed}")
        special = set(self.tokenizer.all_special_ids)
        self.eos_id = self.tokenizer.eos_token_id
        self._vocab = [i for i in range(len(self.tokenizer)) if i not in special]
        self._grammars: Any = None  # swarm.engine.constrained.Grammars, built by the first response_format
        self._closers: set[int] = set()
        if (self.model_dir / STATE_FILE).exists():
            self.load(self.model_dir)

    # -- generation -----------------------------------------------------------
    def _plan(self, request: GenerateRequest) -> list[int]:
        """All ids this request would produce if nothing stops it early."""
        p = request.params
        matcher = self.grammars().matcher(p.response_format) if p.response_format is not None else None
        if self.script is not None:
            out = self.script(list(request.prompt_ids))
            ids = self.tokenizer.encode(out, add_special_tokens=False) if isinstance(out, str) else list(out)
            return ids + ([self.eos_id] if self.eos_id is not None else [])
        if p.seed is not None or p.temperature == 0:
            digest = hashlib.sha256(f"{self.seed}:{p.seed}:{request.prompt_ids}".encode()).hexdigest()
            rng = random.Random(digest)
        else:
            rng = random.Random(self._rng.getrandbits(64))
        if matcher is not None:
            return self._constrained_plan(matcher, rng, p.max_tokens)
        ids = []
        for _ in range(p.max_tokens):
            if self.eos_id is not None and rng.random() < self.stop_probability:
                ids.append(self.eos_id)
                break
            ids.append(rng.choice(self._vocab))
        return ids

    def grammars(self) -> Any:
        """The grammar compiler, built on first use (it imports torch: most fake-engine tests never need it)."""
        if self._grammars is None:
            from swarm.engine.constrained import Grammars  # lazy: torch and llguidance, for response_format only

            end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")  # a constrained turn ends as the template's
            eos = [i for i in (self.eos_id, end) if isinstance(i, int) and i != self.tokenizer.unk_token_id]
            self._grammars = Grammars(self.tokenizer, len(self.tokenizer), eos)
            self._closers = {i for i in self._vocab if set('"]}') & set(self.tokenizer.decode([i]))}
        return self._grammars

    def _constrained_plan(self, matcher: Any, rng: random.Random, max_tokens: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < max_tokens:
            if matcher.is_accepting() or matcher.is_stopped():
                return ids + self.grammars().end_ids[:1]
            allowed = self.grammars().fill_masks([matcher])[0].nonzero().squeeze(-1).tolist()
            closing = [t for t in allowed if t in self._closers]
            tok = rng.choice(closing if closing and rng.random() < 0.5 else allowed)
            matcher.consume_token(tok)
            ids.append(tok)
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
                yield self._chunk(request.params, pending, reason)
                pending = []
                if reason:
                    return
        # plan shorter than max_tokens without an eos (a script without eos): a natural stop
        yield self._chunk(request.params, pending, "stop")

    def _chunk(self, params: SamplingParams, ids: list[int], reason: str | None) -> TokenChunk:
        k = params.top_logprobs
        tops = [fake_top_logprobs(t, k, len(self.tokenizer)) for t in ids] if k > 0 else None
        return TokenChunk(ids, [token_logprob(t) for t in ids], reason, top_logprobs=tops)

    async def generate(self, request: GenerateRequest) -> Completion:
        version = self.policy_version
        ids: list[int] = []
        logprobs: list[float] = []
        tops: list[list[tuple[int, float]]] | None = [] if request.params.top_logprobs > 0 else None
        reason = "length"
        async for chunk in self.stream(request):
            ids += chunk.token_ids
            logprobs += chunk.logprobs
            if tops is not None:
                tops += chunk.top_logprobs or []
            reason = chunk.finish_reason or reason
        return Completion(list(request.prompt_ids), ids, logprobs, reason, version, top_logprobs=tops)

    # -- training -------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        for s in batch.samples:  # catch a server that builds malformed samples
            if not (len(s.input_ids) == len(s.loss_mask) == len(s.rollout_logprobs)):
                raise ValueError(f"sample of {s.episode_id}: ids/mask/logprobs lengths differ")
        if self.train_delay_s:
            time.sleep(self.train_delay_s)
        self.batches.append(batch)
        self.steps += 1
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
        state = {"policy_version": self.policy_version, "seed": self.seed, "steps": self.steps}
        (path / STATE_FILE).write_text(json.dumps(state))

    def load(self, path: Path) -> None:
        state = json.loads((Path(path) / STATE_FILE).read_text())
        self.policy_version = int(state["policy_version"])

    async def close(self) -> None:
        return None


class FakePolicyHost:
    """Several policies for fast server tests: one independent `FakeEngine` each (nothing shared to check)."""

    def __init__(self, model_dir: Path, seed: int = 0) -> None:
        self.model_dir, self.seed = Path(model_dir), seed
        self.policies: dict[str, FakeEngine] = {}

    def add(self, name: str, settings: Any = None) -> FakeEngine:
        if name in self.policies:
            raise ValueError(f"a policy named {name!r} already exists")
        engine = self.policies[name] = FakeEngine(self.model_dir, seed=self.seed + len(self.policies), history=8)
        return engine

    def remove(self, name: str) -> None:
        del self.policies[name]

    def policy(self, name: str) -> FakeEngine:
        return self.policies[name]

    async def close(self) -> None:
        for engine in self.policies.values():
            await engine.close()
