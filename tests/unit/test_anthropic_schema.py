"""Anthropic Messages <-> the OpenAI-shaped core: the pure translation both ways, and the SSE writer."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from swarm.server.anthropic_schema import (
    MessagesRequest,
    error_payload,
    message_response,
    stop_reason,
    tool_input,
)
from swarm.server.anthropic_stream import MessageStream
from swarm.server.exceptions import InvalidRequest

TOOLS = [
    {
        "name": "add",
        "description": "Add two ints",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    }
]


def _req(**kw) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "tiny-model", "max_tokens": 16, **kw})


def test_tool_episode_translates_to_openai_messages_in_order() -> None:
    req = _req(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "2+3 and 4+5?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Calling."},
                    {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 2, "b": 3}},
                    {"type": "tool_use", "id": "call_2", "name": "add", "input": {"a": 4, "b": 5}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "5"},
                    {"type": "text", "text": "and then "},
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_2",
                        "content": [{"type": "text", "text": "9"}],
                        "is_error": False,
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": "sum them"},
                ],
            },
        ],
    )
    assert req.openai_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3 and 4+5?"},
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
                {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "tool", "tool_call_id": "call_2", "content": "9"},
        {"role": "user", "content": "and then sum them"},
    ]
    assert req.openai_tools() == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add two ints", "parameters": TOOLS[0]["input_schema"]},
        }
    ]


def test_tool_result_error_and_only_results() -> None:
    calls = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ("x", "y")]
    results = [
        {"type": "tool_result", "tool_use_id": "x", "content": "boom", "is_error": True},
        {"type": "tool_result", "tool_use_id": "y"},
    ]
    req = _req(messages=[{"role": "user", "content": "go"}, {"role": "assistant", "content": calls}])
    req = _req(messages=[*req.messages, {"role": "user", "content": results}])
    assert req.openai_messages()[2:] == [
        {"role": "tool", "tool_call_id": "x", "content": "Error: boom"},
        {"role": "tool", "tool_call_id": "y", "content": ""},
    ]


def test_a_tool_result_answering_no_tool_use_is_refused() -> None:
    """It was rendered as the result of a call the model never made, and trained on."""
    req = _req(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope"}]}])
    with pytest.raises(InvalidRequest) as exc:
        req.openai_messages()
    assert exc.value.code == "unknown_tool_use_id" and "'toolu_nope' answers no tool_use block" in str(exc.value)


def test_two_tools_of_one_name_are_refused() -> None:
    tool = {"name": "a", "input_schema": {"type": "object"}}
    with pytest.raises(InvalidRequest) as exc:
        _req(messages=[{"role": "user", "content": "hi"}], tools=[tool, tool]).openai_tools()
    assert exc.value.code == "duplicate_tool"


@pytest.mark.parametrize(
    "choice, want",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "add"}, {"type": "function", "function": {"name": "add"}}),
    ],
)
def test_tool_choice(choice, want) -> None:
    assert (
        _req(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice=choice).openai_tool_choice() == want
    )


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
    ],
)
def test_image_and_document_are_unsupported(block) -> None:
    with pytest.raises(InvalidRequest) as exc:
        _req(messages=[{"role": "user", "content": [block]}]).openai_messages()
    assert exc.value.code == "unsupported_content" and block["type"] in exc.value.message
    with pytest.raises(InvalidRequest) as exc:  # inside a tool result too
        _req(
            messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [block]}]}]
        ).openai_messages()
    assert exc.value.code == "unsupported_content"


@pytest.mark.parametrize(
    "kw, code",
    [
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "unsupported_prefill",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
                    {"role": "user", "content": "b"},
                ]
            },
            "invalid_messages",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}]},
            "invalid_messages",
        ),
    ],
)
def test_misplaced_blocks_and_prefill_refused(kw, code) -> None:
    with pytest.raises(InvalidRequest) as exc:
        _req(**kw).openai_messages()
    assert exc.value.code == code


def test_tools_refusals() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequest, match="server tools") as exc:
        _req(messages=msgs, tools=[{"type": "bash_20250124", "name": "bash"}]).openai_tools()
    assert exc.value.code == "unsupported_tool"
    with pytest.raises(InvalidRequest) as exc:
        _req(messages=msgs, tools=[{"name": "x"}]).openai_tools()
    assert exc.value.code == "invalid_tool"
    with pytest.raises(InvalidRequest) as exc:
        _req(messages=msgs, tools=TOOLS, tool_choice={"type": "tool", "name": "mul"}).openai_tool_choice()
    assert exc.value.code == "invalid_tool_choice"


@pytest.mark.parametrize(
    "kw",
    [
        {"max_tokens": 0},
        {"messages": []},
        {"temperature": 1.5},
        {"tool_choice": {"type": "tool"}},
        {"messages": [{"role": "system", "content": "x"}]},
        {"top_p": 0},
    ],
)
def test_invalid_bodies_fail_validation(kw) -> None:
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate(
            {"model": "tiny-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **kw}
        )
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})  # model, max_tokens


def test_unknown_fields_are_allowed() -> None:
    req = _req(
        messages=[{"role": "user", "content": "hi"}],
        thinking={"type": "disabled"},
        service_tier="auto",
        metadata={"user_id": "u"},
        stop_sequences=["\n\n", ""],
    )
    assert req.stop_strings() == ("\n\n",)


def test_response_translation() -> None:
    r = message_response(
        rid="msg_1",
        model="tiny-model",
        text="",
        tool_calls=[("call_1", "add", '{"a": 1}')],
        finish_reason="tool_calls",
        stop_sequence=None,
        input_tokens=7,
        output_tokens=3,
    )
    assert r == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "tiny-model",
        "content": [{"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 1}}],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }
    r = message_response(
        rid="msg_2",
        model="tiny-model",
        text="hi",
        tool_calls=[],
        finish_reason="stop",
        stop_sequence="END",
        input_tokens=1,
        output_tokens=2,
    )
    assert r["content"] == [{"type": "text", "text": "hi"}] and r["stop_reason"] == "stop_sequence"
    assert r["stop_sequence"] == "END"
    assert stop_reason("length", None) == "max_tokens" and stop_reason("stop", None) == "end_turn"
    assert tool_input("[1]") == {"_value": [1]} and tool_input("{bad") == {"_raw": "{bad"}
    assert error_payload(401, "no", "missing_api_key") == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "no", "code": "missing_api_key"},
    }


def _events(frames: str) -> list[tuple[str, dict]]:
    out = []
    for frame in frames.strip().split("\n\n"):
        event, data = frame.split("\n")
        out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_stream_writer_orders_blocks() -> None:
    s = MessageStream("msg_1", "m")
    frames = (
        s.start(5)
        + s.text("")
        + s.text("Hi")
        + s.text(" there")
        + s.tool_use("call_1", "add", '{"a": 1}')
        + s.tool_use("call_2", "add", "{}")
        + s.text("after")
        + s.finish("stop", None, 9)
    )
    ev = _events(frames)
    assert [e for e, _ in ev] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert ev[0][1]["message"]["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert [d["index"] for e, d in ev if e == "content_block_start"] == [0, 1, 2, 3]
    assert ev[6][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "add", "input": {}}
    assert ev[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a": 1}'}
    assert ev[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 9},
    }


def test_stream_writer_stop_sequence_and_error() -> None:
    s = MessageStream("msg_1", "m")
    ev = _events(s.start(1) + s.finish("stop", "END", 2))
    assert [e for e, _ in ev] == ["message_start", "ping", "message_delta", "message_stop"]
    assert ev[2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert _events(s.error(error_payload(504, "slow", "generate_timeout"))) == [
        ("error", {"type": "error", "error": {"type": "timeout_error", "message": "slow", "code": "generate_timeout"}})
    ]
