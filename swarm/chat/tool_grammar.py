"""Grammars that admit only a well-formed tool call (in a parser's format) or a JSON answer.

OpenAI lets a request carry tools *and* a `response_format`: the format governs the final answer,
while the model may still call a tool first. A JSON constraint alone would forbid every call (the
issue pydantic-ai agents with `output_type` hit), and a forced `tool_choice` ("required", a named
function, Anthropic's `any` / `tool`) without a constraint can come back as text. So the core
constrains such turns with one llguidance Lark grammar (the torch engine and vLLM's guidance
backend both run llguidance, so both apply the same text):

    start: body END
    body: call (SEP call)*                forced: only calls of the allowed tools
    body: call (SEP call)* | answer       tools + response_format: calls, or the schema's JSON

With `parallel_tool_calls: false` the repetition goes (`body: call`, `body: call | answer`): at most
one call, enforced where it is generated rather than cut from the reply afterwards.

END is the template's end-of-turn token (`<|im_end|>`, where the tokenizer has it as one token).

Each call is the parser's own skeleton with the tool's parameter schema as compact JSON in it,
`<tool_call>\\n{"name": "add", "arguments": {"a":1}}\\n</tool_call>` for hermes, so the parser
reads it back and the chat template renders it as written. A forced call's prefill (already in
the prompt ids, `ToolParser.prefill`) is left out of the grammar: the grammar starts where the
prompt ends. Markers the tokenizer holds as single tokens (`<tool_call>`) are admitted both as that
token and as text (`<[id]>` is llguidance's syntax for a token by id).

Pure: data in, text out. Formats without a grammar here (`pythonic`, whose arguments are Python
literals) give None: a forced call there is only prefilled, and tools with a format stay
unconstrained, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from swarm.chat.tool_parsers import HERMES_CLOSE, HERMES_OPEN, ToolParser

#: compact JSON inside the grammar, as `swarm.engine.constrained.JSON_OPTIONS` for a plain format
_COMPACT = {"whitespace_flexible": False}
#: per format: (text after a call's arguments, text between two calls)
_SKELETON: dict[str, tuple[str, str]] = {
    "hermes": ("}\n" + HERMES_CLOSE, "\n"),
    "json": ("}", "; "),
}
MARKERS = (HERMES_OPEN, HERMES_CLOSE)
#: the chat template's end of turn: where `tokens` has it, every grammar ends with it, so a
#: constrained turn ends as the template renders it (vLLM's guidance backend would otherwise end
#: it with the tokenizer's EOS, `<|endoftext|>`); the engines stop on it as on any EOS
END_OF_TURN = "<|im_end|>"


def supports(parser: ToolParser) -> bool:
    """Whether calls in `parser`'s format can be constrained by a grammar here."""
    return parser.name in _SKELETON


def _json_rule(schema: Mapping[str, Any] | bool) -> str:
    body = dict(schema) if isinstance(schema, Mapping) else ({} if schema else {"not": {}})
    body["x-guidance"] = _COMPACT
    return "%json " + json.dumps(body, ensure_ascii=False, sort_keys=True)


def _literal(text: str, tokens: Mapping[str, int]) -> str:
    """`text` as a sequence of Lark terminals; a marker the tokenizer holds as one token may come as it."""
    parts: list[str] = []
    rest = text
    while rest:
        at = [(rest.find(m), m) for m in MARKERS if m in tokens and m in rest]
        if not at:
            parts.append(json.dumps(rest, ensure_ascii=False))
            break
        i, marker = min(at)
        if i:
            parts.append(json.dumps(rest[:i], ensure_ascii=False))
        parts.append(f"({json.dumps(marker, ensure_ascii=False)} | <[{int(tokens[marker])}]>)")
        rest = rest[i + len(marker) :]
    return " ".join(parts) if parts else '""'


def _json_call_or_answer(
    tools: Sequence[Mapping[str, Any]], answer: Mapping[str, Any] | bool, tokens: Mapping[str, int] | None
) -> str:
    """The `json` format with an answer: a call and the answer both start `{"`, which one lexer cannot
    tell apart as a literal and a JSON lexeme, so both are one JSON schema (a call is compact there)."""
    options: list[Any] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else {}
        if isinstance(fn.get("name"), str):
            params = fn.get("parameters") if isinstance(fn.get("parameters"), (Mapping, bool)) else {"type": "object"}
            options.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": fn["name"]}, "parameters": params},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
            )
    options.append(answer)
    return f"start: body{_end(tokens)}\nbody: {_json_rule({'anyOf': options})}\n"


def _end(tokens: Mapping[str, int] | None) -> str:
    end = (tokens or {}).get(END_OF_TURN)
    return "" if end is None else f" <[{int(end)}]>"


def tool_call_grammar(
    parser: ToolParser,
    tools: Sequence[Mapping[str, Any]],
    *,
    allowed: str | None = None,
    prefill: str = "",
    answer: Mapping[str, Any] | bool | None = None,
    tokens: Mapping[str, int] | None = None,
    parallel: bool = True,
) -> str | None:
    """A Lark grammar for one turn, or None where `parser`'s format has none here.

    `tools`: OpenAI function tools; `allowed`: the one function a named `tool_choice` allows (None:
    any of them); `prefill`: the call's start already in the prompt (the grammar continues it);
    `answer`: the JSON schema a plain answer must follow (None: calls only, a forced choice);
    `tokens`: markers the tokenizer holds as single tokens, with their ids; `parallel`: False admits
    one call only (`parallel_tool_calls: false`).
    """
    if not supports(parser):
        return None
    close, sep = _SKELETON[parser.name]
    specials = dict(tokens or {})
    rules: list[str] = []
    firsts: list[str] = []
    calls: list[str] = []
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else None
        name = fn.get("name") if fn else None
        if not isinstance(name, str) or (allowed is not None and name != allowed):
            continue
        params = fn.get("parameters") if fn else None
        rules.append(f"args_{k}: {_json_rule(params if isinstance(params, (Mapping, bool)) else {'type': 'object'})}")
        head = parser.prefill(name)
        rules.append(f"call_{k}: {_literal(head, specials)} args_{k} {_literal(close, specials)}")
        calls.append(f"call_{k}")
        if prefill:
            if not head.startswith(prefill):
                raise ValueError(f"the prefill {prefill!r} does not start the call of {name!r}")
            tail = head[len(prefill) :]
            firsts.append(
                f"{_literal(tail, specials)} args_{k} {_literal(close, specials)}"
                if tail
                else f"args_{k} {_literal(close, specials)}"
            )
    if not calls:
        return None
    if answer is not None and not prefill and parser.name == "json":
        return _json_call_or_answer(tools, answer, tokens)
    rules.append("call: " + " | ".join(calls))
    more = f"({_literal(sep, specials)} call)*" if parallel else ""
    if prefill:
        rules.append("first: " + " | ".join(firsts))
        start = f"first {more}".rstrip()
    else:
        start = f"call {more}".rstrip()
    if answer is not None and not prefill:
        rules.append(f"answer: {_json_rule(answer)}")
        start = f"{start} | answer"
    return "\n".join([f"start: body{_end(tokens)}", f"body: {start}", *rules]) + "\n"


def answer_grammar(answer: Mapping[str, Any] | bool, tokens: Mapping[str, int] | None = None) -> str:
    """A Lark grammar of a plain JSON answer (`response_format` json_object / json_schema, no tools)
    that ends with the end-of-turn token where `tokens` has it.

    Why: vLLM's guidance backend ends a JSON format with the tokenizer's EOS, which is
    `<|endoftext|>` for a base model's tokenizer (Qwen2.5 base, say), so the trained sample would end
    unlike the template's turn. The torch engine picks `<|im_end|>` itself (`Grammars.end_ids`);
    the vllm engine sends this grammar as `structured_outputs.grammar` instead of the format, so
    both end the turn alike. The JSON rule is the plain format's (compact), so nothing else changes.
    """
    return f"start: body{_end(tokens)}\nbody: {_json_rule(answer)}\n"


def answer_schema(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | bool | None:
    """The JSON schema an OpenAI `response_format` asks of a plain answer (None: text, unconstrained)."""
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = (response_format or {}).get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, Mapping) else {}
        return schema if isinstance(schema, (Mapping, bool)) else {}
    return None


def turn_format(
    parser: ToolParser,
    tools: Sequence[Mapping[str, Any]] | None,
    forced: str | None,
    prefill: str,
    response_format: Mapping[str, Any] | None,
    tokens: Mapping[str, int] | None = None,
    parallel: bool = True,
) -> dict[str, Any] | None:
    """The constraint of a turn with tools, as the `{"type": "grammar"}` format engines take; None
    where the turn keeps its own `response_format` (or none): no forced call and no JSON answer, or
    a parser without a grammar here.

    `forced`: "" for any tool (`required`), a function's name, or None (`auto`); `parallel`: False
    admits at most one call (`parallel_tool_calls: false`). An `auto` turn without a JSON answer gets
    no grammar for it: the core keeps its first call instead (`decoding.ChoiceRun`)."""
    if not tools:
        return None
    answer = None if forced is not None else answer_schema(response_format)
    if forced is None and answer is None:
        return None
    grammar = tool_call_grammar(
        parser,
        tools,
        allowed=forced or None,
        prefill=prefill if forced is not None else "",
        answer=answer,
        tokens=tokens,
        parallel=parallel,
    )
    return None if grammar is None else {"type": "grammar", "grammar": grammar}


__all__ = ["END_OF_TURN", "MARKERS", "answer_grammar", "answer_schema", "supports", "tool_call_grammar", "turn_format"]
