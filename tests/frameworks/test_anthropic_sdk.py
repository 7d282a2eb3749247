"""The anthropic SDK on `/v1/messages`: tool_use -> tool_result -> answer, streamed on the second turn."""

from __future__ import annotations

from suite import ADD_PARAMS, ANSWER, QUESTION, Roost, add, need

anthropic = need("anthropic")
TOOLS = [{"name": "add", "description": "Add two integers.", "input_schema": ADD_PARAMS}]


def test_tool_episode(roost: Roost) -> None:
    with roost.client().episode("fw-anthropic") as ep:
        client = anthropic.Anthropic(base_url=ep.base_url.removesuffix("/v1"), api_key=ep.api_key, max_retries=0)
        messages = [{"role": "user", "content": QUESTION}]
        first = client.messages.create(model=ep.model, max_tokens=256, tools=TOOLS, messages=messages)
        use = next(b for b in first.content if b.type == "tool_use")
        assert first.stop_reason == "tool_use" and use.name == "add"
        messages += [
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": str(add(**use.input))}],
            },
        ]
        with client.messages.stream(model=ep.model, max_tokens=256, tools=TOOLS, messages=messages) as stream:
            text = "".join(stream.text_stream)
        assert text == ANSWER
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=2)
