"""Anthropic Messages bodies, and the pure translation to and from the server's OpenAI-shaped core.

`POST /v1/messages` (`anthropic_routes.py`) validates a `MessagesRequest`, turns it into the
OpenAI-shaped messages, tools and tool choice the generation core renders (one renderer, one
recorder, one continuity rule for both protocols, so an Anthropic agent's turns merge into
training samples exactly as a chat agent's do), and turns the core's result back into an
Anthropic `message`. No I/O here: data in, data out.

Messages to OpenAI dicts:

    system (string or text blocks)        -> {"role": "system"} first
    assistant text + tool_use blocks      -> {"role": "assistant", "content", "tool_calls"} (same ids;
                                              `input` as JSON text in `arguments`)
    user tool_result blocks               -> one {"role": "tool", "tool_call_id"} each, in order, then
                                              the turn's text blocks as one user message
    image, document or any other block    -> 400 `unsupported_content` (the model reads text only)

A `tool_result` with `is_error: true` is rendered as `Error: <content>`: the chat template has no
field for the flag, and the model must see that the tool failed. Text blocks of one turn are
joined without a separator, as the OpenAI route joins text parts. Unknown top-level fields
(`thinking`, `service_tier`, `cache_control` on blocks, ...) are accepted and ignored.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from swarm.protocol import Count, Number
from swarm.server.exceptions import InvalidRequest
from swarm.server.openai_schema import check_tools, unanswered_tool_result

MAX_STOP = 16

#: Anthropic's `error.type` for each status the server answers with (its SDK picks the
#: exception class from the status; the type is for people and logs).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_payload(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """Anthropic's error body; `code` is Roost's stable machine-readable name (an extra field)."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message, "code": code}}


# -- request ------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class TextBlock(_Body):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    input: dict[str, Any]


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = False

    def text(self) -> str:
        content = self.content
        if isinstance(content, list):
            content = _block_texts(content, "tool_result content")
        text = content or ""
        return f"Error: {text}" if self.is_error else text


class OtherBlock(_Body):
    """Any block type we do not read (image, document, thinking, server tools...): refused on use,
    not at validation, so the client hears `unsupported_content` with the type's name."""

    type: str


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("text", "tool_use", "tool_result") else "other"


Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_kind),
]


class Message(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Body):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; server tools ("bash_2025...") are refused


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, min_length=1, max_length=128)
    disable_parallel_tool_use: bool | None = None  # true: at most one tool_use (ChatTurn.parallel_tool_calls)

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError('tool_choice of type "tool" needs a name')
        return self


class MessagesRequest(_Body):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: Count = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    temperature: Number | None = Field(None, ge=0, le=1)
    top_p: Number | None = Field(None, gt=0, le=1)
    top_k: Count | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    metadata: dict[str, Any] | None = None

    # -- to the core ----------------------------------------------------------
    def openai_messages(self) -> list[dict[str, Any]]:
        """The conversation as OpenAI-shaped message dicts (see the module docstring)."""
        out: list[dict[str, Any]] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system)
            out.append({"role": "system", "content": system})
        for i, m in enumerate(self.messages):
            out += _user_turn(m, i) if m.role == "user" else [_assistant_turn(m, i)]
        if self.messages[-1].role == "assistant":
            raise InvalidRequest(
                "unsupported_prefill",
                "the last message must be the user's: continuing a prefilled assistant turn is not supported",
            )
        unanswered = unanswered_tool_result(out)
        if unanswered is not None:
            raise InvalidRequest(
                "unknown_tool_use_id",
                f"a tool_result's tool_use_id {unanswered[1]!r} answers no tool_use block of an assistant "
                "turn before it",
            )
        return out

    def openai_tools(self) -> list[dict[str, Any]] | None:
        """Tools as OpenAI function tools (the chat template lists them in the system block)."""
        if not self.tools:
            return None
        out = []
        for i, t in enumerate(self.tools):
            if t.type not in (None, "custom"):
                raise InvalidRequest(
                    "unsupported_tool",
                    f"tools[{i}]: server tools (type {t.type!r}) are not "
                    "supported; declare a custom tool with an input_schema",
                )
            if t.input_schema is None:
                raise InvalidRequest("invalid_tool", f"tools[{i}] ({t.name}): input_schema is required")
            fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
            if t.description:
                fn["description"] = t.description
            out.append({"type": "function", "function": fn})
        check_tools(out)  # chat's check: unique names
        return out

    def openai_tool_choice(self) -> str | dict[str, Any] | None:
        """auto -> "auto", any -> "required", tool(name) -> the named function, none -> "none"."""
        c = self.tool_choice
        if c is None:
            return None
        if c.type == "tool":
            if not any(t.name == c.name for t in self.tools or []):
                raise InvalidRequest("invalid_tool_choice", f"tool_choice names {c.name!r}, which is not in tools")
            return {"type": "function", "function": {"name": c.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[c.type]

    def stop_strings(self) -> tuple[str, ...]:
        stops = list(self.stop_sequences or [])
        if len(stops) > MAX_STOP:
            raise InvalidRequest("invalid_stop", f"at most {MAX_STOP} stop_sequences")
        return tuple(s for s in stops if s)


class CountTokensRequest(MessagesRequest):
    """`POST /v1/messages/count_tokens`: the turn a `messages` call would send, without its sampling
    (Anthropic's body has no `max_tokens`; Claude Code asks it to decide when to compact)."""

    max_tokens: Count | None = Field(None, ge=1)  # type: ignore[assignment]


def _unsupported(kind: str, where: str) -> InvalidRequest:
    return InvalidRequest(
        "unsupported_content",
        f"{where}: {kind!r} blocks are not supported (the model reads text, tool_use and tool_result blocks)",
    )


def _block_texts(blocks: list[dict[str, Any]], where: str) -> str:
    texts = []
    for b in blocks:
        if b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _unsupported(str(b.get("type")), where)
        texts.append(b["text"])
    return "".join(texts)


def _user_turn(m: Message, i: int) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            tools.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
        elif isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolUseBlock):
            raise InvalidRequest("invalid_messages", f"messages[{i}]: tool_use blocks belong to assistant turns")
        else:
            raise _unsupported(b.type, f"messages[{i}]")
    if texts or not tools:
        tools.append({"role": "user", "content": "".join(texts)})
    return tools


def _assistant_turn(m: Message, i: int) -> dict[str, Any]:
    if isinstance(m.content, str):
        return {"role": "assistant", "content": m.content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for b in m.content:
        if isinstance(b, TextBlock):
            texts.append(b.text)
        elif isinstance(b, ToolUseBlock):
            calls.append(
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
                }
            )
        elif isinstance(b, ToolResultBlock):
            raise InvalidRequest("invalid_messages", f"messages[{i}]: tool_result blocks belong to user turns")
        else:
            raise _unsupported(b.type, f"messages[{i}]")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        out["tool_calls"] = calls
    return out


# -- from the core --------------------------------------------------------------
def message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def tool_input(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """A tool call's arguments as Anthropic's `input` object. The core hands out calls whose
    arguments parsed as a JSON object; anything else is wrapped, never dropped."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    """OpenAI's finish reason in Anthropic's words. `abort` (the weights changed under a long
    generation and it was cut) reads as `max_tokens`: the answer is incomplete, as at the limit."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason in ("length", "abort"):
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def content_blocks(text: str, tool_calls: list[tuple[str, str, str | dict[str, Any]]]) -> list[dict[str, Any]]:
    """A text block if there is text, then one `tool_use` block per (id, name, arguments)."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks += [
        {"type": "tool_use", "id": cid, "name": name, "input": tool_input(args)} for cid, name, args in tool_calls
    ]
    return blocks


def message_response(
    *,
    rid: str,
    model: str,
    text: str,
    tool_calls: list[tuple[str, str, str | dict[str, Any]]],
    finish_reason: str | None,
    stop_sequence: str | None,
    input_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    """A finished generation as Anthropic's `message` object."""
    reason = stop_reason("tool_calls" if tool_calls and finish_reason == "stop" else finish_reason, stop_sequence)
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(text, tool_calls),
        "stop_reason": reason,
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
