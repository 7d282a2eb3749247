"""OpenAI Responses bodies, and the pure translation to and from the server's OpenAI-shaped core.

`POST /v1/responses` (`responses_routes.py`) validates a `ResponsesRequest` and turns it into the
chat messages, function tools, tool choice and response format the generation core renders, so a
Responses agent (the OpenAI Agents SDK's default model, Codex-style agents) is recorded, continued
and merged exactly as a chat agent is. No I/O here: data in, data out.

Input items to chat messages:

    instructions                            -> {"role": "system"} first (never carried over by
                                               `previous_response_id`, as OpenAI's)
    input: "text"                           -> one user message
    {"type": "message", role, content}      -> that message; `developer` reads as `system`; content
                                               parts input_text / output_text / text joined
    {"type": "function_call", call_id, ...} -> a `tool_calls` entry of the assistant turn it follows
                                               (an output's message and its calls are one turn)
    {"type": "function_call_output", ...}   -> {"role": "tool", "tool_call_id": call_id}; its call_id
                                               must be a function_call's before it (in the input
                                               or the previous response): 400 `unknown_call_id`
    {"type": "reasoning", ...}              -> accepted and ignored (the model has no reasoning items)
    images, files, item_reference, hosted tool calls -> 400 `unsupported_input_item` / `unsupported_content`

A function_call's `arguments` are taken as the text they are, JSON or not, as chat takes its
`tool_calls` (a model may write invalid JSON, and an agent sends its calls back as they came).

Tools: `{"type": "function", name, description, parameters, strict}` only (hosted tools such as
`web_search` are 400 `unsupported_tool`), names unique (400 `duplicate_tool`, chat's check);
`strict` is accepted and ignored. `text.format` is `text`, `json_object` or `json_schema`
(`{name, schema, strict}`), mapped to OpenAI's `response_format`. Unknown top-level fields
(`store`, `include`, `reasoning`, `truncation`, `prompt_cache_key`, ...) are accepted and
ignored, except the sampling knobs chat refuses (`presence_penalty`, `frequency_penalty`, `top_k`,
`logit_bias`, ...: 400 `unsupported_sampling` unless neutral, chat's own check): OpenAI's Responses
API has none of them, but a client that sends one means it, and this server does not apply it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from swarm.protocol import Bool, Count, Number
from swarm.server.decoding import Choice, ToolCall
from swarm.server.exceptions import InvalidRequest
from swarm.server.generation import Sampling
from swarm.server.openai_schema import check_not_applied, check_tools

TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class ResponsesRequest(_Body):
    model: str | None = Field(None, max_length=256)
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: Count | None = Field(None, ge=1)
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, gt=0, le=1)
    seed: Count | None = Field(None, ge=-(1 << 63), lt=1 << 64)  # a Roost extension, as on chat
    stream: Bool | None = False
    previous_response_id: str | None = Field(None, max_length=256)
    parallel_tool_calls: Bool | None = None
    metadata: dict[str, Any] | None = None

    # -- to the core ------------------------------------------------------------
    def input_messages(self, prior: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """This request's input items as chat messages (instructions not included); `prior` is the
        conversation of the previous response, whose calls a function_call_output may answer."""
        if self.input is None:
            if self.previous_response_id is None:
                raise InvalidRequest("missing_input", "input is required (or a previous_response_id to continue)")
            return []
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        calls = call_ids(prior)
        for i, item in enumerate(self.input):
            _add_item(out, item, i, calls)
        return out

    def system_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.instructions}] if self.instructions else []

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """Function tools in the chat shape the core renders (`render.canonical_tools` orders them)."""
        if not self.tools:
            return None
        out = []
        for i, t in enumerate(self.tools):
            if t.get("type") != "function":
                raise InvalidRequest(
                    "unsupported_tool",
                    f"tools[{i}]: tools of type {t.get('type')!r} are not supported; declare a function tool",
                )
            name = t.get("name")
            if not isinstance(name, str) or not name or len(name) > 128:
                raise InvalidRequest("invalid_tool", f"tools[{i}]: a function tool needs a name (1-128 characters)")
            params = t.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise InvalidRequest("invalid_tool", f"tools[{i}] ({name}): parameters must be a JSON schema object")
            fn: dict[str, Any] = {"name": name}
            if isinstance(t.get("description"), str) and t["description"]:
                fn["description"] = t["description"]
            fn["parameters"] = params if params is not None else {"type": "object", "properties": {}}
            out.append({"type": "function", "function": fn})
        check_tools(out)
        return out

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        """none / auto / required as they are; `{"type": "function", "name"}` as chat's named choice."""
        c = self.tool_choice
        if c is None or isinstance(c, str):
            return c
        if c.get("type") == "function" and isinstance(c.get("name"), str):
            return {"type": "function", "function": {"name": c["name"]}}
        raise InvalidRequest(
            "invalid_tool_choice", 'tool_choice must be none, auto, required or {"type": "function", "name": ...}'
        )

    def response_format(self) -> dict[str, Any] | None:
        """`text.format` as chat's `response_format` (None: plain text)."""
        fmt = (self.text or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict):
            raise InvalidRequest("invalid_response_format", "text.format must be an object")
        kind = fmt.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "json_object"}
        if kind == "json_schema":
            schema = fmt.get("schema")
            if not isinstance(schema, dict):
                raise InvalidRequest("invalid_response_format", "text.format json_schema needs a schema object")
            spec: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
            if fmt.get("strict") is not None:
                spec["strict"] = bool(fmt["strict"])
            return {"type": "json_schema", "json_schema": spec}
        raise InvalidRequest("invalid_response_format", "text.format.type must be text, json_object or json_schema")

    def sampling(self) -> Sampling:
        check_not_applied(self.model_extra)
        self._check_no_logprobs()
        return Sampling(
            max_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            response_format=self.response_format(),
        )

    def _check_no_logprobs(self) -> None:
        """400 for logprobs asked of this route (OpenAI's `top_logprobs`, or `include` naming
        `message.output_text.logprobs`): it does not return them, and an answer without them would
        read as if none were asked. Chat completions returns them."""
        extra = self.model_extra or {}
        include = extra.get("include") if isinstance(extra.get("include"), list) else []
        if extra.get("top_logprobs") or "message.output_text.logprobs" in include:
            raise InvalidRequest(
                "unsupported_parameter",
                "logprobs (top_logprobs, include message.output_text.logprobs) are not returned by /v1/responses "
                "here; /v1/chat/completions returns them (logprobs: true, top_logprobs: N)",
            )


def _text_of(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InvalidRequest("invalid_input", f"{where}: content must be text or a list of parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise InvalidRequest(
                "unsupported_content", f"{where}: {kind!r} parts are not supported (the model reads text only)"
            )
    return "".join(texts)


def call_ids(messages: Iterable[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls the assistant turns of `messages` made."""
    return {
        c["id"]
        for m in messages
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
        if isinstance(c, dict) and isinstance(c.get("id"), str)
    }


def _add_item(out: list[dict[str, Any]], item: Any, i: int, calls: set[str]) -> None:
    """Append input item `i` to `out`; `calls` holds the call ids made so far (a function_call adds its own)."""
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise InvalidRequest("invalid_input", f"{where}: an input item must be an object")
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise InvalidRequest("invalid_input", f"{where}: role must be user, assistant, system or developer")
        out.append({"role": role, "content": _text_of(item.get("content"), where)})
    elif kind == "function_call":
        call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
        if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name and isinstance(args, str)):
            raise InvalidRequest("invalid_input", f"{where}: a function_call needs call_id, name and arguments (text)")
        calls.add(call_id)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        if out and out[-1]["role"] == "assistant":  # the calls of one output join its message
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest("invalid_input", f"{where}: a function_call_output needs its call_id")
        if call_id not in calls:  # the template would render a tool result answering no call
            raise InvalidRequest(
                "unknown_call_id",
                f"{where}: function_call_output call_id {call_id!r} answers no function_call before it "
                "(in the input or the previous response)",
            )
        out.append({"role": "tool", "tool_call_id": call_id, "content": _text_of(item.get("output"), where)})
    elif kind == "reasoning":
        return  # accepted and ignored: the model has no reasoning items to continue
    else:
        raise InvalidRequest(
            "unsupported_input_item",
            f"{where}: input items of type {kind!r} are not supported "
            "(message, function_call, function_call_output and reasoning are)",
        )


# -- from the core ----------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """`status` "in_progress" (a stream's opening item, no content yet), "completed", or "incomplete"
    (the text a token limit cut)."""
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "in_progress" else []
    )
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def cut_short(finish_reason: str | None) -> bool:
    """Whether generation ended before the model did (the response is "incomplete")."""
    return finish_reason in ("length", "abort")


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
    }


def output_items(choice: Choice) -> list[dict[str, Any]]:
    """A finished choice's output in the order a stream sends it: text and calls as the model wrote
    them, each stretch of text a message (an empty one when there is nothing at all). A message the
    token limit cut is "incomplete", as the response is."""
    text, items, at = choice.text, [], 0
    offsets = choice.call_offsets or [len(text)] * len(choice.tool_calls)
    for call, offset in zip(choice.tool_calls, offsets):
        if text[at:offset]:
            items.append(message_item(new_id("msg"), text[at:offset]))
        items.append(call_item(new_id("fc"), call))
        at = offset
    if text[at:] or not items:
        items.append(message_item(new_id("msg"), text[at:]))
    if cut_short(choice.finish_reason) and items[-1]["type"] == "message":
        items[-1]["status"] = "incomplete"
    return items


def assistant_message(choice: Choice) -> dict[str, Any]:
    """The choice as the chat-shaped assistant turn a later `previous_response_id` continues."""
    out: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in choice.tool_calls
        ]
    return out


def response_object(
    body: ResponsesRequest,
    *,
    rid: str,
    model: str,
    created: float,
    status: str,
    output: list[dict[str, Any]],
    finish_reason: str | None = None,
    usage: tuple[int, int] | None = None,
    policy_version: int | None = None,
) -> dict[str, Any]:
    """OpenAI's `response` object; `status` "in_progress" for the stream's first events."""
    incomplete = status == "completed" and cut_short(finish_reason)
    fmt = (body.text or {}).get("format") or {"type": "text"}
    out: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [],
        "text": {"format": fmt},
        "previous_response_id": body.previous_response_id,
        "max_output_tokens": body.max_output_tokens,
        "truncation": "disabled",
        "store": False,
        "usage": None,
    }
    if usage is not None:
        inp, outp = usage
        out["usage"] = {
            "input_tokens": inp,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": outp,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": inp + outp,
        }
    if policy_version is not None:
        out["policy_version"] = policy_version  # a Roost extension: the policy that generated it
    return out


def now() -> float:
    return float(int(time.time()))


__all__ = [
    "ResponsesRequest",
    "assistant_message",
    "call_item",
    "message_item",
    "new_id",
    "now",
    "output_items",
    "response_object",
]
