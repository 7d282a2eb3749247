"""Chat models for the planner: LangChain's `ChatOpenAI` and a kill switch; structured answers.

* `make_chat_model()`: `langchain-openai`'s `ChatOpenAI` on any OpenAI-compatible
  endpoint (vLLM, OpenAI, a proxy). Base URL, key and model come from the study's
  config or the environment: `ROOST_LLM_BASE_URL` / `ROOST_LLM_API_KEY` /
  `ROOST_LLM_MODEL`, else the usual `OPENAI_BASE_URL` / `OPENAI_API_KEY` /
  `OPENAI_MODEL`. Each request has a timeout (`ROOST_LLM_TIMEOUT_S`); the client's
  own retries are off because `structured()` owns the backoff.
* `ScriptedChatModel` (researcher/scripted_model.py): replies from a list or a function of the
  messages, for unit tests, through the same `structured()` path as a real server.
* `override_model(...)` and the switch `model_requests_allowed(False)` (or env
  `ROOST_ALLOW_MODEL_REQUESTS=0`): with the switch off the real model raises
  `ModelRequestsForbidden` before any network I/O. The researcher's tests turn it off.

`structured(model, messages, Schema, policy=...)` asks through LangChain's
`with_structured_output` (JSON-schema mode, or tool calling where the server refuses
`response_format`), validates with pydantic (and an optional `check`), and sends
each validation error back for another try. Unreachable or overloaded endpoints
are retried with exponential backoff for up to `policy.wait_s` seconds, then
`LLMUnreachable` says so (the study is resumable). Tokens come from each
response's `usage`.

An answer ends where its schema ends: the schema sent asks for compact JSON (no
optional whitespace, which guided decoding otherwise lets a weak model emit until
the token limit), and a schema that bounds itself (maxLength, maxItems, enums)
caps the call's max_tokens at what its longest answer needs (`answer_token_limit`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import openai
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

ENV_BASE_URL = "ROOST_LLM_BASE_URL"
ENV_API_KEY = "ROOST_LLM_API_KEY"
ENV_MODEL = "ROOST_LLM_MODEL"
ENV_TIMEOUT = "ROOST_LLM_TIMEOUT_S"
ENV_ALLOW = "ROOST_ALLOW_MODEL_REQUESTS"
OPENAI_ENV = {"base_url": "OPENAI_BASE_URL", "api_key": "OPENAI_API_KEY", "model": "OPENAI_MODEL"}

ALLOW_MODEL_REQUESTS = True
_override: BaseChatModel | None = None

T = TypeVar("T", bound=BaseModel)
Method = Literal["json_schema", "function_calling"]


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


# ---------------------------------------------------------------- the real model


def llm_settings(config: dict[str, Any] | None = None) -> dict[str, str] | None:
    """{base_url, api_key, model} from `config` (keys llm_*), ROOST_LLM_* or OPENAI_*; None if unset.

    A model name is required, and an endpoint: a base URL, or an OpenAI key for OpenAI itself.
    """
    config = config or {}

    def pick(key: str, roost_env: str) -> str | None:
        return config.get(f"llm_{key}") or os.environ.get(roost_env) or os.environ.get(OPENAI_ENV[key])

    base, model, key = pick("base_url", ENV_BASE_URL), pick("model", ENV_MODEL), pick("api_key", ENV_API_KEY)
    if not model or not (base or key):
        return None
    out = {"api_key": key or "none", "model": model}
    if base:
        out["base_url"] = base
    return out


@functools.cache
def _guarded_chat_openai() -> type[BaseChatModel]:
    """`ChatOpenAI` behind the kill switch (a class made once, on first use)."""
    from langchain_openai import ChatOpenAI  # lazy: ~4 s of imports, only when a real model is asked

    class GuardedChatOpenAI(ChatOpenAI):  # type: ignore[misc]
        """ChatOpenAI that refuses to send anything while model requests are switched off."""

        def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
            if not requests_allowed():
                raise ModelRequestsForbidden(
                    "real model requests are switched off (tests); use ScriptedChatModel or override_model()"
                )
            return super()._generate(*args, **kwargs)

        async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
            if not requests_allowed():
                raise ModelRequestsForbidden("real model requests are switched off (tests)")
            return await super()._agenerate(*args, **kwargs)

    return GuardedChatOpenAI


def make_chat_model(
    config: dict[str, Any] | None = None,
    *,
    timeout_s: float | None = None,
    temperature: float = 0.2,
    max_tokens: int | None = 1024,
) -> BaseChatModel:
    """The override if one is set, else `ChatOpenAI` on the configured endpoint."""
    if _override is not None:
        return _override
    settings = llm_settings(config)
    if settings is None:
        raise RuntimeError(
            f"no LLM configured: set {ENV_BASE_URL} and {ENV_MODEL} (and {ENV_API_KEY}), "
            f"or OPENAI_BASE_URL / OPENAI_API_KEY and OPENAI_MODEL"
        )
    timeout = timeout_s if timeout_s is not None else float(os.environ.get(ENV_TIMEOUT, "120"))
    return _guarded_chat_openai()(
        **settings, timeout=timeout, max_retries=0, temperature=temperature, max_tokens=max_tokens
    )


# ---------------------------------------------------------------- the scripted model

# ---------------------------------------------------------------- structured answers


class CallPolicy(BaseModel):
    """How `structured()` talks to the endpoint: output mode, and how long to wait it out."""

    model_config = ConfigDict(extra="forbid")

    method: Method = Field(
        "json_schema",
        description="json_schema (response_format); switched to "
        "function_calling when the server refuses response_format",
    )
    wait_s: float = Field(
        default_factory=lambda: float(os.environ.get("ROOST_LLM_WAIT_S", "300")),
        ge=0,
        description="keep retrying an unreachable/overloaded endpoint this long (ROOST_LLM_WAIT_S, default 300 s)",
    )
    backoff_s: float = Field(1.0, gt=0, description="first wait; doubles up to backoff_max_s (±25 % jitter)")
    backoff_max_s: float = Field(30.0, gt=0)
    transport_retries: int = Field(0, ge=0, description="how many transport retries were made (a counter)")


def _transient(e: Exception) -> bool:
    """Worth waiting for: no connection, a timeout, 408/409/429, or a 5xx (openai's own rule)."""
    if isinstance(e, openai.APIConnectionError):  # includes APITimeoutError
        return True
    return isinstance(e, openai.APIStatusError) and (e.status_code in (408, 409, 429) or e.status_code >= 500)


def _refuses_response_format(e: Exception) -> bool:
    return isinstance(e, openai.BadRequestError) and any(
        w in str(e) for w in ("response_format", "json_schema", "structured output", "guided")
    )


# ---------------------------------------------------------------- how long an answer can be

# llguidance (vLLM's structured-output backend for these schemas: pattern + length rules out
# xgrammar) reads this top-level key: fixed separators and no optional whitespace. Without it
# an untrained model may pick whitespace after every value until max_tokens cuts it off.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NUMBER_CHARS = 24  # a JSON number's digits are unbounded in a schema; this covers any float's repr


def compact(json_schema: dict) -> dict:
    """The schema as sent: compact JSON asked for, unless the schema says otherwise itself."""
    return json_schema if "x-guidance" in json_schema else {**json_schema, "x-guidance": COMPACT_JSON}


def _bounded(sizes: list[int | None]) -> list[int] | None:
    return None if any(n is None for n in sizes) else [n for n in sizes if n is not None]


def max_answer_chars(schema: dict) -> int | None:
    """Characters of the longest compact answer `schema` allows; None when it is unbounded.

    A string counts its maxLength (escapes aside); `$ref`, open objects, arrays without
    maxItems and strings without maxLength are unbounded.
    """
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return max(len(json.dumps(v)) for v in values)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = _bounded([max_answer_chars(s) for s in schema[key]])
            return None if options is None else max(options)
    if "$ref" in schema or "allOf" in schema:
        return None
    kind = schema.get("type")
    if kind == "string":
        return schema["maxLength"] + 2 if "maxLength" in schema else None
    if kind == "integer":
        ends = [schema.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
        ends = [e for e in ends if e is not None]
        return max(len(str(int(e))) for e in ends) + 1 if len(ends) >= 2 else NUMBER_CHARS
    if kind == "number":
        return NUMBER_CHARS
    if kind in ("boolean", "null"):
        return 5
    sep = len(COMPACT_JSON["item_separator"])
    if kind == "array":
        prefix = _bounded([max_answer_chars(s) for s in schema.get("prefixItems", [])])
        n_more = schema.get("maxItems", 0 if schema.get("items") is False else None)
        if prefix is None or n_more is None:
            return None
        n_more = max(0, n_more - len(prefix))
        item = max_answer_chars(schema["items"]) if n_more and isinstance(schema.get("items"), dict) else 0
        if item is None:
            return None
        return 2 + sum(prefix) + n_more * item + sep * max(0, len(prefix) + n_more - 1)
    if kind == "object":
        if schema.get("additionalProperties", True) is not False:
            return None
        props = schema.get("properties", {})
        values = _bounded([max_answer_chars(s) for s in props.values()])
        if values is None:
            return None
        keys = sum(len(json.dumps(k)) + len(COMPACT_JSON["key_separator"]) for k in props)
        return 2 + keys + sum(values) + sep * max(0, len(props) - 1)
    return None


def answer_token_limit(json_schema: dict, cap: int | None) -> int | None:
    """max_tokens for one answer: what the schema's longest answer needs, at most `cap`.

    A token almost always carries at least one character; the margin covers escapes
    and characters a tokenizer splits into bytes. An unbounded schema keeps `cap`.
    """
    chars = max_answer_chars(json_schema)
    if chars is None:
        return cap
    need = math.ceil(chars * 1.25) + 16
    return need if cap is None else min(cap, need)


def _structured_runnable(model: BaseChatModel, json_schema: dict, method: Method) -> Any:
    """ChatOpenAI honours `method`; LangChain's base chat model drops it and uses tool calling.

    The call's max_tokens follows the schema (`answer_token_limit`) on models that have one.
    """
    if "max_tokens" in type(model).model_fields:
        limit = answer_token_limit(json_schema, getattr(model, "max_tokens", None))
        if limit != getattr(model, "max_tokens", None):
            model = model.model_copy(update={"max_tokens": limit})
    return model.with_structured_output(compact(json_schema), method=method, include_raw=True)


def _invoke(
    model: BaseChatModel,
    messages: list[BaseMessage],
    json_schema: dict,
    policy: CallPolicy,
    sleep: Callable[[float], None],
) -> dict:
    """One answer {raw, parsed, parsing_error}, waiting out an unreachable endpoint (backoff)."""
    started, delay = time.monotonic(), policy.backoff_s
    while True:
        try:
            return _structured_runnable(model, json_schema, policy.method).invoke(messages)
        except openai.LengthFinishReasonError as e:  # the client refuses to parse a cut-off answer
            return _cut_off(e)
        except openai.APIError as e:
            if policy.method == "json_schema" and _refuses_response_format(e):
                log.warning("the endpoint refuses response_format json_schema (%s); using tool calling", e)
                policy.method = "function_calling"
                continue
            base = getattr(model, "openai_api_base", None) or "the LLM endpoint"
            if not _transient(e):
                raise LLMUnreachable(
                    f"{base} refused the request for model "
                    f"{getattr(model, 'model_name', '?')!r}: {type(e).__name__}: {e}"
                ) from e
            waited = time.monotonic() - started
            if waited + delay > policy.wait_s:
                raise LLMUnreachable(
                    f"cannot reach the LLM endpoint {base} ({type(e).__name__}: {e}); gave up after "
                    f"{policy.transport_retries} retries over {waited:.0f} s"
                ) from e
            policy.transport_retries += 1
            pause = delay * random.uniform(0.75, 1.25)
            log.warning("LLM endpoint %s: %s; retrying in %.1f s", base, type(e).__name__, pause)
            sleep(pause)
            delay = min(delay * 2, policy.backoff_max_s)


def _cut_off(e: openai.LengthFinishReasonError) -> dict:
    """A cut-off answer as an invalid one: its text and usage kept, the reason as its parsing error."""
    usage = e.completion.usage
    meta = (
        None
        if usage is None
        else {
            "input_tokens": usage.prompt_tokens,
            "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }
    )
    text = e.completion.choices[0].message.content or "" if e.completion.choices else ""
    n = "?" if usage is None else usage.completion_tokens
    return {
        "raw": AIMessage(content=text[:2000], usage_metadata=meta),  # type: ignore[arg-type]
        "parsed": None,
        "parsing_error": ValueError(
            f"the answer was cut off at the token limit ({n} tokens); answer with a shorter JSON object"
        ),
    }


def count_tokens(msg: BaseMessage, messages: Sequence[BaseMessage]) -> int:
    """The response's reported usage; a rough chars/4 estimate when the server reports none."""
    meta = getattr(msg, "usage_metadata", None)
    if meta and meta.get("total_tokens"):
        return int(meta["total_tokens"])
    return (sum(len(str(m.content)) for m in messages) + len(str(msg.content))) // 4 + 1


def _answer_text(raw: AIMessage) -> str:
    """What the model answered, as text (tool-call arguments included), to quote back on a retry."""
    if raw.tool_calls:
        return json.dumps(raw.tool_calls[0]["args"])
    if raw.invalid_tool_calls:
        return str(raw.invalid_tool_calls[0].get("args") or "")
    return str(raw.content)


def _answer(out: dict, schema: type[T]) -> T:
    """The validated answer, or ValueError/ValidationError saying what is wrong with it."""
    raw: AIMessage = out["raw"]
    if out.get("parsing_error") is not None:
        raise ValueError(f"the reply is not valid JSON ({out['parsing_error']})")
    if out.get("parsed") is None:
        if raw.invalid_tool_calls:
            raise ValueError(f"the reply is not valid JSON ({raw.invalid_tool_calls[0].get('error')})")
        raise ValueError(f"the reply holds no {schema.__name__} JSON object")
    return schema.model_validate(out["parsed"])


def structured(
    model: BaseChatModel,
    messages: list[BaseMessage],
    schema: type[T],
    *,
    json_schema: dict | None = None,
    check: Callable[[T], None] | None = None,
    retries: int = 2,
    retry_prompt: Callable[[str], str] | None = None,
    on_tokens: Callable[[int], None] | None = None,
    policy: CallPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Ask until the answer validates as `schema` (and passes `check`); at most 1 + retries answers.

    `json_schema` is what the server is asked to follow (default: `schema`'s own); a
    tighter one lets a server with structured outputs rule out answers pydantic would
    refuse. Each invalid answer is quoted back with the error. `on_tokens(n)` is told
    every answer's token count (the budget is charged there, invalid answers included).
    """
    policy = policy or CallPolicy()
    answer_schema = json_schema or schema.model_json_schema()
    messages = list(messages)
    error = ""
    for _ in range(retries + 1):
        out = _invoke(model, messages, answer_schema, policy, sleep)
        raw: AIMessage = out["raw"]
        if on_tokens is not None:
            on_tokens(count_tokens(raw, messages))
        try:
            obj = _answer(out, schema)
            if check is not None:
                check(obj)
            return obj
        except (ValidationError, ValueError) as e:
            error = str(e)
        messages += [
            AIMessage(content=_answer_text(raw)),
            HumanMessage(
                content=retry_prompt(error)
                if retry_prompt
                else f"That output was invalid:\n{error}\nReply with corrected JSON only."
            ),
        ]
    raise StructuredOutputError(f"no valid {schema.__name__} after {retries + 1} attempts; last error: {error}")
