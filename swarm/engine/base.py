"""The engine interface: the one narrow seam between the swarm server and a model.

An engine generates from token ids and trains on token ids. It knows nothing of
HTTP, episodes or chat messages; the server renders messages to ids and turns
recorded calls into `TrainSample`s. Three implementations fit behind it: the
in-process `torch` engine (the embedded default), a vLLM-served engine, and a
VERL-trained engine for GPU clusters. Keeping the surface this small is what
lets those swap in without touching the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from swarm.config.train import TrainConfig
from swarm.samples import TrainSample


class EngineError(RuntimeError):
    """The engine cannot do what it was asked with what it was given (a checkpoint that does not fit its
    settings, a policy removed): a one-line reason, which `swarm serve` prints at start instead of a trace."""


class UnsupportedRequest(Exception):
    """The engine cannot honour what a request asks (a constraint, a knob): the server answers
    400 with `code` and `message`, before anything is generated or recorded."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of the sampler. Mirrors the OpenAI knobs we honour."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # as vLLM's: fixed-length generation for benchmarks
    #: k > 0: also return the k most likely tokens at each position (raw logprobs, as `logprobs`)
    top_logprobs: int = 0
    #: OpenAI's `response_format` object as canonical JSON text (`json.dumps(obj, sort_keys=True)`;
    #: text keeps the dataclass hashable), e.g. '{"type": "json_object"}'. None: unconstrained.
    #: An engine that cannot honour it raises `UnsupportedRequest` before generating anything.
    response_format: str | None = None


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams = SamplingParams()
    #: requests of one key (the server passes the episode id) should run where the earlier ones ran: an
    #: engine of several generators (`--vllm-replicas`) sends them to one, whose prefix cache holds their
    #: shared prompt; an engine of one ignores it. None: no preference.
    affinity: str | None = None


@dataclass
class TokenChunk:
    """Tokens produced since the previous chunk of one streamed request.

    `logprobs` are the raw model log-probabilities (temperature 1, no top-p) of
    the sampled tokens: the quantity a policy-gradient loss recomputes, so the
    PPO ratio starts at exactly 1 on-policy.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None  # "stop" | "length" | "abort" on the last chunk
    #: with `SamplingParams.top_logprobs = k`: per token of `token_ids`, the k most likely
    #: (token id, raw logprob) pairs at that position, most likely first
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    top_logprobs: list[list[tuple[int, float]]] | None = None  # as `TokenChunk.top_logprobs`


def completion_of(request: GenerateRequest, chunks: list[TokenChunk], version: int) -> Completion:
    """A request's streamed chunks as one `Completion` labelled `version`: their tokens and logprobs
    joined, their top-k too when the request asked for it, and the last finish reason ("length" if none)."""
    tops = [t for c in chunks for t in (c.top_logprobs or [])] if request.params.top_logprobs > 0 else None
    reason = next((c.finish_reason for c in reversed(chunks) if c.finish_reason), "length")
    ids = [t for c in chunks for t in c.token_ids]
    logps = [x for c in chunks for x in c.logprobs]
    return Completion(list(request.prompt_ids), ids, logps, reason, version, top_logprobs=tops)


@dataclass
class TrainBatch:
    samples: list[TrainSample]
    config: TrainConfig = field(default_factory=TrainConfig)
    #: per sample, aligned with its `input_ids`: a term added to each trained token's advantage
    #: (on-policy distillation's, swarm/algorithms/distill.py); None: the episode's advantage alone
    token_advantages: list[list[float]] | None = None
    #: `--distill-mode full`: the frozen local teacher (a torch module) whose exact reverse KL the
    #: step adds to its loss; None otherwise
    teacher: Any = None


@runtime_checkable
class Engine(Protocol):
    """What the swarm server needs of a model.

    `generate`/`stream` are called concurrently from many episodes; an engine
    batches them internally. `train_step` is called with generation quiescent
    (the server gates it) and bumps `policy_version` by one.
    """

    policy_version: int
    model_dir: Path

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]: ...

    async def generate(self, request: GenerateRequest) -> Completion: ...

    def train_step(self, batch: TrainBatch) -> dict[str, float]: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...

    async def close(self) -> None: ...
