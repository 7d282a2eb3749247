"""pydantic-ai with tools and a structured `output_type` (native JSON output): a tool call, then JSON.

The request carries tools and a json_schema `response_format` together: the server's grammar
admits a tool call or the schema (swarm/chat/tool_grammar.py). The scripted engine calls `add`,
then answers with JSON drawn from the schema under that constraint; pydantic-ai validates it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from suite import QUESTION, Roost, add, need

pydantic_ai = need("pydantic_ai")
need("openai")


class Result(BaseModel):
    value: int
    done: bool


def _agent(ep: Any) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(ep.model, provider=OpenAIProvider(base_url=ep.base_url, api_key=ep.api_key))
    return pydantic_ai.Agent(model, output_type=pydantic_ai.NativeOutput(Result), tools=[add], retries=0)


def test_tool_call_then_json_output(roost: Roost) -> None:
    with roost.client().episode("fw-pydantic-ai") as ep:
        result = _agent(ep).run_sync(QUESTION)
        assert isinstance(result.output, Result)
        parts = [p for m in result.all_messages() for p in m.parts]
        called = [p.tool_name for p in parts if p.part_kind == "tool-call"]
        returned = [p.content for p in parts if p.part_kind == "tool-return"]
        assert called == ["add"] and returned == [42]
        ep.finish(1.0)
    roost.check_merged(ep.id, turns=2)
