"""Tool calling end to end: the `openai` SDK (sync, streaming) and a LangGraph ReAct agent run
multi-turn tool episodes against a real loopback server; the recorded calls merge into one sample
in which every generated token is trained exactly once (and forced-call prefills never are).

The model is a FakeEngine script keyed on the prompt: no tool response yet -> call `add`; one ->
call `mul`; two -> answer. It writes tool calls in the embedded template's Hermes format.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from tool_agent import agent_script, check_one_sample, finish_and_sample, run_tool

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "mul",
            "description": "a * b",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    },
]
QUESTION = [{"role": "user", "content": "What is (12 + 30) * 2?"}]


@pytest.fixture
def srv(make_server, model_dir) -> RunningServer:
    engine = FakeEngine(model_dir, chunk_tokens=2)
    engine.script = agent_script(engine)
    return make_server(engine=engine)


def test_sdk_multi_turn_tool_episode_merges_into_one_sample(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t1")
    msgs: list[Any] = list(QUESTION)
    seen = []
    for turn in range(4):
        r = ep.openai.chat.completions.create(model=ep.model, messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        if not m.tool_calls:
            assert r.choices[0].finish_reason == "stop" and m.content == "The answer is 84."
            break
        assert r.choices[0].finish_reason == "tool_calls"
        seen.append((m.content, [(t.function.name, t.function.arguments) for t in m.tool_calls]))
        assistant = m.model_dump(exclude_none=True)
        if turn == 1:  # a client that re-serialises arguments its own way: still the exact text next turn
            for t in assistant["tool_calls"]:
                t["function"]["arguments"] = json.dumps(json.loads(t["function"]["arguments"]), indent=2)
        msgs.append(assistant)
        msgs += [
            {"role": "tool", "tool_call_id": t.id, "content": run_tool(t.function.name, t.function.arguments)}
            for t in m.tool_calls
        ]
    assert seen == [("I will add first.", [("add", '{"a": 12,  "b": 30}')]), (None, [("mul", '{"a": 42, "b": 2}')])]
    assert srv.swarm.counters["prompt_continued"] == 2
    calls, samples = finish_and_sample(srv, ep)
    assert len(calls) == 3 and len(samples) == 1  # merge ratio 3 calls : 1 sample
    check_one_sample(srv, calls, samples[0])


def test_streamed_tool_calls_arrive_as_openai_deltas(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t1")
    msgs: list[Any] = list(QUESTION)
    for _ in range(3):
        content, calls, reasons, first_deltas = "", {}, [], []
        for chunk in ep.openai.chat.completions.create(model=ep.model, messages=msgs, tools=TOOLS, stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    if d.index not in calls:
                        first_deltas.append(d)
                        calls[d.index] = {
                            "id": d.id,
                            "type": "function",
                            "function": {"name": d.function.name, "arguments": ""},
                        }
                    calls[d.index]["function"]["arguments"] += d.function.arguments or ""
                if c.finish_reason:
                    reasons.append(c.finish_reason)
        assert all(d.id and d.type == "function" and d.function.name for d in first_deltas)
        if not calls:
            assert reasons == ["stop"] and content == "The answer is 84."
            break
        assert reasons == ["tool_calls"]
        msgs.append({"role": "assistant", "content": content or None, "tool_calls": list(calls.values())})
        msgs += [
            {
                "role": "tool",
                "tool_call_id": c["id"],
                "content": run_tool(c["function"]["name"], c["function"]["arguments"]),
            }
            for c in calls.values()
        ]
    calls_, samples = finish_and_sample(srv, ep)
    assert len(calls_) == 3 and len(samples) == 1
    check_one_sample(srv, calls_, samples[0])


def test_tool_choice_none_required_and_named(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t1")
    r = ep.openai.chat.completions.create(model=ep.model, messages=QUESTION, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content
    r = ep.openai.chat.completions.create(
        model=ep.model,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "mul"}},
        extra_body={"return_token_ids": True},
    )
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments, r.choices[0].finish_reason) == (
        "mul",
        '{"a": 5, "b": 6}',
        "tool_calls",
    )
    prompt = srv.engine.tokenizer.decode(r.model_extra["prompt_token_ids"])
    assert prompt.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "mul", "arguments": ')  # prefilled
    msgs = [
        *QUESTION,
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "30"},
        {"role": "tool", "tool_call_id": call.id, "content": "30"},
    ]
    ep.openai.chat.completions.create(model=ep.model, messages=msgs, tools=TOOLS)
    calls, samples = finish_and_sample(srv, ep)
    merged = [s for s in samples if len(s.input_ids) == len(calls[-1].full)]
    check_one_sample(srv, calls[1:], merged[0])  # the prefill is prompt: mask 0, never trained
    with pytest.raises(openai.BadRequestError):
        SwarmClient(srv.url, srv.token).claim("t2").openai.chat.completions.create(
            model=ep.model,
            messages=QUESTION,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )


def test_malformed_call_is_plain_content(make_server, model_dir) -> None:
    engine = FakeEngine(model_dir)
    engine.script = lambda ids: '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>'
    srv = make_server(engine=engine)
    ep = SwarmClient(srv.url, srv.token).claim("t1")
    for stream in (False, True):
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {ep.api_key}"},
            json={"model": ep.model, "messages": QUESTION, "tools": TOOLS, "stream": stream},
        )
        assert r.status_code == 200
        if not stream:
            m = r.json()["choices"][0]
            assert m["finish_reason"] == "stop" and "tool_calls" not in m["message"]
            assert m["message"]["content"].startswith("<tool_call>")
        else:
            assert '"tool_calls"' not in r.text and "[DONE]" in r.text


def test_langgraph_react_agent_runs_a_tool_episode(srv: RunningServer) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def add(a: int, b: int) -> int:
        """a + b"""
        return a + b

    @tool
    def mul(a: int, b: int) -> int:
        """a * b"""
        return a * b

    ep = SwarmClient(srv.url, srv.token).claim("t1")
    llm = ChatOpenAI(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, max_retries=0)
    agent = create_react_agent(llm, [add, mul])
    out = agent.invoke({"messages": [("user", QUESTION[0]["content"])]})
    assert out["messages"][-1].content == "The answer is 84."
    assert [m.content for m in out["messages"] if m.type == "tool"] == ["42", "84"]
    calls, samples = finish_and_sample(srv, ep)
    assert len(calls) == 3 and len(samples) == 1
    check_one_sample(srv, calls, samples[0])
