"""A scripted stand-in for `episode` in tests: no server, no model, no network.

    episode = ScriptedEpisode(lambda messages: "55")
    assert get_task("arith").workflow({"question": "What is 47+8?", "answer": "55"}, episode) == 1.0

`reply(messages)` decides each completion's text; every request is kept in
`episode.requests` so tests can check what the workflow sent (turns, history).
Responses are real `openai` `ChatCompletion` objects, so a workflow that works
here reads responses exactly as it would from a live server.
"""

from __future__ import annotations

import copy
from typing import Callable

from openai.types.chat import ChatCompletion


class _Completions:
    def __init__(self, owner: "ScriptedEpisode"):
        self._owner = owner

    def create(self, *, model: str, messages: list[dict], **kwargs: object) -> ChatCompletion:
        owner = self._owner
        owner.requests.append({"model": model, "messages": copy.deepcopy(messages), **kwargs})
        text = owner.reply(copy.deepcopy(messages))
        return ChatCompletion.model_validate({
            "id": f"scripted-{len(owner.requests)}", "object": "chat.completion", "created": 0,
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
        })


class ScriptedEpisode:
    """Looks like a client `Episode` to a workflow: `.openai.chat.completions.create`, `.model`."""

    def __init__(self, reply: Callable[[list[dict]], str], model: str = "scripted"):
        self.reply = reply
        self.model = model
        self.requests: list[dict] = []
        self.openai = type("ScriptedOpenAI", (), {})()
        self.openai.chat = type("Chat", (), {})()
        self.openai.chat.completions = _Completions(self)
