"""The rows of a continuous batch: a request as the batcher keeps it, its caller's handle, when it ends,
and how its tokens reach the caller.

Kept apart from the batcher's forward passes (`swarm.engine.continuous`): what a row is and when it is
done does not depend on how its KV cache is laid out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from swarm.engine.base import SamplingParams, TokenChunk
from swarm.engine.prompt_cache import PromptKey, prompt_key

Emit = Callable[[TokenChunk], None]


@dataclass
class Row:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Emit
    generator: torch.Generator | None
    loop: asyncio.AbstractEventLoop | None = None  # deliver chunks on this loop (else in the worker)
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    matcher: Any = None  # an llguidance LLMatcher when the row is constrained by a response_format
    adapter: str | None = None  # the LoRA adapter (policy) this row runs through; None: the model as is

    @property
    def key(self) -> PromptKey:
        """Its prompt as the prompt cache knows it: a prefill is valid only for its own adapter."""
        return prompt_key(self.prompt_ids, self.adapter)


class Handle:
    """Returned by `submit`; lets the caller cancel (a disconnected stream)."""

    def __init__(self, row: Row) -> None:
        self._row = row

    def cancel(self) -> None:
        self._row.cancelled = True


@dataclass(frozen=True)
class Ends:
    """What ends a row besides its own knobs: the model's EOS ids, its context, and the tokenizer's
    decode (for `stop` strings)."""

    eos_ids: set[int]
    decode: Callable[[list[int]], str]
    max_positions: int

    def reason(self, row: Row, tok: int) -> str | None:
        """Why `row` ends with `tok`, its newest token (already appended), or None while it goes on.

        A constrained row consumes the token here: its grammar allowed EOS only where it accepts, so
        an EOS ends it whole (`ignore_eos` or not)."""
        if row.matcher is not None:
            if tok in self.eos_ids:
                return "stop"
            row.matcher.consume_token(tok)  # always in its mask; an error would leave only EOS allowed
        if (tok in self.eos_ids and not row.params.ignore_eos) or tok in row.params.stop_token_ids:
            return "stop"
        if row.params.stop:
            text = self.decode(row.generated)
            if any(s and s in text for s in row.params.stop):
                return "stop"
        if len(row.generated) >= row.params.max_tokens:
            return "length"
        if len(row.prompt_ids) + len(row.generated) >= self.max_positions:
            return "length"
        return None


def append_tokens(
    rows: list[Row],
    tokens: list[int],
    logprobs: list[float],
    tops: list[tuple[list[int], list[float]]] | None,
    ends: Ends,
    out: Outbox,
) -> list[int]:
    """One sampled token (its logprob, the step's top-k when asked) appended to each row and queued
    for its caller. The indices of the rows that are done: ended by this token, or cancelled."""
    done: list[int] = []
    for i, (row, tok, lp) in enumerate(zip(rows, tokens, logprobs)):
        if row.cancelled:
            done.append(i)
            continue
        row.generated.append(tok)
        reason = ends.reason(row, tok)
        k = row.params.top_logprobs
        top = [list(zip(*tops[i]))[:k]] if k and tops is not None else None
        out.add(row, TokenChunk([tok], [lp], finish_reason=reason, top_logprobs=top))
        if reason is not None:
            done.append(i)
    return done


class Outbox:
    """One step's chunks, handed over after the step: one `call_soon_threadsafe` per event loop (a chunk
    per row per step would be a cross-thread wake-up each), direct calls for rows without a loop."""

    def __init__(self) -> None:
        self._out: dict[asyncio.AbstractEventLoop | None, list[tuple[Emit, TokenChunk]]] = {}

    def add(self, row: Row, chunk: TokenChunk) -> None:
        self._out.setdefault(row.loop, []).append((row.emit, chunk))

    def flush(self) -> None:
        out, self._out = self._out, {}
        for loop, items in out.items():
            if loop is None:
                _deliver(items)
                continue
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop closed: nobody is listening any more
                pass


def _deliver(items: list[tuple[Emit, TokenChunk]]) -> None:
    for emit, chunk in items:
        emit(chunk)
