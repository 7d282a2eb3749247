"""The protocol-neutral generation core: one chat turn in, a result or a stream of neutral events out.

The OpenAI routes (and the Anthropic route) only translate their JSON to and from these types;
rendering, token continuity, tool calls, sampling limits, recording and evaluation calls live here.

    core = generation_core(request)                     # one per app (FastAPI dependency-friendly)
    turn = ChatTurn(messages=[{"role": "user", "content": "hi"}, ...],    # OpenAI-shaped dicts, text content
                    tools=[{"type": "function", "function": {...}}] or None,
                    tool_choice=None | "none" | "auto" | "required" | {"type": "function", "function": {"name": N}},
                    sampling=Sampling(max_tokens=None, temperature=None, top_p=None, seed=None, stop=(),
                                      top_logprobs=0, response_format=None),
                    n=1, episode=ep_or_None, agent="main")
    prepared = await core.prepare_chat(turn)            # InvalidRequest (400) / NotFound... raised here, before
                                                        # any response starts: render + tokenize in a thread
    result = await prepared.run()                       # TurnResult: choices[i].text / .tool_calls / .finish_reason
    async for event in prepared.stream():               # Started, then TextDelta | ToolCallDelta | Finished per
        ...                                             # choice (`index`), then Done(usage); see below

`prepared.stream()`'s first event, `Started`, comes only once the engine produced its first tokens:
await it before sending headers, and an engine's `UnsupportedRequest` is a clean 400 (InvalidRequest
with the engine's code). A `SwarmError` raised later (a generation timeout) belongs in-band.

`episode=None` is an evaluation call (the worker or admin token): generated with the current policy,
never recorded, counted in `eval_calls` / `eval_completion_tokens`. With an episode, each choice is
recorded as its own `Call`; tool calls get ids (`call_…`) remembered per episode with the exact text
generated, and a later turn whose assistant `tool_calls` carry only such ids is rendered from that
text (not from the client's re-serialised arguments), so the prompt continues the exact ids and the
timeline merges across tool turns. Forced tool calls (`required`, a named function) prefill the
parser's call prefix into the prompt ids (prompt: never trained) and a grammar admits only the rest
of a valid call of the allowed tools; tools with a JSON `response_format` get a grammar of a call or
the answer (`swarm/chat/tool_grammar.py`, docs/constrained-decoding.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from starlette.requests import Request

from swarm.chat.tool_grammar import turn_format
from swarm.chat.tool_parsers import ToolParser, get_parser
from swarm.engine.base import SamplingParams, UnsupportedRequest
from swarm.protocol import AGENT_HEADER
from swarm.samples import Call
from swarm.server.decoding import (
    Choice,
    ChoiceRun,
    Finished,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    new_tool_call_id,
    run_choices,
    stream_choices,
)
from swarm.server.episodes import Episode
from swarm.server.exceptions import InvalidRequest
from swarm.server.generation_context import GenerationContext, GenerationLimits
from swarm.server.prompt_bound import LARGE_PROMPT_CHARS, LargePromptGate

log = logging.getLogger("swarm.server")
SEED_MOD = 1 << 63
#: prompts up to this many characters are rendered and tokenized on the event loop (see `_off_loop`)
INLINE_CHARS = 16_384
T = TypeVar("T")


@dataclass(frozen=True)
class Sampling:
    """The sampling knobs a protocol asks for; None: the server's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    response_format: dict[str, Any] | None = None


@dataclass
class ChatTurn:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    n: int = 1
    episode: Episode | None = None
    agent: str = "main"
    #: False: at most one tool call in the reply (OpenAI's `parallel_tool_calls`, Anthropic's
    #: `disable_parallel_tool_use`); held by the turn's grammar where it has one, else by keeping the
    #: first parsed call (docs/responses.md, "One tool call at a time")
    parallel_tool_calls: bool = True


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TurnResult:
    choices: list[Choice]
    prompt_ids: list[int]
    policy_version: int
    usage: Usage


@dataclass
class Started:
    policy_version: int
    prompt_ids: list[int]


@dataclass
class Done:
    usage: Usage
    policy_version: int


Event = Started | TextDelta | ToolCallDelta | Finished | Done


class GenerationCore:
    """Per app: the render thread pool and the ledger of tool-call ids issued per episode.

    It sees the server only through its `GenerationContext` (engine, gate, renderer, limits,
    counters, where calls are recorded), never the `Swarm` itself."""

    def __init__(self, ctx: GenerationContext) -> None:
        self.ctx = ctx
        # tokenizing a long prompt takes seconds: never on the event loop, and never in the default
        # executor that train steps and checkpoints use
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="roost-render")
        self.large = LargePromptGate(self.pool)  # prompts over LARGE_PROMPT_CHARS: one at a time
        self._issued: dict[str, dict[str, str]] = {}  # "<episode>:<epoch>" -> call id -> text generated
        if ctx.step_done is not None:
            ctx.step_done.subscribe(self._annotate_row)

    def _annotate_row(self, step: int, row: dict[str, Any]) -> None:
        row["eval_calls"] = self.ctx.counters["eval_calls"]
        row["eval_completion_tokens"] = self.ctx.counters["eval_completion_tokens"]

    # -- tool-call ledger -----------------------------------------------------
    @staticmethod
    def _key(ep: Episode) -> str:
        return f"{ep.id}:{ep.epoch}"

    def remember(self, ep: Episode, call_ids: list[str], text: str) -> None:
        """`call_ids` were issued in `ep` for a completion whose generated text is `text`."""
        open_episodes = self.ctx.open_episodes()
        if len(self._issued) > 2 * len(open_episodes) + 64:  # forget closed episodes
            live = {self._key(e) for e in open_episodes}
            self._issued = {k: v for k, v in self._issued.items() if k in live}
        book = self._issued.setdefault(self._key(ep), {})
        for cid in call_ids:
            book[cid] = text

    def exact_history(self, ep: Episode | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Assistant turns whose tool calls this server issued in `ep`, as the exact text generated."""
        book = self._issued.get(self._key(ep)) if ep is not None else None
        if not book:
            return messages
        out = []
        for m in messages:
            calls = m.get("tool_calls") if m.get("role") == "assistant" else None
            ids = [c.get("id") for c in calls or [] if isinstance(c, dict)]
            if calls and ids and all(i in book for i in ids) and len({book[i] for i in ids}) == 1:
                out.append({"role": "assistant", "content": book[ids[0]]})
            else:
                out.append(m)
        return out

    # -- preparing a turn ----------------------------------------------------
    async def prepare_chat(self, turn: ChatTurn) -> PreparedTurn:
        ctx, limits = self.ctx, self.ctx.limits()
        forced, parse_tools = _tool_mode(turn.tools, turn.tool_choice)
        parser = get_parser(limits.tool_parser) if parse_tools else None
        prefill = parser.prefill(forced or None) if parser is not None and forced is not None else ""
        # a forced call, or tools with a JSON answer: one grammar admits a valid call (or the answer)
        markers = getattr(ctx.renderer, "marker_tokens", {})
        fmt = (
            None
            if parser is None
            else turn_format(
                parser,
                turn.tools,
                forced,
                prefill,
                turn.sampling.response_format,
                markers,
                parallel=turn.parallel_tool_calls,
            )
        )
        sampling = turn.sampling if fmt is None else replace(turn.sampling, response_format=fmt)
        messages = self.exact_history(turn.episode, turn.messages)
        chars = sum(len(str(m.get("content") or "")) for m in messages) + len(json.dumps(turn.tools or []))
        _check_chars(limits, chars)
        history = list(turn.episode.calls) if turn.episode is not None else []
        renderer, mode = ctx.renderer, limits.continuity

        def render() -> str:
            text = renderer.render(messages, turn.tools)
            self._refuse_past_context(renderer.past_context(text, history, turn.agent, ctx.context_length, mode))
            return text

        def tokenize(text: str) -> tuple[list[int], bool, bool]:
            got = renderer.chat_prompt(text, history, turn.agent, mode=mode)
            return got.ids + (renderer.encode(prefill) if prefill else []), got.continued, got.drift

        sampling = self._seeded(sampling, turn.episode)
        text = await self._off_loop(chars, render)
        ids, continued, drift = await self._tokenize(len(text), lambda: tokenize(text))
        ctx.counters.add("prompt_continued", continued)
        ctx.counters.add("prompt_drift", drift)
        if turn.episode is not None:
            turn.episode.drift += int(drift)
        return PreparedTurn(
            self,
            turn.episode,
            turn.agent,
            ids,
            self.params(sampling, len(ids)),
            max(1, turn.n),
            parser,
            prefill,
            max_calls=None if turn.parallel_tool_calls else 1,
        )

    async def prepare_text(
        self,
        prompt: str | list[int],
        sampling: Sampling,
        n: int = 1,
        episode: Episode | None = None,
        agent: str = "main",
    ) -> PreparedTurn:
        """A raw completion (`/v1/completions`): text or token ids, no template, no tools."""
        renderer, limits = self.ctx.renderer, self.ctx.limits()
        sampling = self._seeded(sampling, episode)
        if isinstance(prompt, str):
            _check_chars(limits, len(prompt))
            self._refuse_past_context(renderer.past_context(prompt, [], agent, self.ctx.context_length))
            ids = await self._tokenize(len(prompt), lambda: renderer.encode(prompt))
        else:
            ids = renderer.check_ids(prompt)
        return PreparedTurn(self, episode, agent, ids, self.params(sampling, len(ids)), max(1, n), None, "")

    def _seeded(self, sampling: Sampling, episode: Episode | None) -> Sampling:
        """A deterministic server seeds an episode's call from its place in the run, counted here before
        anything can fail, so a call's seed never depends on what shares its batch (lockstep.py)."""
        if sampling.seed is not None or episode is None or self.ctx.call_seed is None:
            return sampling
        return replace(sampling, seed=self.ctx.call_seed(episode))

    async def _off_loop(self, chars: int, work: Callable[[], T]) -> T:
        """`work()` inline for an ordinary prompt, in the render pool for a long one.

        Rendering and tokenizing a few thousand characters takes ~0.1 ms, less than the thread
        hand-off would cost on every call of the hot path; a long prompt takes up to seconds
        and must not hold the event loop (every other request, /health included, would wait)."""
        if chars <= INLINE_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self.pool, work)

    async def _tokenize(self, chars: int, work: Callable[[], T]) -> T:
        """`work()`, tokenizing a rendered prompt of `chars` characters, as `_off_loop` does; a large one
        through the gate: one at a time, the heap trimmed after it (docs/server-control.md)."""
        if chars <= LARGE_PROMPT_CHARS:
            return await self._off_loop(chars, work)
        return await self.large.run(work)

    def _refuse_past_context(self, least: int | None) -> None:
        """400 for a prompt that surely has `least` ids or more, no fewer than the context holds."""
        if least is not None:
            raise InvalidRequest(
                "context_length_exceeded",
                f"prompt of at least {least} tokens leaves no room in "
                f"the model's {self.ctx.context_length}-token context",
            )

    def params(self, s: Sampling, prompt_len: int) -> SamplingParams:
        """Engine params; 400 for an impossible `max_tokens` (never silently capped)."""
        if prompt_len == 0:
            raise InvalidRequest("invalid_prompt", "prompt must not be empty")
        cfg = self.ctx.limits()  # live: a temperature change applies from the next window
        context_length = self.ctx.context_length
        room = None if context_length is None else context_length - prompt_len
        if room is not None and room < 1:
            raise InvalidRequest(
                "context_length_exceeded",
                f"prompt of {prompt_len} tokens leaves no room in the model's {context_length}-token context",
            )
        if s.max_tokens is None:
            max_new = min(cfg.default_max_tokens, cfg.max_tokens_limit, room or cfg.max_tokens_limit)
        elif s.max_tokens > cfg.max_tokens_limit:
            raise InvalidRequest(
                "max_tokens_too_large",
                f"max_tokens={s.max_tokens} is above this server's limit of {cfg.max_tokens_limit}",
            )
        elif room is not None and s.max_tokens > room:
            raise InvalidRequest(
                "context_length_exceeded",
                f"this model's context is {context_length} tokens; the prompt has "
                f"{prompt_len} and max_tokens={s.max_tokens} asks for more than the {room} left",
            )
        else:
            max_new = s.max_tokens
        temperature = cfg.default_temperature if s.temperature is None else s.temperature
        fmt = s.response_format
        return SamplingParams(
            max_tokens=max_new,
            temperature=temperature if cfg.temperature is None else cfg.temperature,
            top_p=1.0 if s.top_p is None else s.top_p,
            seed=None if s.seed is None else s.seed % SEED_MOD,
            stop=s.stop,
            stop_token_ids=self.ctx.renderer.stop_token_ids,
            top_logprobs=s.top_logprobs,
            response_format=None if not fmt or fmt.get("type") == "text" else json.dumps(fmt, sort_keys=True),
        )


@dataclass
class PreparedTurn:
    """A turn ready to generate: prompt ids, params, and how to parse and record what comes out."""

    core: GenerationCore
    episode: Episode | None
    agent: str
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    parser: ToolParser | None
    prefill: str
    max_calls: int | None = None  # 1: parallel_tool_calls false (a grammar, if any, already holds it to one)

    @property
    def _affinity(self) -> str | None:
        """The episode's id: its calls share a prefix, so an engine of several replicas keeps them on one."""
        return None if self.episode is None else self.episode.id

    def _runs(self) -> list[ChoiceRun]:
        renderer = self.core.ctx.renderer
        runs = []
        for i in range(self.n):
            params = self.params
            if i and params.seed is not None:  # n samples of one seed must still differ
                params = replace(params, seed=(params.seed + i) % SEED_MOD)
            runs.append(ChoiceRun(i, renderer, params, self.parser, self.prefill, self.max_calls))
        return runs

    async def run(self) -> TurnResult:
        try:
            choices = await run_choices(self.core.ctx, self.prompt_ids, self._runs(), self._affinity)
        except UnsupportedRequest as exc:
            raise InvalidRequest(exc.code, exc.message) from None
        version = min(c.policy_version for c in choices)
        self._record(choices)
        return TurnResult(choices, self.prompt_ids, version, self._usage(choices))

    async def stream(self) -> AsyncIterator[Event]:
        """`Started` (after the engine's first tokens), deltas and `Finished` per choice, then `Done`.

        Recording happens at `Done`: a stream abandoned by its client records nothing."""
        ctx = self.core.ctx
        choices: list[Choice] = []
        version = ctx.engine.policy_version
        agen = stream_choices(ctx, self.prompt_ids, self._runs(), self._affinity)
        try:
            try:
                event: Event | None = await agen.__anext__()
            except UnsupportedRequest as exc:
                raise InvalidRequest(exc.code, exc.message) from None
            except StopAsyncIteration:
                event = None
            yield Started(version, self.prompt_ids)
            while event is not None:
                if isinstance(event, Finished):
                    choices.append(event.choice)
                yield event
                event = await anext(agen, None)
        finally:
            await agen.aclose()
        choices.sort(key=lambda c: c.index)
        self._record(choices)
        yield Done(self._usage(choices), version)

    def _usage(self, choices: list[Choice]) -> Usage:
        return Usage(len(self.prompt_ids), sum(len(c.ids) for c in choices))

    def _record(self, choices: list[Choice]) -> None:
        ctx = self.core.ctx
        dropped = sum(c.dropped_tool_calls for c in choices)
        if dropped:  # parallel_tool_calls false, no grammar: the sample keeps them, the reply does not
            ctx.counters.add("tool_calls_dropped", dropped)
        if self.episode is None:  # an evaluation call: counted, never trained
            ctx.counters.add("eval_calls", len(choices))
            ctx.counters.add("eval_completion_tokens", sum(len(c.ids) for c in choices))
            return
        for c in choices:
            ctx.record(self.episode, Call(self.agent, self.prompt_ids, list(c.ids), list(c.logprobs), c.policy_version))
            if c.tool_calls:
                text = self.prefill + ctx.renderer.decode(c.ids)
                self.core.remember(self.episode, [t.id for t in c.tool_calls], text)


def agent_tag(value: str | None) -> str:
    """The `X-Roost-Agent` header of a call (calls merge only within one agent); "main" when absent."""
    agent = (value or "main").strip() or "main"
    if len(agent) > 64 or not agent.isprintable():
        raise InvalidRequest("invalid_agent", f"{AGENT_HEADER} must be printable and at most 64 characters")
    return agent


def _check_chars(limits: GenerationLimits, chars: int) -> None:
    limit = limits.max_prompt_chars
    if chars > limit:
        raise InvalidRequest(
            "prompt_too_long",
            f"the prompt has {chars} characters; this server takes at most {limit} (max_prompt_chars)",
        )


def _tool_mode(tools: list[dict[str, Any]] | None, choice: str | dict[str, Any] | None) -> tuple[str | None, bool]:
    """(forced function: "" for any, a name, or None; whether to parse calls) per OpenAI's tool_choice."""
    if choice is None:
        return None, bool(tools)
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidRequest(
                "invalid_tool_choice",
                f"tool_choice {choice!r}: use none, auto, required or {{type: function, function: {{name}}}}",
            )
        if choice != "none" and not tools:
            raise InvalidRequest("invalid_tool_choice", "tool_choice needs tools")
        return ("" if choice == "required" else None), choice != "none"
    name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequest(
            "invalid_tool_choice", "tool_choice must be none, auto, required or {type: function, function: {name}}"
        )
    names = {(t.get("function") or {}).get("name") for t in tools or [] if isinstance(t.get("function"), dict)}
    if name not in names:
        raise InvalidRequest("invalid_tool_choice", f"tool_choice names {name!r}, which is not among the tools")
    return name, True


def generation_core(request: Request, swarm: Any = None) -> GenerationCore:
    """The core of `swarm` (default: the server's default policy), made on first use on its context:
    a FastAPI dependency, or call it with the request. Each policy generates through its own."""
    if swarm is None:
        swarm = request.app.state.policies.default
    core = getattr(swarm, "_generation_core", None)
    if core is None:
        core = swarm._generation_core = GenerationCore(swarm.generation_context)
    return core


__all__ = [
    "ChatTurn",
    "agent_tag",
    "Choice",
    "Done",
    "Event",
    "Finished",
    "GenerationCore",
    "PreparedTurn",
    "Sampling",
    "Started",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "TurnResult",
    "Usage",
    "generation_core",
    "new_tool_call_id",
]
