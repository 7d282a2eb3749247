"""Engine output to choices: detokenizing, stop strings, tool calls, timeouts, n samples at once.

`generation.py` prepares a turn; this module runs it against the engine. Each choice has a
`ChoiceRun` (an `OutputText` for text and stop strings, a tool parser's stream for calls) that turns
engine chunks into neutral events: `TextDelta`, `ToolCallDelta` (a complete, valid call with a fresh
id), and `Finished` (the whole `Choice`). `run_choices` generates all choices (one engine call each,
concurrently); `stream_choices` streams them, interleaved by choice index. Both hold the generation
gate (a train step never runs under a generation) and honour `generate_timeout_s` (504). They see
the server only through a `GenerationContext` (engine, gate, limits, counters).

`max_calls` (1 for `parallel_tool_calls: false`) caps the calls a choice replies with where no
grammar did (an `auto` turn without a JSON answer, or a parser without a grammar): the first call
is kept and the rest are dropped from the reply, neither as calls nor as text, and counted in
`Choice.dropped_tool_calls`. The generated ids stay as generated (the sample is what the model did).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from swarm.chat.tool_parsers import CallPiece, ContentPiece, Piece, ToolParser
from swarm.engine.base import GenerateRequest, SamplingParams
from swarm.server.exceptions import GenerateTimeout
from swarm.server.generation_context import GenerationContext
from swarm.server.render import ChatRenderer, OutputText

log = logging.getLogger("swarm.server")
T = TypeVar("T")
TopLogprobs = list[list[tuple[int, float]]]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass
class Choice:
    index: int
    text: str  # visible content (tool-call markup taken out when calls were parsed)
    tool_calls: list[ToolCall]
    finish_reason: str  # stop | length | tool_calls | abort
    stop_sequence: str | None  # the stop string that ended it, if one did
    ids: list[int]
    logprobs: list[float]
    top_logprobs: TopLogprobs  # per id; [] each when not asked for (or the engine gave none)
    policy_version: int = 0
    dropped_tool_calls: int = 0  # calls parsed past `max_calls` (parallel_tool_calls: false), not in the reply
    #: where in `text` each call was made (its length then), so the Responses API orders text and calls
    #: as a stream sends them; empty: every call after all of the text
    call_offsets: list[int] = field(default_factory=list)


@dataclass
class TextDelta:
    index: int
    text: str  # may be "" when only ids arrived (text held back: a stop string or a call may be forming)
    ids: list[int]
    logprobs: list[float]
    top_logprobs: TopLogprobs


@dataclass
class ToolCallDelta:
    index: int
    call_index: int  # position among this choice's calls
    call: ToolCall  # complete: a call is emitted once its text is complete and valid


@dataclass
class Finished:
    index: int
    choice: Choice


ChoiceEvent = TextDelta | ToolCallDelta | Finished


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ChoiceRun:
    """One choice being generated: ids, visible text, tool calls so far."""

    def __init__(
        self,
        index: int,
        renderer: ChatRenderer,
        params: SamplingParams,
        parser: ToolParser | None,
        prefill: str = "",
        max_calls: int | None = None,
    ) -> None:
        self.index = index
        self.params = params
        self.out = OutputText(renderer, params.stop)
        self.tools = parser.stream() if parser is not None else None
        self.tops: TopLogprobs = []
        self.content = ""
        self.calls: list[ToolCall] = []
        self.max_calls = max_calls  # None: every parsed call is replied
        self.dropped = 0
        self.offsets: list[int] = []  # len(content) at each call
        self.version = 0
        if self.tools is not None and prefill:
            self._pieces(self.tools.feed(prefill), [])  # a forced call's start: held by the parser

    def add(self, ids: Sequence[int], logprobs: Sequence[float], tops: TopLogprobs | None) -> list[ChoiceEvent]:
        text, kept, lps = self.out.add(ids, logprobs)
        kept_tops = list(tops[: len(kept)]) if tops else [[] for _ in kept]
        self.tops += kept_tops
        if self.tools is None:
            self.content += text
            return [TextDelta(self.index, text, kept, lps, kept_tops)] if text or kept else []
        events: list[ChoiceEvent] = []
        visible = self._pieces(self.tools.feed(text), events)
        return ([TextDelta(self.index, visible, kept, lps, kept_tops)] if visible or kept else []) + events

    def _pieces(self, pieces: list[Piece], events: list[ChoiceEvent]) -> str:
        """The visible text before this batch's first call (the caller sends it first, with the batch's
        ids); its calls, and any text after one, go to `events` in the order the model wrote them."""
        lead = ""
        called = False
        for p in pieces:
            if isinstance(p, ContentPiece):
                self.content += p.text
                if not called:
                    lead += p.text
                elif events and isinstance(events[-1], TextDelta):
                    events[-1].text += p.text
                elif p.text:
                    events.append(TextDelta(self.index, p.text, [], [], []))
            elif isinstance(p, CallPiece) and self.max_calls is not None and len(self.calls) >= self.max_calls:
                self.dropped += 1  # parallel_tool_calls: false and no grammar held it to one
            elif isinstance(p, CallPiece):
                call = ToolCall(new_tool_call_id(), p.call.name, p.call.arguments)
                events.append(ToolCallDelta(self.index, len(self.calls), call))
                self.calls.append(call)
                self.offsets.append(len(self.content))
                called = True
        return lead

    def finish(self, engine_reason: str) -> list[ChoiceEvent]:
        events: list[ChoiceEvent] = []
        rest = self.out.finish()
        if self.tools is None:
            self.content += rest
            if rest:
                events.append(TextDelta(self.index, rest, [], [], []))
        else:
            calls: list[ChoiceEvent] = []
            visible = self._pieces(self.tools.feed(rest) + self.tools.finish(), calls)
            if visible:
                events.append(TextDelta(self.index, visible, [], [], []))
            events += calls
        reason = "stop" if self.out.stopped else engine_reason
        if self.calls and reason not in ("length", "abort"):
            reason = "tool_calls"
        choice = Choice(
            self.index,
            self.content,
            self.calls,
            reason,
            self.out.matched,
            list(self.out.ids),
            list(self.out.logprobs),
            self.tops,
            self.version,
            self.dropped,
            self.offsets,
        )
        return events + [Finished(self.index, choice)]


def _deadline(ctx: GenerationContext) -> float | None:
    limit = ctx.limits().generate_timeout_s
    return None if limit is None else asyncio.get_running_loop().time() + limit


async def _timed(ctx: GenerationContext, aw: Awaitable[T], deadline: float | None) -> T:
    """`aw`, or `GenerateTimeout` (504) once `generate_timeout_s` has passed: a hung engine call
    is cancelled and answered, never left holding the request (or the gate) forever."""
    if deadline is None:
        return await aw
    try:
        return await asyncio.wait_for(aw, max(0.0, deadline - asyncio.get_running_loop().time()))
    except TimeoutError:
        ctx.counters.add("generate_timeouts")
        limit = ctx.limits().generate_timeout_s
        log.warning("generation exceeded generate_timeout_s=%s; cancelled", limit)
        raise GenerateTimeout(limit) from None


async def run_choices(
    ctx: GenerationContext, prompt_ids: list[int], runs: list[ChoiceRun], affinity: str | None = None
) -> list[Choice]:
    """Every choice generated at once (one engine request each); `UnsupportedRequest` propagates.
    `affinity`: the episode id (`GenerateRequest.affinity`: its calls go to one vLLM replica)."""
    async with ctx.gate.generating():
        done = await _timed(
            ctx,
            asyncio.gather(*(ctx.engine.generate(GenerateRequest(prompt_ids, r.params, affinity)) for r in runs)),
            _deadline(ctx),
        )
    choices = []
    for r, c in zip(runs, done):
        r.version = c.policy_version
        r.add(c.token_ids, c.logprobs, c.top_logprobs)
        events = r.finish("stop" if r.out.stopped else c.finish_reason)
        choices.append(next(e.choice for e in events if isinstance(e, Finished)))
    return choices


async def _one(
    ctx: GenerationContext, prompt_ids: list[int], run: ChoiceRun, deadline: float | None, affinity: str | None
) -> AsyncIterator[ChoiceEvent]:
    run.version = ctx.engine.policy_version
    agen = ctx.engine.stream(GenerateRequest(prompt_ids, run.params, affinity))
    reason = "length"
    try:
        while True:
            try:
                c = await _timed(ctx, agen.__anext__(), deadline)
            except StopAsyncIteration:
                break
            for event in run.add(c.token_ids, c.logprobs, c.top_logprobs):
                yield event
            if run.out.stopped or c.finish_reason:
                reason = c.finish_reason or reason
                break
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            await aclose()
    for event in run.finish(reason):
        yield event


_END = object()


async def stream_choices(
    ctx: GenerationContext, prompt_ids: list[int], runs: list[ChoiceRun], affinity: str | None = None
) -> AsyncIterator[ChoiceEvent]:
    """Events of every choice as they come (one choice: directly; several: interleaved); `affinity` as
    `run_choices`'."""
    async with ctx.gate.generating():
        deadline = _deadline(ctx)
        if len(runs) == 1:
            agen = _one(ctx, prompt_ids, runs[0], deadline, affinity)
            try:
                async for event in agen:
                    yield event
            finally:
                await agen.aclose()
            return
        queue: asyncio.Queue[object] = asyncio.Queue()

        async def pump(run: ChoiceRun) -> None:
            try:
                async for event in _one(ctx, prompt_ids, run, deadline, affinity):
                    await queue.put(event)
                await queue.put(_END)
            except Exception as exc:  # handed to the reader, which raises it
                await queue.put(exc)

        tasks = [asyncio.create_task(pump(r)) for r in runs]
        try:
            left = len(tasks)
            while left:
                item = await queue.get()
                if item is _END:
                    left -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item  # type: ignore[misc]
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
