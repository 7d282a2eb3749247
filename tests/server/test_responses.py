"""`POST /v1/responses` driven by the official `openai` SDK against a real server on loopback.

The FakeEngine is scripted on the prompt (as in test_tool_calls.py): no tool response yet -> call
`add`; one -> call `mul`; two -> answer, in the embedded template's Hermes format. A three-turn
tool episode (function_call -> function_call_output -> ... -> answer) must come back in the
Responses shapes, streamed or not, and be recorded so its turns merge into one training sample
with every generated token trained once; `previous_response_id` continues the same way.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from tool_agent import agent_script, check_one_sample, finish_and_sample, run_tool, tool_call_text

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine
from swarm.testing import RunningServer

TOOLS = [
    {
        "type": "function",
        "name": "add",
        "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        "strict": False,
    },
    {
        "type": "function",
        "name": "mul",
        "description": "a * b",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
]
QUESTION = "What is (12 + 30) * 2?"


@pytest.fixture
def srv(make_server: Any, model_dir: Any) -> RunningServer:
    engine = FakeEngine(model_dir, chunk_tokens=2)
    engine.script = agent_script(engine)
    return make_server(engine=engine)


def _client(srv: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0, timeout=30)


def _outputs(items: list[Any]) -> list[dict[str, Any]]:
    """Output items as the input items a client sends back (the Agents SDK sends them as they came)."""
    return [i.model_dump(exclude_none=True) for i in items]


def test_three_turn_tool_episode_merges_into_one_sample(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t-resp")
    oc = _client(srv, ep.api_key)
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    seen = []
    for _ in range(4):
        r = oc.responses.create(model=ep.model, instructions="You calculate.", input=items, tools=TOOLS)
        assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
        assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            assert [o.type for o in r.output] == ["message"] and r.output_text == "The answer is 84."
            break
        seen.append((r.output_text, [(c.name, c.arguments) for c in calls]))
        assert all(c.call_id.startswith("call_") and c.id.startswith("fc_") for c in calls)
        items += _outputs(r.output)
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": run_tool(c.name, c.arguments)}
            for c in calls
        ]
        items.append({"type": "reasoning", "id": "rs_1", "summary": []})  # accepted and ignored
    assert seen == [("I will add first.", [("add", '{"a": 12,  "b": 30}')]), ("", [("mul", '{"a": 42, "b": 2}')])]
    assert srv.swarm.counters["prompt_continued"] == 2 and srv.swarm.counters["prompt_drift"] == 0
    recorded, samples = finish_and_sample(srv, ep)
    assert len(recorded) == 3 and len(samples) == 1
    check_one_sample(srv, recorded, samples[0])


def test_streamed_episode_with_previous_response_id(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t-resp-stream")
    oc = _client(srv, ep.api_key)
    previous, new_input = None, [{"role": "user", "content": QUESTION}]
    for turn in range(3):
        kinds, args_deltas, text = [], [], ""
        with oc.responses.stream(model=ep.model, input=new_input, tools=TOOLS, previous_response_id=previous) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    text += event.delta
                if event.type == "response.function_call_arguments.delta":
                    args_deltas.append(event.delta)
            final = stream.get_final_response()
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        calls = [o for o in final.output if o.type == "function_call"]
        assert text == final.output_text
        if turn < 2:
            assert len(calls) == 1 and args_deltas == [calls[0].arguments]
            assert "response.function_call_arguments.done" in kinds and "response.output_item.done" in kinds
            new_input = [
                {
                    "type": "function_call_output",
                    "call_id": calls[0].call_id,
                    "output": run_tool(calls[0].name, calls[0].arguments),
                }
            ]
            previous = final.id
        else:
            assert not calls and final.output_text == "The answer is 84."
    recorded, samples = finish_and_sample(srv, ep)
    assert len(recorded) == 3 and len(samples) == 1
    check_one_sample(srv, recorded, samples[0])


@pytest.mark.parametrize("limit", [None, 40])
def test_text_after_a_call_comes_in_the_order_a_stream_sends_it(make_server: Any, model_dir: Any, limit) -> None:
    """Text the model writes after a call (a second call the token limit cut, say) was put before the
    call without streaming and after it with; and a message the limit cut was "completed"."""
    engine = FakeEngine(model_dir, chunk_tokens=2)
    engine.script = lambda ids: "Adding.\n" + tool_call_text("add", '{"a": 1, "b": 2}') + "\nThen I will go on " * 8
    srv = make_server(engine=engine)
    ep = SwarmClient(srv.url, srv.token).claim("t-order")
    oc = _client(srv, ep.api_key)
    kw: dict[str, Any] = {"model": ep.model, "input": "1 + 2?", "tools": TOOLS[:1]}
    if limit:
        kw["max_output_tokens"] = limit
    plain = oc.responses.create(**kw)
    with oc.responses.stream(**kw) as stream:  # the SDK's final response is response.completed's only
        streamed = [e.response for e in stream if e.type in ("response.completed", "response.incomplete")][-1]

    def shape(r: Any) -> list[tuple]:
        return [(o.type, o.status, o.content[0].text if o.type == "message" else o.arguments) for o in r.output]

    last = "incomplete" if limit else "completed"
    assert [s[:2] for s in shape(plain)] == [
        ("message", "completed"),
        ("function_call", "completed"),
        ("message", last),
    ]
    assert shape(streamed) == shape(plain) and plain.status == streamed.status == last
    assert shape(plain)[0][2] == "Adding." and shape(plain)[2][2].startswith("Then I")


def test_json_schema_text_format(make_server: Any, model_dir: Any) -> None:
    srv = make_server(engine=FakeEngine(model_dir, seed=3))
    ep = SwarmClient(srv.url, srv.token).claim("t-json")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = _client(srv, ep.api_key).responses.create(
        model=ep.model,
        input="Give a number as JSON.",
        text={"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}},
        max_output_tokens=64,
    )
    assert r.status == "completed"
    value = json.loads(r.output_text)
    assert set(value) == {"n"} and isinstance(value["n"], int)
    call = srv.swarm.registry.get(ep.id).calls[-1]
    end = srv.swarm.renderer.tok.convert_tokens_to_ids("<|im_end|>")
    assert call.completion_ids[-1] == end  # a constrained turn ends as the template's turn does


def _error(r: httpx.Response) -> dict:
    body = r.json()
    return body["error"]


@pytest.mark.parametrize(
    "extra, status, code",
    [
        ({"tools": [{"type": "web_search"}]}, 400, "unsupported_tool"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            400,
            "unsupported_content",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "unsupported_input_item"),
        ({"previous_response_id": "resp_nope"}, 404, "previous_response_not_found"),
        ({"model": "gpt-nope"}, 404, "model_not_found"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "invalid_response_format"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": TOOLS}, 400, "invalid_tool_choice"),
        ({"input": None}, 400, "missing_input"),
        # sampling knobs chat refuses (OpenAI's Responses has none of them): refused, never ignored
        ({"presence_penalty": 1.0}, 400, "unsupported_sampling"),
        ({"frequency_penalty": 0.5}, 400, "unsupported_sampling"),
        ({"top_k": 5}, 400, "unsupported_sampling"),
        ({"logit_bias": {"5": 3}}, 400, "unsupported_sampling"),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call_output", "call_id": "c9", "output": "1"},
                ]
            },
            400,
            "unknown_call_id",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, 400, "duplicate_tool"),
        ({"stream": "yes"}, 400, "invalid_request"),
        ({"parallel_tool_calls": "false"}, 400, "invalid_request"),
    ],
)
def test_bad_requests_are_4xx_with_a_code(srv: RunningServer, extra: dict, status: int, code: str) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t-bad")
    body = {"model": ep.model, "input": "hi", **extra}
    r = httpx.post(f"{srv.url}/v1/responses", json=body, headers={"Authorization": f"Bearer {ep.api_key}"}, timeout=30)
    assert r.status_code == status and _error(r)["code"] == code, r.text
    assert srv.swarm.registry.get(ep.id).calls == []


def test_worker_token_is_an_evaluation_call(srv: RunningServer) -> None:
    r = _client(srv, srv.token).responses.create(model=srv.swarm.model_name, input=QUESTION, tools=TOOLS)
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert srv.swarm.counters["eval_calls"] == 1


def test_previous_response_is_per_episode(srv: RunningServer) -> None:
    client = SwarmClient(srv.url, srv.token)
    a, b = client.claim("t-a"), client.claim("t-b")
    first = _client(srv, a.api_key).responses.create(model=a.model, input=QUESTION, tools=TOOLS)
    with pytest.raises(openai.NotFoundError) as exc:
        _client(srv, b.api_key).responses.create(model=b.model, input="go on", previous_response_id=first.id)
    assert exc.value.body["code"] == "previous_response_not_found"


@pytest.mark.parametrize(
    "knob, extra",
    [
        ({"top_k": 5}, {}),
        ({"tools": [TOOLS[0], TOOLS[0]]}, {"tools": [{"type": "function", "function": TOOLS[0]}] * 2}),
    ],
)
def test_chat_and_responses_refuse_alike(srv: RunningServer, knob: dict, extra: dict) -> None:
    """One check for both routes: the same code and the same message."""
    ep = SwarmClient(srv.url, srv.token).claim("t-alike")
    h = {"Authorization": f"Bearer {ep.api_key}"}
    chat = {"model": ep.model, "messages": [{"role": "user", "content": "hi"}], **knob, **extra}
    a = httpx.post(f"{srv.url}/v1/chat/completions", json=chat, headers=h, timeout=30)
    b = httpx.post(f"{srv.url}/v1/responses", json={"model": ep.model, "input": "hi", **knob}, headers=h, timeout=30)
    assert a.status_code == b.status_code == 400 and _error(a) == _error(b), (a.text, b.text)


def test_arguments_that_are_not_json_are_served_as_on_chat(srv: RunningServer) -> None:
    """Chat takes `tool_calls` arguments as text (a model may write broken JSON and agents send calls back
    as they came), so this route does too; the output answering the call is matched by its call_id."""
    ep = SwarmClient(srv.url, srv.token).claim("t-args")
    call = {"type": "function_call", "call_id": "call_x", "name": "add", "arguments": "not json"}
    items = [
        {"role": "user", "content": QUESTION},
        call,
        {"type": "function_call_output", "call_id": "call_x", "output": "?"},
    ]
    r = _client(srv, ep.api_key).responses.create(model=ep.model, input=items, tools=TOOLS, max_output_tokens=8)
    assert r.status in ("completed", "incomplete")
