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


def _accepts(tok, lt, grammar: str, ids: list[int]) -> bool:
    m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    return bool(m.consume_tokens(ids)) and m.is_accepting()


def test_parallel_tool_calls_false_admits_one_call(model_dir) -> None:
    """Pure: `parallel=False` (parallel_tool_calls false) drops the grammar's repetition: one call, then
    the end of turn; the default still admits several. Forced (prefilled), with an answer, and json."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    markers = ChatRenderer(tok).marker_tokens
    end = [tok.convert_tokens_to_ids("<|im_end|>")]
    hermes = get_parser("hermes")
    one = '<tool_call>\n{"name": "add", "arguments": {"a":1,"b":2}}\n</tool_call>'
    two = one + '\n<tool_call>\n{"name": "neg", "arguments": {"x":true}}\n</tool_call>'
    answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    prefill = hermes.prefill(None)
    for forced, pre, fmt in (("", prefill, None), (None, "", answer)):
        many = turn_format(hermes, TOOLS, forced, pre, fmt, markers)
        single = turn_format(hermes, TOOLS, forced, pre, fmt, markers, parallel=False)
        assert many is not None and single is not None
        for text, ok_many, ok_single in ((one, True, True), (two, True, False)):
            ids = tok.encode(text[len(pre) :], add_special_tokens=False) + end
            assert _accepts(tok, lt, many["grammar"], ids) == ok_many, (forced, text)
            assert _accepts(tok, lt, single["grammar"], ids) == ok_single, (forced, text)
        if fmt is not None:  # the answer stays admitted
            assert _accepts(tok, lt, single["grammar"], tok.encode('{"ok":true}', add_special_tokens=False) + end)
    json_single = tool_call_grammar(get_parser("json"), TOOLS, parallel=False)
    assert json_single is not None
    pair = '{"name": "add", "parameters": {"a":1,"b":2}}; {"name": "neg", "parameters": {"x":true}}'
    assert not _accepts(tok, lt, json_single, tok.encode(pair, add_special_tokens=False))
    assert _accepts(tok, lt, json_single, tok.encode(pair.split("; ")[0], add_special_tokens=False))


def test_answer_grammar_ends_with_the_end_of_turn_token(model_dir) -> None:
    """Pure: the vllm engine's grammar for a plain JSON format (`answer_grammar`): the schema's compact
    JSON, then `<|im_end|>` and nothing else (not `<|endoftext|>`, a base tokenizer's EOS)."""
    from transformers import AutoTokenizer

    from swarm.chat.tool_grammar import END_OF_TURN, answer_grammar

    tok = AutoTokenizer.from_pretrained(model_dir)
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok), eos_token=tok.convert_tokens_to_ids("<|endoftext|>"))
    end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    grammar = answer_grammar(ANSWER, {END_OF_TURN: end})
    assert grammar.startswith(f"start: body <[{end}]>\n")
    body = tok.encode('{"ok":true}', add_special_tokens=False)
    assert _accepts(tok, lt, grammar, body + [end])
    assert not _accepts(tok, lt, grammar, body)  # the JSON alone does not end the turn
    m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert m.consume_tokens(body)
    assert not m.consume_token(eot)  # the base tokenizer's EOS is refused where the turn must end
    assert not _accepts(tok, lt, grammar, tok.encode('{"ok": true}', add_special_tokens=False) + [end])  # compact
    assert answer_grammar(ANSWER, None).startswith("start: body\n")  # no end token known: vLLM's own EOS
