"""Chat messages as the template gets them (`ChatCompletionRequest.message_dicts`): roles checked, content flattened."""

from __future__ import annotations

import pytest

from swarm.server.exceptions import InvalidRequest
from swarm.server.openai_schema import ChatCompletionRequest


def _dicts(*messages: dict) -> list[dict]:
    return ChatCompletionRequest.model_validate({"messages": list(messages)}).message_dicts()


def test_developer_is_read_as_system_as_on_responses() -> None:
    """The template knows no `developer` turn: it rendered one as a role of its own."""
    assert _dicts({"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


def test_an_assistant_turn_of_tool_calls_alone_needs_no_content() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    got = _dicts({"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]})
    assert got[1] == {"role": "assistant", "content": "", "tool_calls": [call]}


@pytest.mark.parametrize(
    "message, says",
    [
        ({"role": "wizard", "content": "hi"}, "messages[1].role: 'wizard' is not a chat role"),
        ({"role": "function", "content": "5", "name": "f"}, "messages[1].role: 'function' is not a chat role"),
        ({"role": "user", "content": None}, "messages[1].content: a user message needs content"),
        ({"role": "tool", "tool_call_id": "c1"}, "messages[1].content: a tool message needs content"),
    ],
)
def test_a_role_no_template_knows_or_a_turn_without_content_is_refused(message: dict, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says.replace("[", r"\[").replace("]", r"\]")) as exc:
        _dicts({"role": "user", "content": "x"}, message)
    assert exc.value.code == "invalid_message"
