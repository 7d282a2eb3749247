"""Engines: token-in/token-out generation and policy-gradient steps behind one interface."""

from swarm.engine.base import (
    Completion,
    Engine,
    GenerateRequest,
    SamplingParams,
    TokenChunk,
    TrainBatch,
    TrainConfig,
    TrainSample,
)

__all__ = [
    "Completion",
    "Engine",
    "GenerateRequest",
    "SamplingParams",
    "TokenChunk",
    "TrainBatch",
    "TrainConfig",
    "TrainSample",
]
