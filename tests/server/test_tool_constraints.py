"""One tool, one prompt on every route; tools with a response format, and forced tool calls, constrained.

* The same function declared on `/v1/chat/completions` (keys in any order, `strict` included),
  `/v1/messages` and `/v1/responses` renders to byte-identical prompt ids (`render.canonical_tools`).
* With tools and a JSON `response_format` the grammar (`swarm.chat.tool_grammar`) admits a
  well-formed Hermes call or the schema's JSON, nothing else; `tool_choice` "required" or a named
  function (Anthropic `any` / `tool`) admits only a valid call of the allowed tools. The FakeEngine
  (unscripted) draws random tokens from what the grammar allows: whatever it draws must parse.
* A constrained completion ends with `<|im_end|>`, the template's end of turn, in the trained sample.
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
