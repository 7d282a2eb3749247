"""Tool-call grammars (`swarm.chat.tool_grammar`) on the real torch engine, through llguidance.

The untrained tiny model says whatever it says; under a forced tool choice every completion must
parse as a valid call of the allowed tools, and under tools + a JSON format as a call or the
schema's JSON. Each constrained completion ends with `<|im_end|>`, the template's end of turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import llguidance
import llguidance.hf
import pytest
from torch_helpers import chat_prompt
from torch_helpers import generate_all as _gen

from swarm.chat.tool_grammar import tool_call_grammar, turn_format
from swarm.chat.tool_parsers import get_parser, parse
from swarm.engine import GenerateRequest, SamplingParams
from swarm.engine.torch_engine import TorchEngine
from swarm.server.render import ChatRenderer
from swarm.testing import tiny_model_dir

ADD = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
NEG = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
    {"type": "function", "function": {"name": "neg", "parameters": NEG}},
]
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
SCHEMAS = {"add": ADD, "neg": NEG}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tool-grammar"))


@pytest.fixture(scope="module")
def engine(model_dir):
    e = TorchEngine(model_dir, seed=0, reference=False)
    yield e
    e.batcher.close()


def _fmt(engine, forced: str | None, prefill: str, response_format: dict | None) -> str:
    markers = ChatRenderer(engine.tokenizer).marker_tokens
    got = turn_format(get_parser("hermes"), TOOLS, forced, prefill, response_format, markers)
    assert got is not None
    return json.dumps(got, sort_keys=True)


def _check_calls(text: str, allowed: set[str], whole: bool = True) -> None:
    """Every call in `text` valid and nothing else; cut at the budget (`whole` False): the complete ones."""
    if not whole:
        text = text[: text.rfind("</tool_call>") + len("</tool_call>")]
    got = parse(get_parser("hermes"), text)
    assert got.calls and not got.content.strip(), text
    for call in got.calls:
        assert call.name in allowed
        jsonschema_rs.validate(SCHEMAS[call.name], json.loads(call.arguments))


@pytest.mark.parametrize("forced", ["", "neg"])
def test_forced_choice_always_gives_a_valid_call(engine, forced: str) -> None:
    parser = get_parser("hermes")
    prefill = parser.prefill(forced or None)
    prompt = chat_prompt(engine, "Call a tool.") + engine.tokenizer.encode(prefill, add_special_tokens=False)
    fmt = _fmt(engine, forced, prefill, None)
    outs = _gen(
        engine, [GenerateRequest(prompt, SamplingParams(max_tokens=160, seed=s, response_format=fmt)) for s in range(6)]
    )
    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for c in outs:  # the untrained model may go on calling: a cut answer's complete calls are checked
        text = engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert c.finish_reason == "length" or c.token_ids[-1] == end, text
        _check_calls(prefill + text, {"add", "neg"} if not forced else {forced}, c.finish_reason == "stop")


def test_tools_and_a_format_give_a_call_or_the_answer(engine) -> None:
    fmt = _fmt(engine, None, "", {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}})
    prompt = chat_prompt(engine, "Answer or call.")
    outs = _gen(
        engine, [GenerateRequest(prompt, SamplingParams(max_tokens=160, seed=s, response_format=fmt)) for s in range(8)]
    )
    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for c in outs:
        text = engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert c.finish_reason == "length" or c.token_ids[-1] == end, text
        if text.startswith("{"):
            assert c.finish_reason == "stop"
            jsonschema_rs.validate(ANSWER, json.loads(text))
        else:
            _check_calls(text, {"add", "neg"}, c.finish_reason == "stop")


def test_json_object_format_ends_with_the_end_of_turn_token(engine) -> None:
    prompt = chat_prompt(engine, "Reply in JSON.")
    fmt = json.dumps({"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}})
    (c,) = _gen(engine, [GenerateRequest(prompt, SamplingParams(max_tokens=40, seed=1, response_format=fmt))])
    assert c.token_ids[-1] == engine.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_grammar_shapes(model_dir) -> None:
    """Pure: the json format's skeleton, no grammar for pythonic, a prefill must start the calls."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    calls_only = tool_call_grammar(get_parser("json"), TOOLS)
    with_answer = tool_call_grammar(get_parser("json"), TOOLS, answer=ANSWER)  # one JSON schema: compact calls
    assert calls_only is not None and with_answer is not None
    for grammar, text, ok in (
        (calls_only, '{"name": "add", "parameters": {"a":1,"b":2}}', True),
        (calls_only, '{"name": "add", "parameters": {"a":1,"b":2}}; {"name": "neg", "parameters": {"x":true}}', True),
        (calls_only, '{"ok":true}', False),
        (with_answer, '{"name":"add","parameters":{"a":1,"b":2}}', True),
        (with_answer, '{"ok":true}', True),
        (with_answer, '{"name":"add","parameters":{"a":1}}', False),
        (with_answer, "hello", False),
    ):
        m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        consumed = m.consume_tokens(tok.encode(text, add_special_tokens=False))
        assert (consumed and m.is_accepting()) == ok, text
    assert tool_call_grammar(get_parser("pythonic"), TOOLS) is None
    assert turn_format(get_parser("hermes"), TOOLS, None, "", None) is None  # auto without a format: free
    with pytest.raises(ValueError):
        tool_call_grammar(get_parser("hermes"), TOOLS, prefill="nope")
