"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

The Bearer token is the episode key from a claim, so every call is recorded into
its episode (prompt ids, completion ids, logprobs, policy version, and the agent
tag from `X-Roost-Agent`). Responses are OpenAI-shaped; with `return_token_ids`
or `logprobs` they also carry `prompt_token_ids`, `choices[0].token_ids` and
per-token logprobs (`choices[0].logprobs.content[]` for chat). `stream: true` is
real SSE from the engine's `stream()`. `system_fingerprint` names the policy
version that generated the answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse

from swarm.engine.base import GenerateRequest, SamplingParams
from swarm.protocol import AGENT_HEADER
from swarm.samples import Call
from swarm.server.auth import any_caller, current_swarm, open_episode
from swarm.server.episodes import Episode
from swarm.server.errors import domain_error_body, error_body
from swarm.server.exceptions import GenerateTimeout, InvalidRequest, SwarmError
from swarm.server.openai_schema import ChatCompletionRequest, CompletionRequest, _Sampling
from swarm.server.render import OutputText
from swarm.server.state import Swarm

log = logging.getLogger("swarm.server")
router = APIRouter(prefix="/v1", tags=["openai"])
T = TypeVar("T")


def _agent(value: str | None) -> str:
    agent = (value or "main").strip() or "main"
    if len(agent) > 64 or not agent.isprintable():
        raise InvalidRequest("invalid_agent", f"{AGENT_HEADER} must be printable and at most 64 characters")
    return agent


def _params(swarm: Swarm, body: _Sampling, prompt_len: int, wanted: int | None) -> SamplingParams:
    if prompt_len == 0:
        raise InvalidRequest("invalid_prompt", "prompt must not be empty")
    cfg = swarm.config
    max_new = min(wanted or cfg.default_max_tokens, cfg.max_tokens_limit)
    if swarm.context_length is not None:
        room = swarm.context_length - prompt_len
        if room < 1:
            raise InvalidRequest("context_length_exceeded", f"prompt of {prompt_len} tokens leaves no room in "
                                                            f"the model's {swarm.context_length}-token context")
        max_new = min(max_new, room)
    temperature = cfg.default_temperature if body.temperature is None else body.temperature
    return SamplingParams(
        max_tokens=max_new,
        temperature=temperature if cfg.temperature is None else cfg.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.engine_seed(),
        stop=body.stop_strings(),
        stop_token_ids=swarm.renderer.stop_token_ids,
    )


@dataclass
class Generation:
    """One request in flight: what to generate and how to record it."""

    swarm: Swarm
    episode: Episode
    agent: str
    prompt_ids: list[int]
    params: SamplingParams
    rid: str
    created: int
    want_ids: bool = False

    def record(self, out: OutputText, version: int) -> None:
        self.swarm.record(self.episode, Call(self.agent, self.prompt_ids, list(out.ids),
                                             list(out.logprobs), version))

    def usage(self, out: OutputText) -> dict[str, int]:
        n, m = len(self.prompt_ids), len(out.ids)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}


def _deadline(swarm: Swarm) -> float | None:
    limit = swarm.config.generate_timeout_s
    return None if limit is None else asyncio.get_running_loop().time() + limit


async def _timed(swarm: Swarm, aw: Awaitable[T], deadline: float | None) -> T:
    """`aw`, or `GenerateTimeout` (504) once `generate_timeout_s` has passed: a hung engine call
    is cancelled and answered, never left holding the request (or the gate) forever."""
    if deadline is None:
        return await aw
    try:
        return await asyncio.wait_for(aw, max(0.0, deadline - asyncio.get_running_loop().time()))
    except TimeoutError:
        swarm.counters["generate_timeouts"] += 1
        log.warning("generation exceeded generate_timeout_s=%s; cancelled", swarm.config.generate_timeout_s)
        raise GenerateTimeout(swarm.config.generate_timeout_s) from None


async def _generate(call: Generation) -> tuple[OutputText, str, int]:
    out = OutputText(call.swarm.renderer, call.params.stop)
    async with call.swarm.gate.generating():
        completion = await _timed(call.swarm, call.swarm.engine.generate(
            GenerateRequest(call.prompt_ids, call.params)), _deadline(call.swarm))
    out.add(completion.token_ids, completion.logprobs)
    out.finish()
    reason = "stop" if out.stopped else completion.finish_reason
    call.record(out, completion.policy_version)
    return out, reason, completion.policy_version


def _sse(payload: Any) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def _stream(call: Generation, chunk: Callable[[str, list[int], list[float], str | None], dict],
                  first: dict | None, include_usage: bool, obj: str) -> AsyncIterator[str]:
    """SSE events for one streamed call; the call is recorded once generation completed."""
    out = OutputText(call.swarm.renderer, call.params.stop)
    reason = "length"
    if first is not None:
        yield _sse(first)
    try:
        async with call.swarm.gate.generating():
            version = call.swarm.engine.policy_version
            agen = call.swarm.engine.stream(GenerateRequest(call.prompt_ids, call.params))
            deadline = _deadline(call.swarm)
            try:
                while True:
                    try:
                        c = await _timed(call.swarm, agen.__anext__(), deadline)
                    except StopAsyncIteration:
                        break
                    text, ids, lps = out.add(c.token_ids, c.logprobs)
                    if text or (ids and call.want_ids):
                        yield _sse(chunk(text, ids, lps, None))
                    if out.stopped or c.finish_reason:
                        reason = "stop" if out.stopped else (c.finish_reason or reason)
                        break
            finally:
                aclose = getattr(agen, "aclose", None)
                if aclose is not None:
                    await aclose()
    except SwarmError as exc:  # a generation timeout after the headers went out: in-band too
        yield _sse(domain_error_body(exc))
        yield _sse("[DONE]")
        return
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        log.exception("stream failed")
        yield _sse(error_body(500, f"generation failed: {type(exc).__name__}", "engine_error"))
        yield _sse("[DONE]")
        return
    call.record(out, version)
    yield _sse(chunk(out.finish(), [], [], reason))
    if include_usage:
        yield _sse({"id": call.rid, "object": obj, "created": call.created,
                    "model": call.swarm.model_name, "choices": [], "usage": call.usage(out)})
    yield _sse("[DONE]")


def _streaming(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _logprob_content(swarm: Swarm, ids: list[int], lps: list[float]) -> list[dict]:
    out = []
    for t, lp in zip(ids, lps):
        text = swarm.renderer.token_text(t)
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "replace")),
                    "top_logprobs": []})
    return out


def _fingerprint(version: int) -> str:
    return f"roost-policy-v{version}"


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           ep: Episode = Depends(open_episode),
                           x_roost_agent: str | None = Header(None)) -> Any:
    swarm = current_swarm(request)
    agent = _agent(x_roost_agent)
    body.check_n()
    text = swarm.renderer.render(body.message_dicts(), body.tools)
    prompt = swarm.renderer.chat_prompt(text, ep.calls, agent, mode=swarm.config.continuity)
    swarm.counters["prompt_continued"] += prompt.continued
    swarm.counters["prompt_drift"] += prompt.drift
    ep.drift += int(prompt.drift)
    call = Generation(swarm, ep, agent, prompt.ids, _params(swarm, body, len(prompt.ids), body.wants_max_tokens()),
                "chatcmpl-" + uuid.uuid4().hex, int(time.time()))
    want = call.want_ids = bool(body.return_token_ids or body.logprobs)
    head = {"id": call.rid, "object": "chat.completion.chunk", "created": call.created,
            "model": swarm.model_name, "system_fingerprint": _fingerprint(swarm.engine.policy_version)}

    if body.stream:
        def chunk(text: str, ids: list[int], lps: list[float], reason: str | None) -> dict:
            delta = {"content": text} if text or reason is None else {}
            choice: dict[str, Any] = {"index": 0, "delta": delta,
                                      "logprobs": None, "finish_reason": reason}
            if want:
                choice["token_ids"] = ids
                choice["logprobs"] = {"content": _logprob_content(swarm, ids, lps)}
            return {**head, "choices": [choice]}

        first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}]}
        if want:
            first["prompt_token_ids"] = call.prompt_ids
        return _streaming(_stream(call, chunk, first, body.include_usage(), "chat.completion.chunk"))

    out, reason, version = await _generate(call)
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": out.text},
                              "logprobs": None, "finish_reason": reason}
    response: dict[str, Any] = {**head, "object": "chat.completion",
                                "system_fingerprint": _fingerprint(version),
                                "choices": [choice], "usage": call.usage(out)}
    if want:
        choice["token_ids"] = out.ids
        choice["logprobs"] = {"content": _logprob_content(swarm, out.ids, out.logprobs)}
        response["prompt_token_ids"] = call.prompt_ids
        response["policy_version"] = version
    return response


def _completion_logprobs(swarm: Swarm, ids: list[int], lps: list[float], offset: int) -> dict:
    tokens = [swarm.renderer.token_text(t) for t in ids]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": None, "text_offset": offsets}


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request,
                      ep: Episode = Depends(open_episode),
                      x_roost_agent: str | None = Header(None)) -> Any:
    swarm = current_swarm(request)
    agent = _agent(x_roost_agent)
    body.check_unsupported()
    prompt = body.prompt_one()
    ids = swarm.renderer.encode(prompt) if isinstance(prompt, str) else swarm.renderer.check_ids(prompt)
    call = Generation(swarm, ep, agent, ids, _params(swarm, body, len(ids), body.max_tokens),
                "cmpl-" + uuid.uuid4().hex, int(time.time()))
    want_lp = body.logprobs is not None and body.logprobs is not False
    want_ids = call.want_ids = bool(body.return_token_ids or want_lp)
    head = {"id": call.rid, "object": "text_completion", "created": call.created, "model": swarm.model_name,
            "system_fingerprint": _fingerprint(swarm.engine.policy_version)}

    if body.stream:
        sent = [0]

        def chunk(text: str, ids_: list[int], lps: list[float], reason: str | None) -> dict:
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            if want_lp:
                choice["logprobs"] = _completion_logprobs(swarm, ids_, lps, sent[0])
            if want_ids:
                choice["token_ids"] = ids_
            sent[0] += len(text)
            return {**head, "choices": [choice]}

        first = None
        if want_ids:
            first = {**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": None,
                                          "prompt_token_ids": ids, "token_ids": []}]}
        return _streaming(_stream(call, chunk, first, body.include_usage(), "text_completion"))

    out, reason, version = await _generate(call)
    choice = {"index": 0, "text": out.text, "finish_reason": reason, "logprobs": None}
    if want_lp:
        choice["logprobs"] = _completion_logprobs(swarm, out.ids, out.logprobs, 0)
    response = {**head, "system_fingerprint": _fingerprint(version), "choices": [choice],
                "usage": call.usage(out)}
    if want_ids:
        choice["token_ids"] = out.ids
        choice["prompt_token_ids"] = ids
        response["prompt_token_ids"] = ids
        response["policy_version"] = version
    return response


@router.get("/models")
async def models(swarm: Swarm = Depends(any_caller)) -> Any:
    return {"object": "list", "data": [{"id": swarm.model_name, "object": "model", "created": 0,
                                        "owned_by": "roost", "policy_version": swarm.engine.policy_version}]}
