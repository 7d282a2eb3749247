"""The OpenAI-compatible routes, driven by the official `openai` package against a real server."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine, token_logprob
from swarm.model.tokenizer import CONTEXT_LENGTH
from swarm.testing import RunningServer

MESSAGES = [{"role": "user", "content": "What is 12+30?"}]


def _episode(srv: RunningServer, task_id: str = "t1"):
    return SwarmClient(srv.url, srv.token).claim(task_id)


def test_chat_returns_token_ids_that_decode_to_text(server: RunningServer, model_dir) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    ep = _episode(server)
    r = ep.openai.chat.completions.create(
        model=ep.model, messages=MESSAGES, max_tokens=24, extra_body={"return_token_ids": True}
    )
    extra = r.model_extra or {}
    choice = r.choices[0]
    ids = choice.model_extra["token_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == choice.message.content
    assert extra["prompt_token_ids"] == tok.encode(
        tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    lps = [c.logprob for c in choice.logprobs.content]
    assert lps == [token_logprob(t) for t in ids]
    assert r.usage.completion_tokens == len(ids) and r.usage.prompt_tokens == len(extra["prompt_token_ids"])
    assert choice.finish_reason in ("stop", "length")
    assert r.system_fingerprint == "roost-policy-v0"
    calls = server.swarm.registry.get(ep.id).calls
    assert len(calls) == 1 and calls[0].completion_ids == ids and calls[0].agent == "main"


def test_plain_chat_has_no_ids_and_logprobs_flag_adds_them(server: RunningServer) -> None:
    ep = _episode(server)
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=8)
    assert r.choices[0].logprobs is None and "token_ids" not in (r.choices[0].model_extra or {})
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=8, logprobs=True)
    assert len(r.choices[0].logprobs.content) == len(r.choices[0].model_extra["token_ids"])


def test_streaming_matches_token_ids(server: RunningServer, model_dir) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    ep = _episode(server)
    stream = ep.openai.chat.completions.create(
        model=ep.model,
        messages=MESSAGES,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    text, ids, reasons, usage = "", [], [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids", [])
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert reasons and reasons[-1] in ("stop", "length")
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert usage is not None and usage.completion_tokens == len(ids)
    assert server.swarm.registry.get(ep.id).calls[-1].completion_ids == ids


def test_async_client_and_agent_header(server: RunningServer) -> None:
    ep = _episode(server)

    async def go() -> list[str]:
        a = ep.async_openai_client(agent="planner")
        b = ep.async_openai_client(agent="critic")
        rs = await asyncio.gather(
            *(c.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=6) for c in (a, b, a))
        )
        stream = await a.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=6, stream=True)
        async for _ in stream:
            pass
        await a.close()
        await b.close()
        return [r.choices[0].finish_reason for r in rs]

    assert len(asyncio.run(go())) == 3
    agents = sorted(c.agent for c in server.swarm.registry.get(ep.id).calls)
    assert agents == ["critic", "planner", "planner", "planner"]


def test_completions_with_text_and_token_prompts(server: RunningServer, model_dir) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    ep = _episode(server)
    r = ep.openai.completions.create(model=ep.model, prompt="The answer is", max_tokens=10, logprobs=0)
    ids = r.choices[0].model_extra["token_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == r.choices[0].text
    assert r.choices[0].logprobs.token_logprobs == [token_logprob(t) for t in ids]
    prompt_ids = tok.encode("The answer is", add_special_tokens=False)
    r2 = ep.openai.completions.create(
        model=ep.model, prompt=prompt_ids, max_tokens=10, extra_body={"return_token_ids": True}
    )
    assert r2.choices[0].model_extra["prompt_token_ids"] == prompt_ids
    chunks = list(ep.openai.completions.create(model=ep.model, prompt=prompt_ids, max_tokens=10, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    models = ep.openai.models.list()
    assert [m.id for m in models.data] == [ep.model]


def test_sampling_knobs_reach_the_engine(server: RunningServer) -> None:
    ep = _episode(server)
    eng: FakeEngine = server.engine
    ep.openai.chat.completions.create(
        model=ep.model, messages=MESSAGES, max_tokens=7, temperature=0.3, top_p=0.9, seed=5, stop=["xyz"]
    )
    p = eng.requests[-1].params
    assert (p.max_tokens, p.temperature, p.top_p, p.seed, p.stop) == (7, 0.3, 0.9, 5, ("xyz",))
    assert eng.tokenizer.eos_token_id in p.stop_token_ids
    ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES)
    assert eng.requests[-1].params.max_tokens == 256  # the default when a request names none
    # the whole context (4,096 = the max_tokens limit): no room left after the prompt
    for too_many, code in ((10**6, "max_tokens_too_large"), (CONTEXT_LENGTH, "context_length_exceeded")):
        with pytest.raises(openai.BadRequestError) as err:  # refused, never silently capped
            ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=too_many)
        assert err.value.code == code


def test_stop_string_cuts_text(make_server) -> None:
    srv = make_server(engine=None)
    srv.swarm.engine.script = lambda ids: "12 + 30 = 42. Done"
    ep = _episode(srv)
    r = ep.openai.chat.completions.create(
        model=ep.model, messages=MESSAGES, stop=["."], extra_body={"return_token_ids": True}
    )
    assert r.choices[0].message.content == "12 + 30 = 42" and r.choices[0].finish_reason == "stop"
    s = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, stop=["= 4"], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == "12 + 30 "


def test_multi_turn_prompt_continues_exact_ids(make_server) -> None:
    srv = make_server()
    ep = _episode(srv)
    msgs = list(MESSAGES)
    for _ in range(3):
        r = ep.openai.chat.completions.create(
            model=ep.model, messages=msgs, max_tokens=12, extra_body={"return_token_ids": True}
        )
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "Try again."},
        ]
    calls = srv.swarm.registry.get(ep.id).calls
    for a, b in zip(calls, calls[1:]):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
    assert srv.swarm.counters["prompt_continued"] == 2
    ep.finish(1.0)
    assert srv.swarm.batcher.groups[ep.group_id].finished[0].samples.__len__() == 1  # merged


@pytest.mark.parametrize(
    "body,code",
    [
        ({"messages": MESSAGES, "n": 129}, "invalid_request"),
        ({"messages": MESSAGES, "tool_choice": "required"}, "invalid_tool_choice"),
        ({"messages": MESSAGES, "logprobs": False, "top_logprobs": 2}, "invalid_top_logprobs"),
        ({"messages": MESSAGES, "response_format": {"type": "yaml"}}, "invalid_response_format"),
        ({"messages": []}, "invalid_request"),
        ({"messages": MESSAGES, "temperature": -1}, "invalid_request"),
        ({"messages": MESSAGES, "max_tokens": 0}, "invalid_request"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "unsupported_content"),
        ({"messages": MESSAGES, "stop": ["a"] * 17}, "invalid_stop"),
        # any role string was rendered as a turn of its own, a user turn without content as an empty one
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "invalid_message"),
        ({"messages": [{"role": "user", "content": None}]}, "invalid_message"),
        ({"messages": [{"role": "tool", "tool_call_id": "c"}]}, "invalid_message"),
        # sampled away from the policy's distribution: served as if absent before, nothing said
        ({"messages": MESSAGES, "presence_penalty": 0.5}, "unsupported_sampling"),
        ({"messages": MESSAGES, "logit_bias": {"5": 10}}, "unsupported_sampling"),
        ({"messages": MESSAGES, "frequency_penalty": -0.2}, "unsupported_sampling"),
        ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "duplicate_tool"),
        # malformed tools were left out of the prompt without a word: the agent believed the model saw them
        ({"messages": MESSAGES, "tools": [{"x": 1}]}, "unsupported_tool"),
        ({"messages": MESSAGES, "tools": [{"type": "web_search"}]}, "unsupported_tool"),
        ({"messages": MESSAGES, "tools": [{"type": "function", "function": {}}]}, "invalid_tool"),
        (
            {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "a", "parameters": "x"}}]},
            "invalid_tool",
        ),
        # a tool result answering no call the model made
        ({"messages": [*MESSAGES, {"role": "tool", "tool_call_id": "zzz", "content": "4"}]}, "unknown_call_id"),
    ],
)
def test_bad_chat_requests_are_400(server: RunningServer, body: dict, code: str) -> None:
    ep = _episode(server)
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": ep.model, **body},
        headers={"Authorization": f"Bearer {ep.api_key}"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == code
    with pytest.raises(openai.BadRequestError):
        ep.openai.chat.completions.create(model=ep.model, **body)


def test_sampling_knobs_at_their_neutral_values_are_served(server: RunningServer) -> None:
    ep = _episode(server)
    neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "top_k": -1, "min_p": 0}
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=4, extra_body=neutral)
    assert r.choices[0].message is not None
    with pytest.raises(openai.BadRequestError, match="repetition_penalty=1.1, top_k=20: not applied by this server"):
        ep.openai.completions.create(
            model=ep.model, prompt="hi", max_tokens=4, extra_body={"repetition_penalty": 1.1, "top_k": 20}
        )


def test_openai_routes_need_an_open_episode_key(server: RunningServer) -> None:
    client = SwarmClient(server.url, server.token)
    ep = client.claim("t1")
    bad = ep.openai_client(api_key=ep.api_key[:-2] + "00")
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=ep.model, messages=MESSAGES)
    ep.finish(0.5)
    with pytest.raises(openai.ConflictError):
        ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES)


def test_client_disconnect_mid_stream_leaves_server_clean(make_server, model_dir) -> None:
    srv = make_server(engine=FakeEngine(model_dir, token_delay_s=0.05, stop_probability=0.0))
    ep = _episode(srv)
    body = {"model": ep.model, "messages": MESSAGES, "max_tokens": 200, "stream": True}
    with httpx.stream(
        "POST", f"{srv.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ep.api_key}"}
    ) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # one event, then hang up
    deadline = time.monotonic() + 5
    while srv.swarm.gate._active:
        assert time.monotonic() < deadline, "the gate still counts the abandoned stream"
        time.sleep(0.05)
    assert srv.swarm.registry.get(ep.id).calls == []  # an abandoned call is not trained
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, max_tokens=3)
    assert r.choices[0].finish_reason == "length"
