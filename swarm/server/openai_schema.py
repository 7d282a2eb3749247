"""Request bodies of the OpenAI-compatible routes, and the knobs they map to.

Unknown fields are accepted and ignored (OpenAI clients send many), except sampling knobs this
server does not apply (`NOT_APPLIED`: penalties, logit_bias, top_k, min_p), which are refused unless
neutral (`check_not_applied`, shared with `/v1/responses`); the knobs we honour are validated (strict
types: "8" is not 8, "yes" is not true; ranges; NaN) so a bad value is a 400, never an engine crash.
Tools must be well-formed functions of unique names (`check_tools`, shared with `/v1/responses`). Roost
extensions: `return_token_ids` (vLLM's name) asks for `prompt_token_ids` and `token_ids` in the
response. `to_sampling()` turns a body into the protocol-neutral `generation.Sampling`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from swarm.protocol import Bool, Count, Number
from swarm.server.exceptions import InvalidRequest, NotFound
from swarm.server.generation import Sampling

MAX_STOP = 16
SEED_MOD = 1 << 63
#: sampling knobs OpenAI and vLLM clients may send that this server does not apply, each with the values that
#: change nothing: a penalty or a truncation would sample tokens away from the policy's own distribution,
#: which its recorded logprobs and the trainer's importance ratios assume, so any other value is refused
NOT_APPLIED: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "top_k": (0, -1),
    "min_p": (0, 0.0),
}


def check_not_applied(extra: Mapping[str, Any] | None) -> None:
    """400 `unsupported_sampling` for a knob of `NOT_APPLIED` in `extra` (a body's unknown fields) set to
    anything but its neutral value: served without it, the caller would believe its penalty applied and
    nothing would say it did not. One check for every OpenAI-shaped route (chat, completions, responses)."""
    extra = extra or {}
    wrong = [
        f"{k}={extra[k]!r}"
        for k, neutral in NOT_APPLIED.items()
        if extra.get(k) is not None and not any(extra[k] == v and type(extra[k]) is type(v) for v in neutral)
    ]
    if wrong:
        raise InvalidRequest(
            "unsupported_sampling",
            f"{', '.join(wrong)}: not applied by this server, which samples from the policy's own distribution "
            "(the one it trains on); leave it out or at its neutral value",
        )


def check_tools(tools: Sequence[Any] | None) -> None:
    """400 for tools the model could not be shown as sent (chat's shape, `{"type": "function",
    "function": {"name", "parameters"}}`): `unsupported_tool` for another type, `invalid_tool` for a
    function without a name or with a schema that is no object, `duplicate_tool` for two functions of
    one name (the model calls a tool by its name, so the second one could never be the one a call
    meant). The template used to leave a malformed tool out without a word: the agent believed the
    model saw it."""
    first: dict[str, int] = {}
    for i, tool in enumerate(tools or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidRequest(
                "unsupported_tool",
                f"tools[{i}]: tools of type {kind!r} are not supported; declare "
                '{"type": "function", "function": {"name": ..., "parameters": {...}}}',
            )
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name or len(name) > 128:
            raise InvalidRequest("invalid_tool", f"tools[{i}]: a function tool needs a name (1-128 characters)")
        params = fn.get("parameters")  # type: ignore[union-attr]
        if params is not None and not isinstance(params, dict):
            raise InvalidRequest("invalid_tool", f"tools[{i}] ({name}): parameters must be a JSON schema object")
        if name in first:
            raise InvalidRequest(
                "duplicate_tool",
                f"tools[{i}]: a function named {name!r} is declared already (tools[{first[name]}]); "
                "tool names must be unique",
            )
        first[name] = i


def check_model(model: str | None, served: frozenset[str]) -> None:
    """404 `model_not_found` for a `model` this server does not serve (absent: the served one)."""
    if model is not None and model not in served:
        raise NotFound(
            "model_not_found",
            f"the model {model!r} does not exist here; this server serves {', '.join(sorted(served))}",
        )


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class ChatMessage(_Body):
    role: str = Field(min_length=1, max_length=64)
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _Sampling(_Body):
    model: str | None = None
    max_tokens: Count | None = Field(None, ge=1)
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, gt=0, le=1)
    n: Count | None = Field(None, ge=1, le=128)
    seed: Count | None = Field(None, ge=-(1 << 63), lt=1 << 64)
    stop: str | list[str] | None = None
    stream: Bool | None = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: Bool | None = False

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise InvalidRequest("invalid_stop", f"at most {MAX_STOP} stop strings")
        return tuple(s for s in stops if s)

    def check_model(self, served: frozenset[str]) -> None:
        check_model(self.model, served)

    def sampling(
        self, max_tokens: int | None, top_logprobs: int = 0, response_format: dict[str, Any] | None = None
    ) -> Sampling:
        check_not_applied(self.model_extra)
        return Sampling(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop_strings(),
            top_logprobs=top_logprobs,
            response_format=response_format,
        )

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def engine_seed(self) -> int | None:
        return None if self.seed is None else self.seed % SEED_MOD


RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = Field(None, ge=1)
    logprobs: Bool | None = False
    top_logprobs: Count | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: Bool | None = None
    response_format: dict[str, Any] | None = None

    def to_sampling(self) -> Sampling:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("invalid_top_logprobs", "top_logprobs needs logprobs: true")
        fmt = self.response_format
        if fmt is not None and fmt.get("type") not in RESPONSE_FORMATS:
            raise InvalidRequest(
                "invalid_response_format", f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}"
            )
        if fmt is not None and fmt.get("type") == "json_schema" and not isinstance(fmt.get("json_schema"), dict):
            raise InvalidRequest("invalid_response_format", "response_format json_schema needs a json_schema object")
        return self.sampling(self.wants_max_tokens(), self.top_logprobs or 0, fmt)

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the core takes them, checked (`check_tools`)."""
        check_tools(self.tools)
        return self.tools

    def wants_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def message_dicts(self) -> list[dict[str, Any]]:
        """Messages as the chat template wants them: content flattened to text, `developer` read as
        `system` (as on /v1/responses). A role the templates do not know, or a turn without content
        that must have some, is 400 `invalid_message`: a template renders any role string, so a typo
        was trained on as a turn of its own."""
        out = []
        for i, m in enumerate(self.messages):
            _check_message(i, m)
            d = m.model_dump(exclude_none=True)
            d["role"] = CHAT_ROLES[m.role]
            content = m.content
            if isinstance(content, list):
                texts = []
                for part in content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise InvalidRequest("unsupported_content", "only text content parts are supported")
                    texts.append(part["text"])
                content = "".join(texts)
            d["content"] = content or ""
            out.append(d)
        unanswered = unanswered_tool_result(out)
        if unanswered is not None:
            i, call_id = unanswered
            raise InvalidRequest(
                "unknown_call_id",
                f"messages[{i}].tool_call_id: {call_id!r} answers no tool call of an assistant message before it",
            )
        return out


#: the roles a chat message may have, and the role the template sees
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _check_message(i: int, m: ChatMessage) -> None:
    if m.role not in CHAT_ROLES:
        raise InvalidRequest(
            "invalid_message", f"messages[{i}].role: {m.role!r} is not a chat role ({', '.join(CHAT_ROLES)})"
        )
    if m.content is None and m.role != "assistant":  # an assistant turn may be tool calls alone
        raise InvalidRequest("invalid_message", f"messages[{i}].content: a {m.role} message needs content")


def unanswered_tool_result(messages: Sequence[Mapping[str, Any]]) -> tuple[int, Any] | None:
    """(index, id) of the first tool message whose `tool_call_id` answers no assistant tool call
    before it, else None: the template would render a result of no call, which the model is then
    trained to read (OpenAI refuses such a conversation too). Shared by chat and `/v1/messages`."""
    called: set[Any] = set()
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            called.update(c.get("id") for c in m.get("tool_calls") or () if isinstance(c, Mapping))
        elif m.get("role") == "tool" and m.get("tool_call_id") not in called:
            return i, m.get("tool_call_id")
    return None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: Count | Bool | None = Field(None, ge=0, le=20)
    echo: Bool | None = False
    best_of: Count | None = Field(None, ge=1, le=1)
    suffix: str | None = None

    def prompt_one(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, str):
            return p
        if not p:
            raise InvalidRequest("invalid_prompt", "prompt must not be empty")
        if all(isinstance(x, int) for x in p):
            return list(p)  # type: ignore[arg-type]
        if len(p) != 1:
            raise InvalidRequest("unsupported_batch", "batched prompts are not supported: send one prompt per request")
        return p[0]  # type: ignore[return-value]

    def to_sampling(self) -> Sampling:
        k = 0 if self.logprobs is None or isinstance(self.logprobs, bool) else self.logprobs
        return self.sampling(self.max_tokens, k)

    def check_unsupported(self) -> None:
        # echo: swarm/server/echo.py checks what the engine can score
        if self.suffix:
            raise InvalidRequest("unsupported_suffix", "suffix is not supported")
