"""Chat models for the planner: an OpenAI-compatible one, a scripted one, and a kill switch.

Three ideas taken from pydantic-ai's testing story:

* `ScriptedChatModel`: a LangChain chat model whose replies are a list of strings
  or a function of the messages (any LangChain `BaseChatModel`, e.g.
  `GenericFakeChatModel`, works as well); it records every call.
* `override_model(...)`: dependency override; `make_chat_model()` returns the
  override instead of building a real client.
* `ALLOW_MODEL_REQUESTS` / `model_requests_allowed(False)` (or env
  `ROOST_ALLOW_MODEL_REQUESTS=0`): a global switch; with it off, the real client
  raises `ModelRequestsForbidden` before any network I/O. The researcher's tests
  turn it off for the whole session.

`structured(model, messages, Schema)` asks for JSON, validates it with pydantic
and, when invalid, sends the validation error back and asks again.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel, Field, ValidationError

ENV_BASE_URL = "ROOST_LLM_BASE_URL"
ENV_API_KEY = "ROOST_LLM_API_KEY"
ENV_MODEL = "ROOST_LLM_MODEL"
ENV_ALLOW = "ROOST_ALLOW_MODEL_REQUESTS"

ALLOW_MODEL_REQUESTS = True
_override: BaseChatModel | None = None

T = TypeVar("T", bound=BaseModel)


class ModelRequestsForbidden(RuntimeError):
    """A real model request was attempted while requests are switched off (tests)."""


class BudgetExceeded(RuntimeError):
    """The study's LLM token budget is spent."""


class StructuredOutputError(RuntimeError):
    """The model gave no valid output after every retry."""


class LLMUnreachable(RuntimeError):
    """The chat endpoint could not be reached or refused the request (the study can resume later)."""


def requests_allowed() -> bool:
    return ALLOW_MODEL_REQUESTS and os.environ.get(ENV_ALLOW, "1").lower() not in ("0", "false", "no")


@contextmanager
def model_requests_allowed(allowed: bool) -> Iterator[None]:
    """Temporarily allow or forbid real model requests."""
    global ALLOW_MODEL_REQUESTS
    before = ALLOW_MODEL_REQUESTS
    ALLOW_MODEL_REQUESTS = allowed
    try:
        yield
    finally:
        ALLOW_MODEL_REQUESTS = before


@contextmanager
def override_model(model: BaseChatModel | None) -> Iterator[None]:
    """Make `make_chat_model()` return `model` (tests, notebooks)."""
    global _override
    before = _override
    _override = model
    try:
        yield
    finally:
        _override = before


def llm_settings(config: dict[str, Any] | None = None) -> dict[str, str] | None:
    """{base_url, api_key, model} from `config` (keys llm_*) or env; None if not configured."""
    config = config or {}
    base = config.get("llm_base_url") or os.environ.get(ENV_BASE_URL)
    model = config.get("llm_model") or os.environ.get(ENV_MODEL)
    key = config.get("llm_api_key") or os.environ.get(ENV_API_KEY) or "none"
    if not base or not model:
        return None
    return {"base_url": base, "api_key": key, "model": model}


def make_chat_model(config: dict[str, Any] | None = None) -> BaseChatModel:
    if _override is not None:
        return _override
    settings = llm_settings(config)
    if settings is None:
        raise RuntimeError(f"no LLM configured: set {ENV_BASE_URL} and {ENV_MODEL} (and {ENV_API_KEY})")
    return OpenAIChatModel(**settings)


def _role(m: BaseMessage) -> str:
    return {"human": "user", "ai": "assistant", "system": "system"}.get(m.type, "user")


class OpenAIChatModel(BaseChatModel):
    """Any OpenAI-compatible chat endpoint through the `openai` client (no extra package)."""

    base_url: str
    api_key: str = "none"
    model: str
    temperature: float = 0.2
    timeout_s: float = 120.0

    @property
    def _llm_type(self) -> str:
        return "roost-openai-compatible"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if not requests_allowed():
            raise ModelRequestsForbidden("real model requests are switched off (tests); "
                                         "use ScriptedChatModel or override_model()")
        import openai  # lazy: the client library is only needed when a real model is asked

        client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s)
        try:
            resp = client.chat.completions.create(
                model=self.model, temperature=self.temperature, stop=stop,
                messages=[{"role": _role(m), "content": str(m.content)} for m in messages])
        except openai.APIConnectionError as e:  # includes timeouts
            raise LLMUnreachable(f"cannot reach the LLM endpoint {self.base_url} ({e})") from e
        except openai.APIStatusError as e:
            raise LLMUnreachable(f"the LLM endpoint {self.base_url} refused the request for model "
                                 f"{self.model!r}: HTTP {e.status_code} {e.message}") from e
        text = resp.choices[0].message.content or ""
        usage = resp.usage
        meta = None
        if usage is not None:
            meta = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                    "total_tokens": usage.total_tokens}
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text, usage_metadata=meta))])


Reply = str | Callable[[list[BaseMessage]], str]


class ScriptedChatModel(BaseChatModel):
    """Replies from a script: a list (one entry per call; strings or functions of the
    messages) or one function for every call. Records the messages of each call."""

    script: Any  # list[Reply] | Callable[[list[BaseMessage]], str]
    calls: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "roost-scripted"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
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
        meta = {"input_tokens": n_in, "output_tokens": len(text) // 4 + 1,
                "total_tokens": n_in + len(text) // 4 + 1}
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text, usage_metadata=meta))])


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def extract_json(text: str) -> Any:
    """The JSON object in a reply: a fenced block, the whole text, or its outermost {...}."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{"): text.rindex("}") + 1])
    last: Exception | None = None
    for c in candidates:
        try:
            return json.loads(c.strip())
        except json.JSONDecodeError as e:
            last = e
    raise ValueError(f"the reply is not valid JSON ({last})")


def count_tokens(msg: BaseMessage, messages: Sequence[BaseMessage]) -> int:
    meta = getattr(msg, "usage_metadata", None)
    if meta and meta.get("total_tokens"):
        return int(meta["total_tokens"])
    return (sum(len(str(m.content)) for m in messages) + len(str(msg.content))) // 4 + 1


def structured(model: BaseChatModel, messages: list[BaseMessage], schema: type[T], *,
               check: Callable[[T], None] | None = None, retries: int = 2,
               retry_prompt: Callable[[str], str] | None = None,
               on_tokens: Callable[[int], None] | None = None) -> T:
    """Ask until the reply validates as `schema` (and passes `check`); at most 1 + retries calls.

    Each failed attempt is answered with the error so the model can correct itself.
    `on_tokens(n)` is told each call's token count (the budget is charged there).
    """
    messages = list(messages)
    error = ""
    for _ in range(retries + 1):
        reply = model.invoke(messages)
        if on_tokens is not None:
            on_tokens(count_tokens(reply, messages))
        text = str(reply.content)
        try:
            obj = schema.model_validate(extract_json(text))
            if check is not None:
                check(obj)
            return obj
        except (ValidationError, ValueError) as e:
            error = str(e)
        messages += [AIMessage(content=text),
                     HumanMessage(content=retry_prompt(error) if retry_prompt else
                                  f"That output was invalid:\n{error}\nReply with corrected JSON only.")]
    raise StructuredOutputError(f"no valid {schema.__name__} after {retries + 1} attempts; last error: {error}")
