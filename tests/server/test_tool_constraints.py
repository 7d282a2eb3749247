"""One tool, one prompt on every route; tools with a response format, and forced tool calls, constrained.

* The same function declared on `/v1/chat/completions` (keys in any order, `strict` included),
  `/v1/messages` and `/v1/responses` renders to byte-identical prompt ids (`render.canonical_tools`).
* With tools and a JSON `response_format` the grammar (`swarm.chat.tool_grammar`) admits a
  well-formed Hermes call or the schema's JSON, nothing else; `tool_choice` "required" or a named
  function (Anthropic `any` / `tool`) admits only a valid call of the allowed tools. The FakeEngine
  (unscripted) draws random tokens from what the grammar allows: whatever it draws must parse.
* A constrained completion ends with `<|im_end|>`, the template's end of turn, in the trained sample.
* `parallel_tool_calls: false` (Anthropic `disable_parallel_tool_use`): at most one call answered; under
  a grammar it is the only one generated, without one (`auto`) the first is kept and the rest counted
  in `tool_calls_dropped`, the sample as generated (docs/responses.md).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer

PARAMS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
QUESTION = "What is 2+3?"


@pytest.fixture
def srv(make_server: Any, model_dir: Any) -> RunningServer:
    return make_server(engine=FakeEngine(model_dir, seed=7), group_size=1, batch_groups=64)


def _post(srv: RunningServer, path: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{srv.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _prompt(srv: RunningServer, ep: Any) -> list[int]:
    return list(srv.swarm.registry.get(ep.id).calls[-1].prompt_ids)


def test_one_tool_renders_identically_on_every_route(srv: RunningServer) -> None:
    client = SwarmClient(srv.url, srv.token)
    chat, messages, responses = client.claim("t-chat"), client.claim("t-msg"), client.claim("t-resp")
    fn = {"parameters": PARAMS, "description": "Add two integers.", "name": "add", "strict": True}  # any key order
    _post(
        srv,
        "/v1/chat/completions",
        chat.api_key,
        {
            "model": chat.model,
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": [{"function": fn, "type": "function"}],
            "max_tokens": 4,
        },
    )
    anthropic.Anthropic(base_url=srv.url, api_key=messages.api_key, max_retries=0).messages.create(
        model=messages.model,
        max_tokens=4,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[{"name": "add", "description": "Add two integers.", "input_schema": PARAMS}],
    )
    _post(
        srv,
        "/v1/responses",
        responses.api_key,
        {
            "model": responses.model,
            "input": QUESTION,
            "tools": [{"type": "function", "name": "add", "description": "Add two integers.", "parameters": PARAMS}],
            "max_output_tokens": 4,
        },
    )
    ids = [_prompt(srv, ep) for ep in (chat, messages, responses)]
    assert ids[0] == ids[1] == ids[2]
    text = srv.swarm.renderer.tok.decode(ids[0])
    assert '"name": "add"' in text and "strict" not in text


def _chat(srv: RunningServer, ep: Any, **kw: Any) -> dict[str, Any]:
    body = {"model": ep.model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 200, **kw}
    return _post(srv, "/v1/chat/completions", ep.api_key, body)


TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": PARAMS}},
    {
        "type": "function",
        "function": {
            "name": "neg",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    },
]
ANSWER = {
    "type": "object",
    "properties": {"result": {"type": "integer"}},
    "required": ["result"],
    "additionalProperties": False,
}


def _end_of_turn(srv: RunningServer, ep: Any) -> None:
    call = srv.swarm.registry.get(ep.id).calls[-1]
    assert call.completion_ids[-1] == srv.swarm.renderer.tok.convert_tokens_to_ids("<|im_end|>")


def test_tools_with_a_response_format_admit_a_call_or_the_schema(srv: RunningServer) -> None:
    client = SwarmClient(srv.url, srv.token)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    kinds = set()
    for i in range(12):
        ep = client.claim(f"t-mixed-{i}")
        r = _chat(srv, ep, tools=TOOLS, response_format=fmt, seed=i)
        choice = r["choices"][0]
        if choice["finish_reason"] == "length":
            continue
        message = choice["message"]
        if message.get("tool_calls"):
            kinds.add("call")
            assert choice["finish_reason"] == "tool_calls" and not message["content"]
            for call in message["tool_calls"]:
                args = json.loads(call["function"]["arguments"])
                assert call["function"]["name"] in ("add", "neg") and isinstance(args, dict)
                assert set(args) == ({"a", "b"} if call["function"]["name"] == "add" else {"x"})
        else:
            kinds.add("answer")
            assert set(json.loads(message["content"])) == {"result"}
        _end_of_turn(srv, ep)
    assert kinds == {"call", "answer"}  # both branches of the grammar are reachable


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "neg"}}])
def test_a_forced_tool_choice_gets_a_valid_call(srv: RunningServer, choice: Any) -> None:
    client = SwarmClient(srv.url, srv.token)
    done = 0
    for i in range(6):
        ep = client.claim(f"t-forced-{i}")
        r = _chat(srv, ep, tools=TOOLS, tool_choice=choice, seed=100 + i)
        c = r["choices"][0]
        if c["finish_reason"] == "length":
            continue
        done += 1
        assert c["finish_reason"] == "tool_calls", c
        names = {t["function"]["name"] for t in c["message"]["tool_calls"]}
        assert names <= ({"add", "neg"} if choice == "required" else {"neg"})
        _end_of_turn(srv, ep)
        prompt = srv.swarm.renderer.tok.decode(_prompt(srv, ep))
        assert prompt.endswith('<tool_call>\n{"name": ' + ('"neg", "arguments": ' if choice != "required" else '"'))
    assert done >= 3


def test_anthropic_any_is_a_forced_call(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t-any")
    msg = anthropic.Anthropic(base_url=srv.url, api_key=ep.api_key, max_retries=0).messages.create(
        model=ep.model,
        max_tokens=200,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[{"name": "add", "input_schema": PARAMS}],
        tool_choice={"type": "any"},
    )
    assert msg.stop_reason == "tool_use"
    use = [b for b in msg.content if b.type == "tool_use"]
    assert use and use[0].name == "add" and set(use[0].input) == {"a", "b"}


def test_parallel_tool_calls_false_under_a_grammar_generates_one_call(srv: RunningServer) -> None:
    """A forced choice with `parallel_tool_calls: false`: the grammar admits one call, then the end of turn."""
    client = SwarmClient(srv.url, srv.token)
    done = 0
    for i in range(6):
        ep = client.claim(f"t-one-{i}")
        r = _chat(srv, ep, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=200 + i)
        c = r["choices"][0]
        if c["finish_reason"] == "length":
            continue
        done += 1
        assert c["finish_reason"] == "tool_calls" and len(c["message"]["tool_calls"]) == 1, c
        completion = srv.swarm.renderer.tok.decode(srv.swarm.registry.get(ep.id).calls[-1].completion_ids)
        assert completion.count("</tool_call>") == 1, completion  # generated once, not cut afterwards
        _end_of_turn(srv, ep)
    assert done >= 3
    assert srv.swarm.counters["tool_calls_dropped"] == 0


TWO_CALLS = (
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "neg", "arguments": {"x": 5}}\n</tool_call>'
)


@pytest.fixture
def two_calls(make_server: Any, model_dir: Any) -> RunningServer:
    """A model that always answers with two calls (tool_choice auto: no grammar)."""
    return make_server(engine=FakeEngine(model_dir, script=lambda ids: TWO_CALLS), group_size=1, batch_groups=64)


def test_parallel_tool_calls_false_without_a_grammar_keeps_the_first_call(two_calls: RunningServer) -> None:
    srv = two_calls
    client = SwarmClient(srv.url, srv.token)
    ep = client.claim("t-both")
    both = _chat(srv, ep, tools=TOOLS)["choices"][0]
    assert [t["function"]["name"] for t in both["message"]["tool_calls"]] == ["add", "neg"]
    assert srv.swarm.counters["tool_calls_dropped"] == 0

    ep = client.claim("t-first")
    first = _chat(srv, ep, tools=TOOLS, parallel_tool_calls=False)["choices"][0]
    assert first["finish_reason"] == "tool_calls" and not first["message"]["content"]
    assert [t["function"]["name"] for t in first["message"]["tool_calls"]] == ["add"]
    assert json.loads(first["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert srv.swarm.counters["tool_calls_dropped"] == 1
    call = srv.swarm.registry.get(ep.id).calls[-1]  # the sample is what the model generated: both calls
    assert srv.swarm.renderer.tok.decode(call.completion_ids, skip_special_tokens=True) == TWO_CALLS

    # the next turn sends the kept call back: rendered from the exact text, so the episode's ids continue
    turn2 = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": first["message"]["tool_calls"]},
        {"role": "tool", "tool_call_id": first["message"]["tool_calls"][0]["id"], "content": "5"},
    ]
    _chat(srv, ep, tools=TOOLS, parallel_tool_calls=False, messages=turn2)
    calls = srv.swarm.registry.get(ep.id).calls
    assert calls[-1].prompt_ids[: len(calls[0].full)] == calls[0].full
    assert srv.swarm.counters["tool_calls_dropped"] == 2

    # streamed: one call delta
    ep = client.claim("t-stream")
    body = {
        "model": ep.model,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": TOOLS,
        "parallel_tool_calls": False,
        "stream": True,
        "max_tokens": 200,
    }
    names = []
    with httpx.stream(
        "POST", f"{srv.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ep.api_key}"}
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:])["choices"]:
                    for t in (ch.get("delta") or {}).get("tool_calls") or []:
                        if (t.get("function") or {}).get("name"):
                            names.append(t["function"]["name"])
    assert names == ["add"]


def test_one_call_on_the_responses_and_messages_routes(two_calls: RunningServer) -> None:
    srv = two_calls
    client = SwarmClient(srv.url, srv.token)
    ep = client.claim("t-resp-one")
    tool = {"type": "function", "name": "add", "parameters": PARAMS}
    neg = {"type": "function", "name": "neg", "parameters": {"type": "object", "properties": {"x": {}}}}
    body = {"model": ep.model, "input": QUESTION, "tools": [tool, neg], "max_output_tokens": 200}
    r = _post(srv, "/v1/responses", ep.api_key, {**body, "parallel_tool_calls": False})
    assert [o["name"] for o in r["output"] if o["type"] == "function_call"] == ["add"]
    assert r["parallel_tool_calls"] is False
    ep = client.claim("t-resp-two")
    r = _post(srv, "/v1/responses", ep.api_key, body)
    assert [o["name"] for o in r["output"] if o["type"] == "function_call"] == ["add", "neg"]

    ep = client.claim("t-msg-one")
    msg = anthropic.Anthropic(base_url=srv.url, api_key=ep.api_key, max_retries=0).messages.create(
        model=ep.model,
        max_tokens=200,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[{"name": "add", "input_schema": PARAMS}, {"name": "neg", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert [b.name for b in msg.content if b.type == "tool_use"] == ["add"]
    assert srv.swarm.counters["tool_calls_dropped"] == 2
