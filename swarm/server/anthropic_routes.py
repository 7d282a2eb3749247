"""Anthropic Messages: `POST /v1/messages`, so agents built on Anthropic's SDK train too.

    client = anthropic.Anthropic(base_url=ep.base_url.removesuffix("/v1"), api_key=ep.api_key)
    msg = client.messages.create(model=ep.model, max_tokens=256, messages=[...], tools=[...])

The route only translates: the body (`anthropic_schema.MessagesRequest`) becomes the OpenAI-shaped
`ChatTurn` of the generation core, which renders, continues the episode's exact ids, parses tool
calls, generates and records, exactly as for `/v1/chat/completions`; so tool_use -> tool_result ->
answer turns merge into one training sample, and the ids the core issues to tool calls are the
`tool_use` ids a client sends back. The answer goes back as an Anthropic `message`, or, with
`stream: true`, as Anthropic's SSE events (`anthropic_stream.MessageStream`). `POST
/v1/messages/count_tokens` renders the same turn and counts its prompt, recording nothing.

Credentials: the Anthropic SDK sends its key as `x-api-key` (and `anthropic-version`, accepted and
ignored); a Bearer token works too. The episode's key records the call into the episode and renews
its lease; the worker (or admin) token makes an evaluation call, never recorded. `X-Roost-Agent`
tags the calling agent. Every error, including a body that fails validation, is Anthropic's shape,
`{"type": "error", "error": {"type", "message", "code"}}`, with the status the OpenAI routes give.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import fields
from typing import Any

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from swarm.server.anthropic_schema import (
    CountTokensRequest,
    MessagesRequest,
    error_payload,
    message_id,
    message_response,
)
from swarm.server.anthropic_stream import MessageStream
from swarm.server.auth import caller_of, generation_swarm
from swarm.server.auth_first import AuthFirstRoute
from swarm.server.episodes import Episode
from swarm.server.errors import describe_validation, error_headers, status_of
from swarm.server.exceptions import InvalidRequest, NotFound, SwarmError, Unauthorized
from swarm.server.generation import (
    ChatTurn,
    Done,
    Finished,
    PreparedTurn,
    Sampling,
    Started,
    TextDelta,
    ToolCallDelta,
    agent_tag,
    generation_core,
)

log = logging.getLogger("swarm.server")


def _error(status: int, message: str, code: str | None, exc: SwarmError | None = None) -> JSONResponse:
    return JSONResponse(error_payload(status, message, code), status_code=status, headers=error_headers(status, exc))


class AnthropicRoute(AuthFirstRoute):
    """Renders this router's failures in Anthropic's error shape (the app's handlers speak OpenAI's):
    auth and domain errors, and bodies that fail validation (400, never 422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except SwarmError as exc:
                status = status_of(exc)
                if status >= 500 and status != 503 and status != 504:
                    log.error("unmapped domain error on /v1/messages: %r", exc)
                return _error(status, exc.message, exc.code, exc)
            except RequestValidationError as exc:
                errors = list(exc.errors())
                code = "invalid_json" if any(e.get("type") == "json_invalid" for e in errors) else "invalid_request"
                return _error(400, describe_validation(errors, exc.body), code)
            except RecursionError:
                return _error(400, "request body is nested too deeply", "invalid_json")

        return route


router = APIRouter(prefix="/v1", tags=["anthropic"], route_class=AnthropicRoute)


async def messages_caller(
    request: Request, x_api_key: str | None = Header(None), authorization: str | None = Header(None)
) -> Episode | None:
    """The episode a call is recorded into (its key as `x-api-key` or Bearer), or None for an
    evaluation call (the worker or admin token). Runs before the body is validated."""
    token = (x_api_key or "").strip()
    if not token and authorization and authorization.startswith("Bearer "):
        token = authorization[7:].strip()
    if not token:
        raise Unauthorized("missing_api_key", "missing credential: send the episode's api_key as x-api-key")
    return caller_of(request, token)


_SAMPLING_FIELDS = {f.name for f in fields(Sampling)}


def _sampling(body: MessagesRequest) -> Sampling:
    extra: dict[str, Any] = {}
    if body.top_k is not None:
        if "top_k" not in _SAMPLING_FIELDS:
            raise InvalidRequest(
                "unsupported_top_k", "top_k is not supported by this server's engine; leave it out (top_p is)"
            )
        extra["top_k"] = body.top_k
    return Sampling(
        max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, stop=body.stop_strings(), **extra
    )


def _served(request: Request, ep: Episode | None, model: str) -> Any:
    swarm = generation_swarm(request, ep, model)
    if model not in swarm.config.model_aliases:
        raise NotFound("model_not_found", f"model {model!r} is not served here; use {swarm.config.served_model_name!r}")
    return swarm


@router.post("/messages/count_tokens")
async def count_tokens(
    body: CountTokensRequest, request: Request, ep: Episode | None = Depends(messages_caller)
) -> Any:
    """The prompt's tokens as `/v1/messages` would render them (the chat template, the tools, the system
    block). Never recorded, and an episode's key does not touch the episode: counting is not a call."""
    turn = ChatTurn(
        messages=body.openai_messages(),
        tools=body.openai_tools(),
        tool_choice=body.openai_tool_choice(),
        sampling=Sampling(max_tokens=1),
        episode=None,
    )
    prepared = await generation_core(request, _served(request, ep, body.model)).prepare_chat(turn)
    return {"input_tokens": len(prepared.prompt_ids)}


@router.post("/messages")
async def messages(
    body: MessagesRequest,
    request: Request,
    ep: Episode | None = Depends(messages_caller),
    x_roost_agent: str | None = Header(None),
) -> Any:
    swarm = _served(request, ep, body.model)
    turn = ChatTurn(
        messages=body.openai_messages(),
        tools=body.openai_tools(),
        tool_choice=body.openai_tool_choice(),
        sampling=_sampling(body),
        episode=ep,
        agent=agent_tag(x_roost_agent),
        parallel_tool_calls=not (body.tool_choice is not None and body.tool_choice.disable_parallel_tool_use),
    )
    prepared = await generation_core(request, swarm).prepare_chat(turn)
    rid = message_id()
    if body.stream:
        return await _stream_response(prepared, rid, body.model)
    result = await prepared.run()
    c = result.choices[0]
    return JSONResponse(
        message_response(
            rid=rid,
            model=body.model,
            text=c.text,
            tool_calls=[(t.id, t.name, t.arguments) for t in c.tool_calls],
            finish_reason=c.finish_reason,
            stop_sequence=c.stop_sequence,
            input_tokens=result.usage.prompt_tokens,
            output_tokens=result.usage.completion_tokens,
        ),
        headers={"request-id": rid},
    )


async def _stream_response(prepared: PreparedTurn, rid: str, model: str) -> StreamingResponse:
    """Waits for the core's `Started` (the engine's first tokens) before the headers go out, so an
    engine's refusal or a timeout before any token is still a plain 4xx/5xx answer."""
    events = prepared.stream()
    try:
        started = await anext(events)
    except BaseException:
        await events.aclose()
        raise
    assert isinstance(started, Started)
    return StreamingResponse(
        _sse(events, MessageStream(rid, model), len(started.prompt_ids)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "request-id": rid},
    )


async def _sse(events: AsyncIterator[Any], out: MessageStream, input_tokens: int) -> AsyncIterator[str]:
    """The core's neutral events as Anthropic's; a failure after the headers is one in-band `error`."""
    yield out.start(input_tokens)
    finished: Finished | None = None
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                if event.text:
                    yield out.text(event.text)
            elif isinstance(event, ToolCallDelta):
                yield out.tool_use(event.call.id, event.call.name, event.call.arguments)
            elif isinstance(event, Finished):
                finished = event
            elif isinstance(event, Done) and finished is not None:
                c = finished.choice
                yield out.finish(c.finish_reason, c.stop_sequence, event.usage.completion_tokens)
    except SwarmError as exc:  # a generation timeout after the headers went out
        yield out.error(error_payload(status_of(exc), exc.message, exc.code))
    except Exception as exc:
        log.exception("/v1/messages stream failed")
        yield out.error(error_payload(500, f"generation failed: {type(exc).__name__}", "engine_error"))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
