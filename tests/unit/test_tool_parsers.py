"""Tool-call parsers (swarm/chat/tool_parsers.py): pure text in, content and calls out."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.chat.tool_parsers import PARSERS, ParsedCall, collect, get_parser, parse
from swarm.model.tokenizer import render_chat, tool_call_text

HERMES = get_parser("hermes")


def test_hermes_calls_and_content() -> None:
    text = (
        "Let me look.\n"
        + tool_call_text("get_weather", '{"city": "Paris"}')
        + "\n"
        + tool_call_text("add", {"a": 1, "b": 2})
    )
    got = parse(HERMES, text)
    assert got.content == "Let me look."
    assert got.calls == [ParsedCall("get_weather", '{"city": "Paris"}'), ParsedCall("add", '{"a": 1, "b": 2}')]


def test_hermes_keeps_the_exact_argument_text() -> None:
    got = parse(HERMES, '<tool_call>\n{"name": "f", "arguments": {"x":1,  "y" : [1,2]}}\n</tool_call>')
    assert got.calls == [ParsedCall("f", '{"x":1,  "y" : [1,2]}')] and got.content == ""


def test_the_template_renders_what_the_parser_reads() -> None:
    """The embedded template's assistant tool turn, parsed back, gives the same calls."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": "a b"}'}}]
    text = render_chat([{"role": "assistant", "content": "ok", "tool_calls": calls}])
    body = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    got = parse(HERMES, body)
    assert got.content == "ok" and got.calls == [ParsedCall("f", '{"q": "a b"}')]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}',  # cut off: no closing tag
        "plain <tool_ text",
    ],
)
def test_malformed_hermes_is_plain_content(text: str) -> None:
    got = parse(HERMES, text)
    assert got.calls == [] and got.content == text


def test_no_markup_is_returned_unchanged() -> None:
    for text in ["", "  42  \n", "a < b and c > d"]:
        assert parse(HERMES, text).content == text


def test_json_parser() -> None:
    p = get_parser("json")
    got = parse(p, '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": {}}')
    assert got.calls == [ParsedCall("f", '{"a": 1}'), ParsedCall("g", "{}")] and got.content == ""
    assert parse(p, '<|python_tag|>[{"name": "f", "parameters": {"a": 1}}]').calls == [ParsedCall("f", '{"a": 1}')]
    for text in ['{"name": 3}', "The answer is 4", '{"a": 1} tail']:
        assert parse(p, text).calls == [] and parse(p, text).content == text


def test_pythonic_parser() -> None:
    p = get_parser("pythonic")
    got = parse(p, '[get_weather(city="Paris", days=2), now()]')
    assert got.calls == [ParsedCall("get_weather", '{"city": "Paris", "days": 2}'), ParsedCall("now", "{}")]
    for text in ["[1, 2]", "[f(1)]", "[f(a=b)]", "[os.system(x='y')]", "[f(a={1, 2})]", "no call"]:
        got = parse(p, text)
        assert got.calls == [] and got.content == text


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_forced_prefill_is_continued_into_a_call(name: str) -> None:
    p = get_parser(name)
    rest = {"hermes": '{"a": 1}}\n</tool_call>', "json": '{"a": 1}}', "pythonic": "a=1)]"}[name]
    got = parse(p, p.prefill("f") + rest)
    assert got.calls == [ParsedCall("f", '{"a": 1}')] and got.content == ""


_pieces = st.lists(
    st.sampled_from(
        [
            "Sure.",
            " ",
            "\n",
            "<tool_call>",
            "\n</tool_call>",
            '{"name": "f", "arguments": {"a": 1}}',
            "<tool",
            "_call>",
            "{bad",
            "</tool_call>",
            "x",
            "<",
            '{"name": "g", "parameters": {}}',
            "[f(a=1)]",
            ";",
        ]
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(pieces=_pieces, cuts=st.lists(st.integers(0, 400), max_size=8), name=st.sampled_from(sorted(PARSERS)))
def test_streaming_equals_one_shot_however_chunked(pieces: list[str], cuts: list[int], name: str) -> None:
    text = "".join(pieces)
    p = get_parser(name)
    whole = parse(p, text)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    s = p.stream()
    out = []
    for a, b in zip(bounds, bounds[1:]):
        out += s.feed(text[a:b])
    out += s.finish()
    assert collect(out) == whole
    for c in whole.calls:  # arguments are always a JSON object
        assert isinstance(json.loads(c.arguments), dict)
    if not whole.calls:  # nothing lost: no calls means the text comes back unchanged
        assert whole.content == text
