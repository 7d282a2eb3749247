"""Tool calls out of generated text: pure parsers, one per model family's call format.

    parser = get_parser("hermes")                 # ServerConfig.tool_parser: hermes | json | pythonic
    got = parse(parser, text)                     # -> Parsed(content, calls)
    s = parser.stream(); s.feed(piece) ...; s.finish()   # the same, incrementally: ContentPiece | CallPiece

Formats:

* `hermes` (Qwen2.5, Hermes, the embedded model; see swarm/model/tokenizer.py): any number of
  `<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>` blocks among free text.
* `json` (Llama-3.1 style): the whole answer is `{"name": N, "parameters": {...}}` (or `arguments`),
  optionally after `<|python_tag|>`, several separated by `;`, or a JSON list of them.
* `pythonic` (Llama-3.2/4 style): the whole answer is a Python list of calls, `[f(a=1), g(x="y")]`,
  with literal arguments only.

A call that does not parse (bad JSON, no name, arguments not an object, an unterminated block)
is plain content, never an error. `arguments` is the exact JSON text the model wrote when it wrote
JSON (so a client echoing it back re-renders the same text), else canonical `json.dumps`.

One-shot parsing is the streaming parser fed everything at once, so a stream, however it is
chunked, yields exactly the content and calls `parse` returns (a property test checks it).
Streaming holds back text that may still become a call (a partial `<tool_call>` marker, an open
block, whitespace before a block) and only emits a call once its block is complete and valid:
a call is never retracted, and malformed markup comes out as content.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class ContentPiece:
    text: str


@dataclass(frozen=True)
class CallPiece:
    call: ParsedCall


Piece = ContentPiece | CallPiece


@dataclass
class Parsed:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


class ToolStream(Protocol):
    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


class ToolParser(Protocol):
    name: ClassVar[str]

    def prefill(self, function: str | None) -> str:
        """Text that forces a call (`function` None: any tool), continued by the model."""
        ...

    def stream(self) -> ToolStream: ...


def parse(parser: ToolParser, text: str) -> Parsed:
    """Content and calls of a whole answer."""
    s = parser.stream()
    return collect(s.feed(text) + s.finish())


def collect(pieces: list[Piece]) -> Parsed:
    out = Parsed("")
    for p in pieces:
        if isinstance(p, ContentPiece):
            out.content += p.text
        else:
            out.calls.append(p.call)
    return out


# -- shared: one call object -------------------------------------------------------------
def _exact_arguments(text: str, args: dict) -> str | None:
    """The exact text of the `arguments`/`parameters` value inside `text`, if it can be located."""
    dec = json.JSONDecoder()
    for key in ('"arguments"', '"parameters"'):
        at = text.find(key)
        while at >= 0:
            i = at + len(key)
            while i < len(text) and text[i] in " \t\r\n":
                i += 1
            if i < len(text) and text[i] == ":":
                i += 1
                while i < len(text) and text[i] in " \t\r\n":
                    i += 1
                try:
                    value, end = dec.raw_decode(text, i)
                except ValueError:
                    value, end = None, i
                if value == args and isinstance(value, dict):
                    return text[i:end]
            at = text.find(key, at + 1)
    return None


def call_from_object(obj: object, source: str = "") -> ParsedCall | None:
    """`{"name": str, "arguments"|"parameters": object}` as a call; None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    exact = _exact_arguments(source, args) if source else None
    return ParsedCall(obj["name"], exact if exact is not None else json.dumps(args, ensure_ascii=False))


# -- hermes ---------------------------------------------------------------------------------
def _hermes_block(block: str) -> ParsedCall | None:
    inner = block[len(HERMES_OPEN) : -len(HERMES_CLOSE)].strip()
    try:
        obj = json.loads(inner)
    except ValueError:
        return None
    return call_from_object(obj, inner)


class HermesStream:
    """See the module docstring: text passes through, complete valid blocks become calls."""

    def __init__(self) -> None:
        self.buf = ""  # not yet decided
        self.ws = ""  # whitespace held back: dropped if a valid call follows
        self.in_block = False
        self.after_call = False  # whitespace right after a call is dropped

    def _text(self, s: str, final: bool) -> list[Piece]:
        if self.after_call:
            s = s.lstrip()
            if not s:
                return []
            self.after_call = False
        body = s if final else s.rstrip()
        tail = s[len(body) :]
        if not body:
            self.ws += tail
            return []
        out = self.ws + body
        self.ws = tail
        return [ContentPiece(out)]

    def feed(self, text: str) -> list[Piece]:
        self.buf += text
        out: list[Piece] = []
        while True:
            if not self.in_block:
                i = self.buf.find(HERMES_OPEN)
                if i < 0:
                    keep = next(
                        (
                            k
                            for k in range(min(len(HERMES_OPEN) - 1, len(self.buf)), 0, -1)
                            if HERMES_OPEN.startswith(self.buf[-k:])
                        ),
                        0,
                    )
                    cut = len(self.buf) - keep
                    out += self._text(self.buf[:cut], final=False)
                    self.buf = self.buf[cut:]
                    return out
                out += self._text(self.buf[:i], final=False)
                self.buf = self.buf[i:]
                self.in_block = True
            j = self.buf.find(HERMES_CLOSE, len(HERMES_OPEN))
            if j < 0:
                return out
            block, self.buf = self.buf[: j + len(HERMES_CLOSE)], self.buf[j + len(HERMES_CLOSE) :]
            self.in_block = False
            call = _hermes_block(block)
            if call is None:  # malformed: content, with the whitespace before it
                out += self._text(block, final=False)
            else:
                self.ws = ""
                self.after_call = True
                out.append(CallPiece(call))

    def finish(self) -> list[Piece]:
        rest, self.buf, self.in_block = self.buf, "", False
        out = self._text(rest, final=True) if rest else []
        if self.ws and not self.after_call:
            out.append(ContentPiece(self.ws))
        self.ws = ""
        return out


class HermesParser:
    name: ClassVar[str] = "hermes"

    def prefill(self, function: str | None) -> str:
        if function is None:
            return HERMES_OPEN + '\n{"name": "'
        return HERMES_OPEN + '\n{"name": ' + json.dumps(function, ensure_ascii=False) + ', "arguments": '

    def stream(self) -> ToolStream:
        return HermesStream()


# -- whole-answer formats (json, pythonic) ---------------------------------------------------
class WholeAnswerStream:
    """For formats where the whole answer is the call list: hold it while it may be one."""

    def __init__(self, starts: tuple[str, ...], parse_all: _ParseAll) -> None:
        self.starts = starts
        self.parse_all = parse_all
        self.buf = ""
        self.passthrough = False

    def feed(self, text: str) -> list[Piece]:
        if self.passthrough:
            return [ContentPiece(text)] if text else []
        self.buf += text
        head = self.buf.lstrip()
        if not head or any(s.startswith(head) or head.startswith(s) for s in self.starts):
            return []  # may still be a call
        self.passthrough = True
        out, self.buf = self.buf, ""
        return [ContentPiece(out)]

    def finish(self) -> list[Piece]:
        if self.passthrough or not self.buf:
            return []
        text, self.buf = self.buf, ""
        calls = self.parse_all(text.strip())
        if not calls:
            return [ContentPiece(text)]
        return [CallPiece(c) for c in calls]


class _ParseAll(Protocol):
    def __call__(self, text: str) -> list[ParsedCall] | None: ...


def _json_calls(text: str) -> list[ParsedCall] | None:
    text = text.removeprefix(PYTHON_TAG).strip()
    dec = json.JSONDecoder()
    objs: list[tuple[object, str]] = []
    i = 0
    while i < len(text):
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            return None
        objs.append((obj, text[i:end]))
        i = end
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
    if len(objs) == 1 and isinstance(objs[0][0], list):
        items = objs[0][0]
        objs = [(o, json.dumps(o, ensure_ascii=False)) for o in items]
    calls = [call_from_object(o, src) for o, src in objs]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _pythonic_calls(text: str) -> list[ParsedCall] | None:
    text = text.removeprefix(PYTHON_TAG).strip()
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        args = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
        try:
            arguments = json.dumps(args, ensure_ascii=False)
        except (TypeError, ValueError):  # sets, bytes, complex: not JSON
            return None
        calls.append(ParsedCall(node.func.id, arguments))
    return calls


class JsonParser:
    name: ClassVar[str] = "json"

    def prefill(self, function: str | None) -> str:
        if function is None:
            return '{"name": "'
        return '{"name": ' + json.dumps(function, ensure_ascii=False) + ', "parameters": '

    def stream(self) -> ToolStream:
        return WholeAnswerStream(("{", "[", PYTHON_TAG), _json_calls)


class PythonicParser:
    name: ClassVar[str] = "pythonic"

    def prefill(self, function: str | None) -> str:
        return "[" if function is None else f"[{function}("

    def stream(self) -> ToolStream:
        return WholeAnswerStream(("[", PYTHON_TAG), _pythonic_calls)


PARSERS: dict[str, ToolParser] = {p.name: p for p in (HermesParser(), JsonParser(), PythonicParser())}


def get_parser(name: str) -> ToolParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(PARSERS))}") from None


__all__ = [
    "CallPiece",
    "ContentPiece",
    "Parsed",
    "ParsedCall",
    "PARSERS",
    "Piece",
    "ToolParser",
    "ToolStream",
    "collect",
    "get_parser",
    "parse",
]
