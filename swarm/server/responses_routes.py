"""OpenAI Responses: `POST /v1/responses`, so agents built on the Responses API train too.

    client = openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key)
    r = client.responses.create(model=ep.model, input="What is 2+3?", tools=[{"type": "function", ...}])

The OpenAI Agents SDK's default model and Codex-style agents speak nothing else. The route only
translates: the body (`responses_schema.ResponsesRequest`) becomes the OpenAI-shaped `ChatTurn` of
the generation core, which renders, continues the episode's exact ids, parses tool calls,
generates and records, exactly as for `/v1/chat/completions`; so function_call ->
function_call_output -> answer turns merge into one training sample, and the `call_id`s the core
issues are the ones a client sends back. The answer is a `response` object, or with
`stream: true` the Responses SSE events (`responses_stream.ResponseStream`).

`previous_response_id` continues a response of the same episode (and agent): the server keeps
each response's conversation (input and output, not `instructions`, as OpenAI's) while the episode
is open, and the next turn renders it followed by the new input. An id from another episode, a
closed one or an evaluation call is 404 `previous_response_not_found`. Responses are not stored
otherwise (`store` is accepted and ignored; there is no `GET /v1/responses/{id}`).

Credentials and errors are the chat route's: the episode's key as Bearer records the call, the
worker or admin token makes an evaluation call (never recorded), errors are OpenAI's JSON with
`error.code`, and a failure after the headers is an in-band `error` event.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Header, Request

from swarm.server.auth import generation_caller, generation_swarm
from swarm.server.auth_first import AuthFirstRoute
from swarm.server.episodes import Episode
from swarm.server.exceptions import InvalidRequest, NotFound, SwarmError
from swarm.server.generation import (
    ChatTurn,
    Done,
    Event,
    Finished,
    GenerationCore,
    TextDelta,
    ToolCallDelta,
    agent_tag,
    generation_core,
)
from swarm.server.openai_routes import open_stream, streaming_response
from swarm.server.openai_schema import check_model
from swarm.server.responses_schema import (
    ResponsesRequest,
    assistant_message,
    new_id,
    now,
    output_items,
    response_object,
)
from swarm.server.responses_stream import ResponseStream

log = logging.getLogger("swarm.server")
router = APIRouter(prefix="/v1", tags=["openai"], route_class=AuthFirstRoute)
Conversation = list[dict[str, Any]]


class ResponseLedger:
    """Each open episode's responses, as the conversation a `previous_response_id` continues.

    Kept per generation core (one per policy); the responses of closed episodes are dropped as
    the ledger grows, as the core's tool-call ledger does."""

    def __init__(self, core: GenerationCore) -> None:
        self.core = core
        self._by_episode: dict[str, dict[str, tuple[str, Conversation]]] = {}

    @staticmethod
    def _key(ep: Episode) -> str:
        return f"{ep.id}:{ep.epoch}"

    def keep(self, ep: Episode | None, rid: str, agent: str, conversation: Conversation) -> None:
        if ep is None:
            return  # an evaluation call: nothing to continue
        open_episodes = self.core.ctx.open_episodes()
        if len(self._by_episode) > 2 * len(open_episodes) + 64:
            live = {self._key(e) for e in open_episodes}
            self._by_episode = {k: v for k, v in self._by_episode.items() if k in live}
        self._by_episode.setdefault(self._key(ep), {})[rid] = (agent, conversation)

    def conversation(self, ep: Episode | None, rid: str, agent: str) -> Conversation:
        got = self._by_episode.get(self._key(ep), {}).get(rid) if ep is not None else None
        if got is None or got[0] != agent:
            raise NotFound(
                "previous_response_not_found",
                f"previous_response_id {rid!r} is not a response of this episode and agent "
                "(responses are kept only while their episode is open)",
            )
        return list(got[1])


_LEDGERS: weakref.WeakKeyDictionary[GenerationCore, ResponseLedger] = weakref.WeakKeyDictionary()


def ledger_of(core: GenerationCore) -> ResponseLedger:
    ledger = _LEDGERS.get(core)
    if ledger is None:
        ledger = _LEDGERS[core] = ResponseLedger(core)
    return ledger


@router.post("/responses")
async def responses(
    body: ResponsesRequest,
    request: Request,
    ep: Episode | None = Depends(generation_caller),
    x_roost_agent: str | None = Header(None),
) -> Any:
    swarm = generation_swarm(request, ep, body.model)
    check_model(body.model, swarm.config.model_aliases)
    core = generation_core(request, swarm)
    ledger, agent = ledger_of(core), agent_tag(x_roost_agent)
    prior = ledger.conversation(ep, body.previous_response_id, agent) if body.previous_response_id else []
    conversation = prior + body.input_messages(prior)
    if not conversation:
        raise InvalidRequest("missing_input", "input must hold at least one message")
    turn = ChatTurn(
        body.system_messages() + conversation,
        body.chat_tools(),
        body.chat_tool_choice(),
        body.sampling(),
        1,
        ep,
        agent,
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )
    prepared = await core.prepare_chat(turn)
    rid, created, model = new_id("resp"), now(), body.model or swarm.model_name

    def head(
        status: str,
        output: list[dict[str, Any]],
        finish_reason: str | None = None,
        usage: tuple[int, int] | None = None,
        version: int | None = None,
    ) -> dict[str, Any]:
        return response_object(
            body,
            rid=rid,
            model=model,
            created=created,
            status=status,
            output=output,
            finish_reason=finish_reason,
            usage=usage,
            policy_version=version,
        )

    if body.stream:
        events = await open_stream(prepared)
        keep: Callable[[Finished], None] = lambda f: ledger.keep(  # noqa: E731
            ep, rid, agent, conversation + [assistant_message(f.choice)]
        )
        return streaming_response(_sse(events, ResponseStream(head), keep))
    result = await prepared.run()
    c = result.choices[0]
    ledger.keep(ep, rid, agent, conversation + [assistant_message(c)])
    usage = (result.usage.prompt_tokens, result.usage.completion_tokens)
    return head("completed", output_items(c), c.finish_reason, usage, result.policy_version)


async def _sse(
    events: AsyncIterator[Event], out: ResponseStream, keep: Callable[[Finished], None]
) -> AsyncIterator[str]:
    """The core's neutral events as the Responses events; a failure after the headers is an `error` event."""
    yield out.start()
    finished: Finished | None = None
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                yield out.text_delta(event.text)
            elif isinstance(event, ToolCallDelta):
                yield out.tool_call(event.call)
            elif isinstance(event, Finished):
                finished = event
            elif isinstance(event, Done) and finished is not None:
                keep(finished)  # recorded at Done: the conversation is continuable from here on
                usage = (event.usage.prompt_tokens, event.usage.completion_tokens)
                yield out.finish(finished.choice.finish_reason, usage)
    except SwarmError as exc:  # a generation timeout after the headers went out
        yield out.error(exc.code, exc.message)
    except Exception as exc:
        log.exception("/v1/responses stream failed")
        yield out.error("engine_error", f"generation failed: {type(exc).__name__}")
    finally:
        await events.aclose()  # type: ignore[attr-defined]
