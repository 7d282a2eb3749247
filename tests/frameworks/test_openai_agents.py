"""The OpenAI Agents SDK (0.24): its default model (the Responses API) and its chat-completions model.

A three-turn tool agent (add, then mul, then the answer; scripted engine, see scripted_server.py)
runs to its final output, streamed and not, and its three calls merge into one trained sample.
"""

from __future__ import annotations

import asyncio
from typing import Any

from suite import ANSWER, QUESTION, Roost, add, mul, need

agents = need("agents")
openai = need("openai")
agents.set_tracing_disabled(True)  # no traces to OpenAI's servers: loopback only


def _agent(ep: Any, chat: bool = False) -> Any:
    client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0, timeout=60)
    if chat:
        model = agents.OpenAIChatCompletionsModel(model=ep.model, openai_client=client)
    else:
        model = agents.OpenAIResponsesModel(model=ep.model, openai_client=client)  # the SDK's default kind
    tools = [agents.function_tool(add), agents.function_tool(mul)]
    return agents.Agent(name="calculator", instructions="Use the tools, then answer.", tools=tools, model=model)


def _tool_calls(result: Any) -> list[str]:
    return [i.raw_item.name for i in result.new_items if i.type == "tool_call_item"]


def test_default_responses_model_three_turns(roost: Roost) -> None:
    with roost.client().episode("fw-agents") as ep:
        result = asyncio.run(agents.Runner.run(_agent(ep), QUESTION))
        assert result.final_output == ANSWER
        assert _tool_calls(result) == ["add", "mul"]
        outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
        assert [str(o) for o in outputs] == ["42", "84"]
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=3)


def test_default_responses_model_streamed(roost: Roost) -> None:
    async def run(ep: Any) -> tuple[Any, list[str]]:
        result = agents.Runner.run_streamed(_agent(ep), QUESTION)
        kinds = []
        async for event in result.stream_events():
            if event.type == "raw_response_event":
                kinds.append(event.data.type)
        return result, kinds

    with roost.client().episode("fw-agents-stream") as ep:
        result, kinds = asyncio.run(run(ep))
        assert result.final_output == ANSWER and _tool_calls(result) == ["add", "mul"]
        assert kinds.count("response.completed") == 3 and "response.output_text.delta" in kinds
        assert "response.function_call_arguments.delta" in kinds
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=3)


def test_chat_completions_model(roost: Roost) -> None:
    with roost.client().episode("fw-agents-chat") as ep:
        result = asyncio.run(agents.Runner.run(_agent(ep, chat=True), QUESTION))
        assert result.final_output == ANSWER and _tool_calls(result) == ["add", "mul"]
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=3)
