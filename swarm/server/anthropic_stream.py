"""Anthropic's streaming events, built from the generation core's protocol-neutral deltas.

Pure: `MessageStream` takes text deltas, tool-call deltas and the finish, and returns the SSE
frames Anthropic sends, in Anthropic's order, so the official SDK's `messages.stream()` (and
`get_final_message()`) rebuilds the same message the non-streaming route answers:

    message_start                          the message head, empty content, input token count
    ping
    content_block_start  (index k)         a text block, or a tool_use block {id, name, input: {}}
    content_block_delta  (index k)         text_delta {text} | input_json_delta {partial_json}
    content_block_stop   (index k)         a text block closes when the next block opens, or at the end
    message_delta                          {stop_reason, stop_sequence}, usage {output_tokens}
    message_stop

A failure after the headers went out is one `error` event (Anthropic's error body), and the
stream ends there.
"""

from __future__ import annotations

import json
from typing import Any

from swarm.server.anthropic_schema import stop_reason


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class MessageStream:
    """One streamed message: call `start`, then deltas, then `finish` (or `error`)."""

    def __init__(self, rid: str, model: str) -> None:
        self.rid = rid
        self.model = model
        self.index = -1  # the open block's index; -1 before the first
        self.open: str | None = None  # "text" | "tool_use" | None
        self.calls = 0  # tool_use blocks sent

    def start(self, input_tokens: int) -> str:
        head = {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": head}) + sse("ping", {"type": "ping"})

    def _close(self) -> str:
        if self.open is None:
            return ""
        self.open = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _open(self, block: dict[str, Any]) -> str:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        return out + sse(
            "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
        )

    def text(self, delta: str) -> str:
        """Visible text: into the open text block, or a new one."""
        if not delta:
            return ""
        out = "" if self.open == "text" else self._open({"type": "text", "text": ""})
        return out + sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": delta}},
        )

    def tool_use(self, call_id: str, name: str, arguments: str) -> str:
        """A complete tool call (the core emits a call once its text is complete and valid): its
        own tool_use block, the arguments' JSON text as one `input_json_delta`, closed at once."""
        self.calls += 1
        out = self._open({"type": "tool_use", "id": call_id, "name": name, "input": {}})
        if arguments:
            out += sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": self.index,
                    "delta": {"type": "input_json_delta", "partial_json": arguments},
                },
            )
        return out + self._close()

    def finish(self, finish_reason: str | None, stop_sequence: str | None, output_tokens: int) -> str:
        reason = stop_reason("tool_calls" if self.calls and finish_reason == "stop" else finish_reason, stop_sequence)
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None}
        return (
            self._close()
            + sse("message_delta", {"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}})
            + sse("message_stop", {"type": "message_stop"})
        )

    @staticmethod
    def error(payload: dict[str, Any]) -> str:
        return sse("error", payload)
