"""The Responses API's streaming events, built from the generation core's protocol-neutral deltas.

Pure: `ResponseStream` takes text deltas, complete tool calls and the finish, and returns the SSE
frames OpenAI sends, in OpenAI's order, so the `openai` SDK's `responses.stream()` (and the Agents
SDK's `Runner.run_streamed`) rebuild the response the non-streaming route answers:

    response.created, response.in_progress          the head, status in_progress, no output
    response.output_item.added  (a message)         then response.content_part.added (output_text)
    response.output_text.delta  ...                 the visible text as it comes
    response.output_text.done, response.content_part.done, response.output_item.done
    response.output_item.added  (a function_call)   arguments ""
    response.function_call_arguments.delta          the call's arguments (the core emits a call once
    response.function_call_arguments.done           it is complete and valid: one delta)
    response.output_item.done
    response.completed | response.incomplete        the whole response, usage included

Every event carries `type` and a `sequence_number`. A failure after the headers went out is one
`error` event (`code`, `message`, and OpenAI's `error` object) and the stream ends there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from swarm.server.decoding import ToolCall
from swarm.server.responses_schema import call_item, cut_short, message_item, new_id


class ResponseStream:
    """One streamed response: `start`, then `text` / `tool_call`, then `finish` (or `error`).

    `head(status, output, finish_reason, usage)` builds the `response` object for this stream."""

    def __init__(self, head: Callable[..., dict[str, Any]]) -> None:
        self.head = head
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # output items, completed ones in their final shape
        self.text_item: dict[str, Any] | None = None  # the open message item
        self.text = ""

    def _event(self, kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def start(self) -> str:
        head = self.head("in_progress", [])
        return self._event("response.created", response=head) + self._event("response.in_progress", response=head)

    def _where(self) -> dict[str, Any]:
        assert self.text_item is not None
        return {"item_id": self.text_item["id"], "output_index": len(self.items), "content_index": 0}

    def text_delta(self, delta: str) -> str:
        if not delta:
            return ""
        out = ""
        if self.text_item is None:
            self.text_item, self.text = message_item(new_id("msg"), "", "in_progress"), ""
            out += self._event("response.output_item.added", output_index=len(self.items), item=self.text_item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event("response.content_part.added", **self._where(), part=part)
        self.text += delta
        return out + self._event("response.output_text.delta", **self._where(), delta=delta, logprobs=[])

    def _close_text(self, status: str = "completed") -> str:
        if self.text_item is None:
            return ""
        where, text = self._where(), self.text
        done = message_item(self.text_item["id"], text, status)
        out = self._event("response.output_text.done", **where, text=text, logprobs=[])
        out += self._event("response.content_part.done", **where, part=done["content"][0])
        out += self._event("response.output_item.done", output_index=where["output_index"], item=done)
        self.items.append(done)
        self.text_item = None
        return out

    def tool_call(self, call: ToolCall) -> str:
        out = self._close_text()
        item_id, index = new_id("fc"), len(self.items)
        out += self._event(
            "response.output_item.added", output_index=index, item=call_item(item_id, call, "in_progress")
        )
        where = {"item_id": item_id, "output_index": index}
        out += self._event("response.function_call_arguments.delta", **where, delta=call.arguments)
        out += self._event("response.function_call_arguments.done", **where, arguments=call.arguments, name=call.name)
        done = call_item(item_id, call)
        self.items.append(done)
        return out + self._event("response.output_item.done", output_index=index, item=done)

    def finish(self, finish_reason: str, usage: tuple[int, int]) -> str:
        """The last frames; an answer with no text and no calls still gets its (empty) message."""
        out = ""
        if not self.items and self.text_item is None:
            item_id = new_id("msg")
            added = message_item(item_id, "", "in_progress")
            out += self._event("response.output_item.added", output_index=0, item=added)
            self.items.append(message_item(item_id, ""))
            out += self._event("response.output_item.done", output_index=0, item=self.items[0])
        out += self._close_text("incomplete" if cut_short(finish_reason) else "completed")  # the limit cut it
        response = self.head("completed", self.items, finish_reason, usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=response)

    def error(self, code: str | None, message: str) -> str:
        return self._event("error", code=code, message=message, param=None, error={"code": code, "message": message})


__all__ = ["ResponseStream"]
