"""What generation needs from the server, and nothing more: `GenerationContext`.

`generation.py` and `decoding.py` used to take the whole `Swarm` and reach into its
registry, trainer, gate, engine and config. They take this instead, so the core can be
built and tested with an engine and a tokenizer alone, and so the server's other parts
(batcher, leases, durability) are out of its reach. `Swarm` builds one at start-up.

    ctx = GenerationContext(engine, GenerationGate(), ChatRenderer(tokenizer), limits=lambda: limits,
                            counters=Counters())                      # an evaluation-only core
    core = GenerationCore(ctx)

Limits are read through a callable on every turn because the server's settings change live
(`temperature` and `default_temperature` from the next window, `control.py`). `engine_tokenizer`
and `context_length` read what a context needs from the engine and the model dir.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.chat.tokenizers import load_tokenizer
from swarm.config.server import ServerConfig
from swarm.engine.base import Engine
from swarm.samples import Call
from swarm.server.counters import Counters
from swarm.server.episodes import Episode
from swarm.server.events import StepTopic
from swarm.server.render import ChatRenderer
from swarm.server.trainer import GenerationGate


@dataclass(frozen=True)
class GenerationLimits:
    """The settings a turn is prepared and generated under (see `ServerConfig` for each)."""

    max_prompt_chars: int
    max_tokens_limit: int
    default_max_tokens: int
    default_temperature: float
    temperature: float | None  # forced on every call when set (a workflow's sampling temperature)
    generate_timeout_s: float | None
    tool_parser: str
    continuity: str

    @classmethod
    def of(cls, config: ServerConfig) -> GenerationLimits:
        return cls(
            max_prompt_chars=config.max_prompt_chars,
            max_tokens_limit=config.max_tokens_limit,
            default_max_tokens=config.default_max_tokens,
            default_temperature=config.default_temperature,
            temperature=config.temperature,
            generate_timeout_s=config.generate_timeout_s,
            tool_parser=str(config.tool_parser),
            continuity=config.continuity,
        )


def engine_tokenizer(engine: Engine, model_dir: Path) -> Any:
    """The engine's own tokenizer (the ids it generates are in it), else the model dir's."""
    tok = getattr(engine, "tokenizer", None)
    if tok is not None:
        return tok
    return load_tokenizer(model_dir)


def context_length(engine: Engine, model_dir: Path) -> int | None:
    """Prompt plus completion ids the model takes: the engine's limit, else the model config's; None
    when neither says (then no prompt is refused for its length in tokens)."""
    n = getattr(engine, "max_positions", None)
    if isinstance(n, int):
        return n
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _drop(ep: Episode, call: Call) -> None:
    """No server to record to: only evaluation calls (episode None) reach a context without one."""
    raise RuntimeError("this GenerationContext records no episodes")


@dataclass
class GenerationContext:
    """The engine, the gate it generates behind, the renderer, the live limits, and where results go.

    `record` keeps an episode's call (`Swarm.record`: lease renewed, counted); `open_episodes`
    lets the tool-call ledger forget closed episodes; `step_done`, when given, gets the
    `eval_calls` counters added to every metrics row once the core exists. `call_seed`, when given
    (a `--deterministic` server: `Lockstep.seed_for`), seeds an episode's call that names no seed.
    """

    engine: Engine
    gate: GenerationGate
    renderer: ChatRenderer
    limits: Callable[[], GenerationLimits]
    counters: Counters
    context_length: int | None = None
    record: Callable[[Episode, Call], None] = _drop
    open_episodes: Callable[[], Collection[Episode]] = tuple
    step_done: StepTopic[[int, dict[str, Any]]] | None = None
    call_seed: Callable[[Episode], int] | None = None


__all__ = ["GenerationContext", "GenerationLimits", "context_length", "engine_tokenizer"]
