"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

These only translate OpenAI JSON to and from the protocol-neutral core (`generation.py`), which
renders, tokenizes (off the event loop), parses tool calls, records and counts.

The Bearer token is the episode key from a claim, so every call is recorded into its episode
(prompt ids, completion ids, logprobs, policy version, and the agent tag from `X-Roost-Agent`);
the worker or admin token makes an evaluation call instead (current policy, never recorded).
Responses are OpenAI-shaped: `tool_calls` with `finish_reason: "tool_calls"` (streamed as OpenAI
does: a first delta with index, id, type and name, then the arguments), `n` choices, `top_logprobs`.
With `return_token_ids` or `logprobs` they also carry `prompt_token_ids`, `choices[i].token_ids`
and per-token logprobs. `stream: true` is real SSE from the engine. `system_fingerprint` names
the policy version that generated the answer. An unknown `model` is 404 `model_not_found`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse

from swarm.server.auth import any_caller, generation_caller, generation_swarm, policies
from swarm.server.auth_first import AuthFirstRoute
from swarm.server.echo import check_echo, echoed, prompt_logprobs
from swarm.server.episodes import Episode
from swarm.server.errors import domain_error_body, error_body
from swarm.server.exceptions import SwarmError
from swarm.server.generation import (
    ChatTurn,
    Choice,
    Done,
    Event,
    Finished,
    PreparedTurn,
    Started,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    agent_tag,
    generation_core,
)
from swarm.server.openai_schema import ChatCompletionRequest, CompletionRequest
from swarm.server.render import ChatRenderer
from swarm.server.state import Swarm

log = logging.getLogger("swarm.server")
router = APIRouter(prefix="/v1", tags=["openai"], route_class=AuthFirstRoute)


def _sse(payload: Any) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _fingerprint(version: int) -> str:
    return f"roost-policy-v{version}"


def _usage(u: Any) -> dict[str, int]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "total_tokens": u.total_tokens}


def _top(r: ChatRenderer, pairs: list[tuple[int, float]]) -> list[dict]:
    out = []
    for t, lp in pairs:
        text = r.token_text(t)
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "replace"))})
    return out


def _logprob_content(r: ChatRenderer, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> list:
    out = []
    for k, (t, lp) in enumerate(zip(ids, lps)):
        text = r.token_text(t)
        out.append(
            {
                "token": text,
                "logprob": lp,
                "bytes": list(text.encode("utf-8", "replace")),
                "top_logprobs": _top(r, tops[k]) if k < len(tops) else [],
            }
        )
    return out


def _tool_calls(calls: list[ToolCall]) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


async def open_stream(prepared: PreparedTurn) -> AsyncIterator[Event]:
    """The core's stream, started: its `Started` is awaited here, so an engine's refusal is a 400."""
    events = prepared.stream()
    first = await events.__anext__()
    assert isinstance(first, Started)
    return events


async def _sse_events(
    events: AsyncIterator[Event], on_event: Callable[[Event], list[dict]], first: dict | None
) -> AsyncIterator[str]:
    """SSE from neutral events; a failure after the headers went out is reported in-band, as OpenAI does."""
    try:
        if first is not None:
            yield _sse(first)
        async for event in events:
            for payload in on_event(event):
                yield _sse(payload)
    except SwarmError as exc:  # a generation timeout after the headers went out
        yield _sse(domain_error_body(exc))
    except Exception as exc:
        log.exception("stream failed")
        yield _sse(error_body(500, f"generation failed: {type(exc).__name__}", "engine_error"))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    yield _sse("[DONE]")


def streaming_response(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        gen, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _message(c: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.text if c.text or not c.tool_calls else None}
    if c.tool_calls:
        message["tool_calls"] = _tool_calls(c.tool_calls)
    return message


@router.post("/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    ep: Episode | None = Depends(generation_caller),
    x_roost_agent: str | None = Header(None),
) -> Any:
    swarm = generation_swarm(request, ep, body.model)
    core = generation_core(request, swarm)
    body.check_model(swarm.config.model_aliases)
    turn = ChatTurn(
        body.message_dicts(),
        body.chat_tools(),
        body.tool_choice,
        body.to_sampling(),
        body.n or 1,
        ep,
        agent_tag(x_roost_agent),
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )
    prepared = await core.prepare_chat(turn)
    r = swarm.renderer
    want = bool(body.return_token_ids or body.logprobs)
    rid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
    head = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": swarm.model_name,
        "system_fingerprint": _fingerprint(swarm.engine.policy_version),
    }

    if body.stream:
        events = await open_stream(prepared)
        include_usage = body.include_usage()

        def chunk(index: int, delta: dict, reason: str | None = None, **extra: Any) -> dict:
            return {
                **head,
                "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": reason, **extra}],
            }

        def on_event(e: Event) -> list[dict]:
            if isinstance(e, TextDelta):
                if not e.text and not (e.ids and want):
                    return []
                extra = (
                    {
                        "token_ids": e.ids,
                        "logprobs": {"content": _logprob_content(r, e.ids, e.logprobs, e.top_logprobs)},
                    }
                    if want
                    else {}
                )
                return [chunk(e.index, {"content": e.text} if e.text else {}, **extra)]
            if isinstance(e, ToolCallDelta):
                c = e.call
                return [
                    chunk(
                        e.index,
                        {
                            "tool_calls": [
                                {
                                    "index": e.call_index,
                                    "id": c.id,
                                    "type": "function",
                                    "function": {"name": c.name, "arguments": ""},
                                }
                            ]
                        },
                    ),
                    chunk(e.index, {"tool_calls": [{"index": e.call_index, "function": {"arguments": c.arguments}}]}),
                ]
            if isinstance(e, Finished):
                return [chunk(e.index, {}, e.choice.finish_reason, **({"token_ids": []} if want else {}))]
            if isinstance(e, Done) and include_usage:
                return [{**head, "choices": [], "usage": _usage(e.usage)}]
            return []

        first = {
            **head,
            "choices": [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(prepared.n)
            ],
        }
        if want:
            first["prompt_token_ids"] = prepared.prompt_ids
        return streaming_response(_sse_events(events, on_event, first))

    result = await prepared.run()
    choices = []
    for c in result.choices:
        choice: dict[str, Any] = {
            "index": c.index,
            "message": _message(c),
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }
        if want:
            choice["token_ids"] = c.ids
            choice["logprobs"] = {"content": _logprob_content(r, c.ids, c.logprobs, c.top_logprobs)}
        choices.append(choice)
    response: dict[str, Any] = {
        **head,
        "object": "chat.completion",
        "system_fingerprint": _fingerprint(result.policy_version),
        "choices": choices,
        "usage": _usage(result.usage),
    }
    if want:
        response["prompt_token_ids"] = result.prompt_ids
        response["policy_version"] = result.policy_version
    return response


def _completion_logprobs(
    r: ChatRenderer, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]], k: int, offset: int
) -> dict:
    tokens = [r.token_text(t) for t in ids]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    top = [{r.token_text(t): lp for t, lp in (tops[i] if i < len(tops) else [])} for i in range(len(ids))]
    return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": top if k else None, "text_offset": offsets}


@router.post("/completions")
async def completions(
    body: CompletionRequest,
    request: Request,
    ep: Episode | None = Depends(generation_caller),
    x_roost_agent: str | None = Header(None),
) -> Any:
    swarm = generation_swarm(request, ep, body.model)
    core = generation_core(request, swarm)
    body.check_model(swarm.config.model_aliases)
    body.check_unsupported()
    if body.echo:
        check_echo(swarm, body.stream)  # the prompt scored back (a distillation teacher asks this)
    sampling = body.to_sampling()
    prompt = body.prompt_one()
    prepared = await core.prepare_text(prompt, sampling, body.n or 1, ep, agent_tag(x_roost_agent))
    r, k = swarm.renderer, sampling.top_logprobs
    want_lp = body.logprobs is not None and body.logprobs is not False
    want_ids = bool(body.return_token_ids or want_lp)
    head = {
        "id": "cmpl-" + uuid.uuid4().hex,
        "object": "text_completion",
        "created": int(time.time()),
        "model": swarm.model_name,
        "system_fingerprint": _fingerprint(swarm.engine.policy_version),
    }

    if body.stream:
        events = await open_stream(prepared)
        sent: dict[int, int] = {}
        include_usage = body.include_usage()

        def on_event(e: Event) -> list[dict]:
            if isinstance(e, TextDelta):
                if not e.text and not (e.ids and want_ids):
                    return []
                choice: dict[str, Any] = {"index": e.index, "text": e.text, "logprobs": None, "finish_reason": None}
                if want_lp:
                    choice["logprobs"] = _completion_logprobs(
                        r, e.ids, e.logprobs, e.top_logprobs, k, sent.get(e.index, 0)
                    )
                if want_ids:
                    choice["token_ids"] = e.ids
                sent[e.index] = sent.get(e.index, 0) + len(e.text)
                return [{**head, "choices": [choice]}]
            if isinstance(e, Finished):
                return [
                    {
                        **head,
                        "choices": [
                            {
                                "index": e.index,
                                "text": "",
                                "logprobs": None,
                                "finish_reason": e.choice.finish_reason,
                                **({"token_ids": []} if want_ids else {}),
                            }
                        ],
                    }
                ]
            if isinstance(e, Done) and include_usage:
                return [{**head, "choices": [], "usage": _usage(e.usage)}]
            return []

        first = None
        if want_ids:
            first = {
                **head,
                "choices": [
                    {
                        "index": i,
                        "text": "",
                        "logprobs": None,
                        "finish_reason": None,
                        "prompt_token_ids": prepared.prompt_ids,
                        "token_ids": [],
                    }
                    for i in range(prepared.n)
                ],
            }
        return streaming_response(_sse_events(events, on_event, first))

    result = await prepared.run()
    scored = await prompt_logprobs(swarm, result.prompt_ids) if body.echo and want_lp else []
    choices = []
    for c in result.choices:
        choice = {"index": c.index, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
        if want_lp:
            choice["logprobs"] = _completion_logprobs(r, c.ids, c.logprobs, c.top_logprobs, k, 0)
        if body.echo:
            echoed(r, result.prompt_ids, scored, choice)
        if want_ids:
            choice["token_ids"] = c.ids
            choice["prompt_token_ids"] = result.prompt_ids
        choices.append(choice)
    response = {
        **head,
        "system_fingerprint": _fingerprint(result.policy_version),
        "choices": choices,
        "usage": _usage(result.usage),
    }
    if want_ids:
        response["prompt_token_ids"] = result.prompt_ids
        response["policy_version"] = result.policy_version
    return response


@router.get("/models")
async def models(request: Request, swarm: Swarm = Depends(any_caller)) -> Any:
    """Every model a request may name: each policy (its name first, then the server's aliases)."""
    data = []
    for one in policies(request):
        names = [one.model_name, *sorted(one.config.model_aliases - {one.model_name})]
        data += [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "roost",
                "policy_version": one.engine.policy_version,
            }
            for name in names
        ]
    return {"object": "list", "data": data}
