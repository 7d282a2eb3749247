"""The Responses body's translation to the core's chat shapes (pure: no server)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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
        ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "5"}]}, "unknown_call_id"),
        (  # an output answers a call made before it, never one after it
            {
                "input": [
                    {"type": "function_call_output", "call_id": "call_1", "output": "5"},
                    {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                ]
            },
            "unknown_call_id",
        ),
        ({"input": "x", "tools": [{"type": "function", "name": "f"}] * 2}, "duplicate_tool"),
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


def test_an_output_may_answer_a_call_of_the_previous_response() -> None:
    prior = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {}}]},
    ]
    req = _req(
        previous_response_id="resp_1", input=[{"type": "function_call_output", "call_id": "call_1", "output": "5"}]
    )
    assert req.input_messages(prior) == [{"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    with pytest.raises(InvalidRequest, match="answers no function_call") as exc:
        req.input_messages()
    assert exc.value.code == "unknown_call_id"


def test_arguments_are_taken_as_text_as_chat_takes_them() -> None:
    """A model may write arguments that are not JSON and an agent sends them back as they came."""
    req = _req(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "not json"}])
    assert req.input_messages()[0]["tool_calls"][0]["function"]["arguments"] == "not json"


@pytest.mark.parametrize(
    "knob", [{"presence_penalty": 1.0}, {"frequency_penalty": 0.5}, {"top_k": 5}, {"logit_bias": {"5": 3}}]
)
def test_sampling_knobs_chat_refuses_are_refused(knob: dict) -> None:
    with pytest.raises(InvalidRequest, match="not applied by this server") as exc:
        _req(input="x", **knob).sampling()
    assert exc.value.code == "unsupported_sampling"
    assert _req(input="x", presence_penalty=0, top_k=-1, logit_bias={}).sampling().max_tokens is None  # neutral


@pytest.mark.parametrize("ask", [{"top_logprobs": 3}, {"include": ["message.output_text.logprobs"]}])
def test_logprobs_are_refused_not_left_out_of_the_answer(ask: dict) -> None:
    with pytest.raises(InvalidRequest, match="/v1/chat/completions returns them") as exc:
        _req(input="x", **ask).sampling()
    assert exc.value.code == "unsupported_parameter"
    assert _req(input="x", top_logprobs=0, include=["reasoning.encrypted_content"]).sampling().max_tokens is None


@pytest.mark.parametrize("flag", [{"stream": "yes"}, {"stream": 1}, {"parallel_tool_calls": "false"}])
def test_flags_are_strict_booleans(flag: dict) -> None:
    with pytest.raises(ValidationError):
        _req(input="x", **flag)
