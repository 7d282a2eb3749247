"""The Responses body's translation to the core's chat shapes (pure: no server)."""

from __future__ import annotations

import pytest

from swarm.server.exceptions import InvalidRequest
from swarm.server.responses_schema import ResponsesRequest


def _req(**kw: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate(kw)


def test_items_become_chat_messages() -> None:
    req = _req(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "2+3?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Adding."}]},
            {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a":2}'},
            {"type": "function_call", "call_id": "call_2", "name": "add", "arguments": '{"a":3}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "5"},
            {"type": "function_call", "call_id": "call_3", "name": "add", "arguments": "{}"},
        ],
    )
    assert req.system_messages() == [{"role": "system", "content": "Be brief."}]
    msgs = req.input_messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["content"] == "Adding." and [c["id"] for c in msgs[2]["tool_calls"]] == ["call_1", "call_2"]
    assert msgs[3] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    assert msgs[4] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_3", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
    }


def test_tools_choice_and_format() -> None:
    req = _req(
        input="hi",
        tools=[{"type": "function", "name": "f", "strict": True}],
        tool_choice={"type": "function", "name": "f"},
        text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
    )
    assert req.chat_tools() == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    ]
    assert req.chat_tool_choice() == {"type": "function", "function": {"name": "f"}}
    assert req.response_format() == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
    }
    assert _req(input="x", text={"format": {"type": "text"}}).response_format() is None
    assert _req(input="x").sampling().max_tokens is None


@pytest.mark.parametrize(
    "kw, code",
    [
        ({"input": [{"type": "function_call", "name": "f"}]}, "invalid_input"),
        ({"input": [{"role": "tool", "content": "x"}]}, "invalid_input"),
        ({"input": [{"type": "computer_call"}]}, "unsupported_input_item"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "unsupported_content"),
        ({"input": "x", "tools": [{"type": "function"}]}, "invalid_tool"),
        ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "invalid_tool_choice"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "invalid_response_format"),
        ({}, "missing_input"),
    ],
)
def test_bad_bodies_name_their_code(kw: dict, code: str) -> None:
    req = _req(**kw)
    with pytest.raises(InvalidRequest) as exc:
        req.input_messages()
        req.chat_tools()
        req.chat_tool_choice()
        req.response_format()
    assert exc.value.code == code
