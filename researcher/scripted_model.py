"""A chat model that replies from a script, for the planner's unit tests (never the only test of an LLM
path: the live planner's test runs a real vLLM server).

It also answers tool calls, so `with_structured_output` (researcher.llm.structured) runs the same path
against it as against a tool-calling server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

Reply = str | Callable[[list[BaseMessage]], str]


class ScriptedChatModel(BaseChatModel):
    """Replies from a script: a list (one entry per call; strings or functions of the
    messages) or one function for every call. Records the messages of each call.

    Bound to tools (what `with_structured_output` does), a reply that is a JSON object
    comes back as a call of the first tool, anything else as an invalid tool call,
    the way a tool-calling server answers.
    """

    script: Any  # list[Reply] | Callable[[list[BaseMessage]], str]
    calls: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "roost-scripted"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        tools: list[dict] | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        i = len(self.calls)
        self.calls.append(list(messages))
        if callable(self.script):
            reply: Reply = self.script
        elif i < len(self.script):
            reply = self.script[i]
        else:
            raise IndexError(f"scripted model has {len(self.script)} replies; call {i + 1} asked for more")
        text = reply(list(messages)) if callable(reply) else reply
        n_in = sum(len(str(m.content)) for m in messages) // 4
        meta = {"input_tokens": n_in, "output_tokens": len(text) // 4 + 1, "total_tokens": n_in + len(text) // 4 + 1}
        msg = AIMessage(content=text, usage_metadata=meta)  # type: ignore[arg-type]
        if tools:
            name, call_id = tools[0]["function"]["name"], f"call_{i}"
            try:
                args = json.loads(text)
                if not isinstance(args, dict):
                    raise ValueError(f"expected a JSON object, got {type(args).__name__}")
                msg = AIMessage(
                    content="",
                    usage_metadata=meta,  # type: ignore[arg-type]
                    tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}],
                )
            except ValueError as e:  # json.JSONDecodeError included
                msg = AIMessage(
                    content="",
                    usage_metadata=meta,  # type: ignore[arg-type]
                    invalid_tool_calls=[
                        {"name": name, "args": text, "id": call_id, "error": str(e), "type": "invalid_tool_call"}
                    ],
                )
        return ChatResult(generations=[ChatGeneration(message=msg)])
