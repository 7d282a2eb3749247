"""A scripted stand-in for `episode` in tests: no server, no model, no network.

    episode = ScriptedEpisode(lambda messages: "55")
    assert get_task("arith").workflow({"question": "What is 47+8?", "answer": "55"}, episode) == 1.0

`reply(messages)` decides each completion's text, or returns a message dict
(`{"content": None, "tool_calls": [...]}`, OpenAI's shape) to answer with tool calls
(finish_reason "tool_calls"); every request is kept in
`episode.requests` so tests can check what the workflow sent (turns, history).
Responses are real `openai` `ChatCompletion` objects, so a workflow that works
here reads responses exactly as it would from a live server.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from openai.types.chat import ChatCompletion


class _Completions:
    def __init__(self, owner: ScriptedEpisode):
        self._owner = owner

    def create(self, *, model: str, messages: list[dict], **kwargs: object) -> ChatCompletion:
        owner = self._owner
        owner.requests.append({"model": model, "messages": copy.deepcopy(messages), **kwargs})
        reply = owner.reply(copy.deepcopy(messages))
        message = {"role": "assistant", **reply} if isinstance(reply, dict) else {"role": "assistant", "content": reply}
        return ChatCompletion.model_validate(
            {
                "id": f"scripted-{len(owner.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                        "message": message,
                    }
                ],
            }
        )


class ScriptedEpisode:
    """Looks like a client `Episode` to a workflow: `.openai.chat.completions.create`, `.model`."""

    def __init__(self, reply: Callable[[list[dict]], str | dict], model: str = "scripted"):
        self.reply = reply
        self.model = model
        self.requests: list[dict] = []
        self.openai = type("ScriptedOpenAI", (), {})()
        self.openai.chat = type("Chat", (), {})()
        self.openai.chat.completions = _Completions(self)
