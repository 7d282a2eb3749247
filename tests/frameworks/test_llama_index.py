"""llama-index (its own venv: it pins an older openai): a FunctionAgent's two-turn tool episode."""

from __future__ import annotations

import asyncio

from suite import ANSWER, QUESTION, Roost, add, need

need("llama_index.core")
need("llama_index.llms.openai_like")


def test_function_agent(roost: Roost) -> None:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    with roost.client().episode("fw-llama-index") as ep:
        # OpenAILike: a model name OpenAI does not know, its function calling said outright
        llm = OpenAILike(
            model=ep.model,
            api_base=ep.base_url,
            api_key=ep.api_key,
            is_chat_model=True,
            is_function_calling_model=True,
            context_window=4096,
            max_retries=0,
            timeout=60,
        )
        agent = FunctionAgent(tools=[FunctionTool.from_defaults(add)], llm=llm, system_prompt="Use the tools.")

        async def run() -> object:
            return await agent.run(QUESTION)  # the workflow starts inside a running loop

        result = asyncio.run(run())
        assert str(result.response.content) == ANSWER
        assert [t.tool_name for t in result.tool_calls] == ["add"]
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=2)
