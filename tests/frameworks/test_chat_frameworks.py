"""Chat-completions frameworks: litellm and LangGraph (langchain-openai) run a two-turn tool episode.

The scripted engine calls `add` (the only tool declared), then answers; the two calls merge into
one trained sample.
"""

from __future__ import annotations

import json
from typing import Any

from suite import ADD_PARAMS, ANSWER, QUESTION, Roost, add, need

ADD_TOOL = {
    "type": "function",
    "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_PARAMS},
}


def test_litellm(roost: Roost) -> None:
    litellm = need("litellm")
    with roost.client().episode("fw-litellm") as ep:
        kw: dict[str, Any] = {"model": f"openai/{ep.model}", "api_base": ep.base_url, "api_key": ep.api_key}
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        first = litellm.completion(messages=messages, tools=[ADD_TOOL], **kw)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
        result = add(**json.loads(call.function.arguments))
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": str(result)},
        ]
        second = litellm.completion(messages=messages, tools=[ADD_TOOL], **kw)
        assert second.choices[0].message.content == ANSWER
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=2)


def test_langgraph_react_agent(roost: Roost) -> None:
    need("langgraph")
    lc_openai = need("langchain_openai")
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    with roost.client().episode("fw-langgraph") as ep:
        llm = lc_openai.ChatOpenAI(model=ep.model, base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        agent = create_react_agent(llm, [tool(add)])
        state = agent.invoke({"messages": [("user", QUESTION)]})
        kinds = [m.type for m in state["messages"]]
        assert kinds == ["human", "ai", "tool", "ai"] and state["messages"][2].content == "42"
        assert state["messages"][-1].content == ANSWER
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=2)
