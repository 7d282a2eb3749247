"""`response_format` (constrained decoding) and `top_logprobs` in the torch and fake engines.

The torch engine runs the untrained tiny model: whatever it would say, under `json_schema` it
says JSON that validates, under `json_object` an object (or, out of budget, a valid prefix).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema_rs
import llguidance
import pytest
import torch
from torch_helpers import chat_prompt
from torch_helpers import generate_all as _gen

from swarm.engine import GenerateRequest, SamplingParams
from swarm.engine.base import Completion, UnsupportedRequest
from swarm.engine.constrained import JSON_OPTIONS, Grammars, json_schema_of, unpack_bitmask
from swarm.engine.fake import FakeEngine, token_logprob
from swarm.engine.torch_engine import TorchEngine
from swarm.testing import tiny_model_dir

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["add", "mul"]},
        "xs": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
    },
    "required": ["name", "n", "ok", "tag", "xs"],
    "additionalProperties": False,
}


def fmt(obj: dict) -> str:
    return json.dumps(obj, sort_keys=True)


JSON_SCHEMA = fmt({"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}})
JSON_OBJECT = fmt({"type": "json_object"})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("constrained"))


@pytest.fixture(scope="module")
def engine(model_dir):
    e = TorchEngine(model_dir, seed=0, reference=False)
    yield e
    e.batcher.close()


def _prompt(engine, text: str = "Reply in JSON.") -> list[int]:
    return chat_prompt(engine, text)


def _text(engine, c: Completion) -> str:
    return engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)


# -- torch engine: response_format -------------------------------------------------


def test_json_schema_output_validates_for_every_seed(engine):
    reqs = [
        GenerateRequest(_prompt(engine), SamplingParams(max_tokens=120, seed=s, response_format=JSON_SCHEMA))
        for s in range(8)
    ]
    # unconstrained rows share the batch: only the constrained ones are masked
    free = [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=20, seed=100 + s)) for s in range(3)]
    outs = _gen(engine, reqs + free)
    for c in outs[:8]:
        assert c.finish_reason == "stop", _text(engine, c)
        assert c.token_ids[-1] in engine.batcher.eos_ids  # the model's own EOS, allowed once the object closed
        jsonschema_rs.validate(SCHEMA, json.loads(_text(engine, c)))
    assert len({_text(engine, c) for c in outs[:8]}) > 1  # seeds differ: sampled, not forced


def test_json_schema_greedy_and_low_temperature(engine):
    for params in (
        SamplingParams(max_tokens=120, temperature=0.0, response_format=JSON_SCHEMA),
        SamplingParams(max_tokens=120, temperature=0.5, top_p=0.9, seed=3, response_format=JSON_SCHEMA),
    ):
        c = _gen(engine, [GenerateRequest(_prompt(engine), params)])[0]
        assert c.finish_reason == "stop"
        jsonschema_rs.validate(SCHEMA, json.loads(_text(engine, c)))


def test_json_object_is_an_object_or_a_valid_prefix(engine):
    outs = _gen(
        engine,
        [
            GenerateRequest(_prompt(engine), SamplingParams(max_tokens=160, seed=s, response_format=JSON_OBJECT))
            for s in range(6)
        ],
    )
    grammars = engine.batcher.grammars
    assert any(c.finish_reason == "stop" for c in outs)
    for c in outs:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(_text(engine, c)), dict)
        else:  # out of budget: what there is is still on the grammar's path (documented behaviour)
            assert c.finish_reason == "length" and len(c.token_ids) == 160
            m = grammars.matcher(JSON_OBJECT)
            assert m.consume_tokens(c.token_ids) and not m.is_error()


def test_recorded_logprobs_are_raw_unmasked(engine):
    c = _gen(
        engine, [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=120, seed=1, response_format=JSON_SCHEMA))]
    )[0]
    recomputed = engine.logprobs(c.prompt_ids + c.token_ids)[len(c.prompt_ids) - 1 :]
    assert max(abs(a - b) for a, b in zip(recomputed, c.logprobs)) < 1e-4  # what the trainer recomputes
    # forced tokens ('{', '"name": ') are certain under the mask, far from it under the raw model
    assert min(c.logprobs) < -1.0


@pytest.mark.parametrize(
    "bad, code",
    [
        (
            fmt({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}),
            "invalid_json_schema",
        ),
        (
            fmt({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "("}}}),
            "invalid_json_schema",
        ),
        (fmt({"type": "yaml"}), "invalid_response_format"),
    ],
)
def test_invalid_format_refused_before_generating(engine, bad, code):
    tokens = engine.batcher.tokens_out
    with pytest.raises(UnsupportedRequest) as err:
        _gen(engine, [GenerateRequest(_prompt(engine), SamplingParams(max_tokens=8, response_format=bad))])
    assert err.value.code == code and err.value.message
    assert engine.batcher.tokens_out == tokens


def test_text_format_is_unconstrained(engine):
    p = SamplingParams(max_tokens=12, seed=7, ignore_eos=True)
    a = _gen(engine, [GenerateRequest(_prompt(engine), p)])[0]
    b = _gen(
        engine,
        [
            GenerateRequest(
                _prompt(engine),
                SamplingParams(max_tokens=12, seed=7, ignore_eos=True, response_format=fmt({"type": "text"})),
            )
        ],
    )[0]
    assert a.token_ids == b.token_ids


# -- torch engine: top_logprobs ----------------------------------------------------


def test_top_logprobs_shape_order_and_consistency(engine):
    k = 5
    # Three sampled requests and one greedy: the untrained model is nearly flat, so a sampled token
    # is seldom among the top 5, but a greedy one always is (and is the first of them).
    temps = [1.0, 1.0, 1.0, 0.0]
    outs = _gen(
        engine,
        [
            GenerateRequest(
                _prompt(engine, f"q{i}"), SamplingParams(max_tokens=16, seed=i, top_logprobs=k, temperature=t)
            )
            for i, t in enumerate(temps)
        ],
    )
    hits = 0
    for c, t in zip(outs, temps):
        if t == 0.0:
            assert all(tok == top[0][0] for tok, top in zip(c.token_ids, c.top_logprobs or []))
        assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.token_ids)
        for tok, lp, top in zip(c.token_ids, c.logprobs, c.top_logprobs):
            assert len(top) == k and len({t for t, _ in top}) == k
            values = [v for _, v in top]
            assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
            assert values[0] >= lp - 1e-6
            if tok in dict(top):
                hits += 1
                assert dict(top)[tok] == lp  # the same raw log-softmax, bit for bit
    assert hits >= len(outs[-1].token_ids)  # every greedy token, at least


def test_top_logprobs_zero_is_none_and_changes_no_token(engine):
    base = SamplingParams(max_tokens=16, seed=11, ignore_eos=True)
    plain, with_top = _gen(
        engine,
        [
            GenerateRequest(_prompt(engine), base),
            GenerateRequest(_prompt(engine), SamplingParams(max_tokens=16, seed=11, ignore_eos=True, top_logprobs=3)),
        ],
    )
    assert plain.top_logprobs is None
    assert plain.token_ids == with_top.token_ids and plain.logprobs == with_top.logprobs
    assert with_top.top_logprobs is not None and all(len(t) == 3 for t in with_top.top_logprobs)


def test_top_logprobs_under_a_constraint_are_raw(engine):
    prompt = _prompt(engine)
    c = _gen(
        engine,
        [GenerateRequest(prompt, SamplingParams(max_tokens=120, seed=2, top_logprobs=3, response_format=JSON_SCHEMA))],
    )[0]
    assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.token_ids)
    with torch.inference_mode():
        raw = torch.log_softmax(engine.model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
    values, ids = raw.topk(3)
    assert [t for t, _ in c.top_logprobs[0]] == ids.tolist()  # the model's favourites, grammar or not
    assert max(abs(a - b) for (_, a), b in zip(c.top_logprobs[0], values.tolist())) < 1e-4


# -- the library pieces ----------------------------------------------------------------


def test_json_schema_of_formats():
    assert json_schema_of(fmt({"type": "text"})) is None
    assert json_schema_of(JSON_OBJECT) == {"type": "object"}
    assert json_schema_of(JSON_SCHEMA) == SCHEMA
    with pytest.raises(UnsupportedRequest):
        json_schema_of(fmt({"type": "json_schema"}))


def test_unpack_bitmask_matches_llguidance_bit_order():
    words = torch.tensor([[0b101, -1]], dtype=torch.int32)  # tokens 0 and 2; then 32..63 (sign bit = 63)
    allowed = unpack_bitmask(words, 64)[0]
    assert allowed[:3].tolist() == [True, False, True] and allowed[3:32].sum() == 0 and bool(allowed[32:].all())


def test_grammar_cache_gives_independent_matchers(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    g = Grammars(tok, len(tok), [tok.eos_token_id])
    a, b = g.matcher(JSON_OBJECT), g.matcher(JSON_OBJECT)
    assert a.consume_tokens(tok.encode('{"k":1', add_special_tokens=False))
    assert not b.is_accepting() and not a.is_accepting()
    assert llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)


# -- fake engine -----------------------------------------------------------------------


def test_fake_engine_top_logprobs_consistent(model_dir):
    e = FakeEngine(model_dir, seed=0)
    c = asyncio.run(e.generate(GenerateRequest([1, 2, 3], SamplingParams(max_tokens=12, seed=1, top_logprobs=4))))
    assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.token_ids)
    for tok, lp, top in zip(c.token_ids, c.logprobs, c.top_logprobs):
        assert lp == token_logprob(tok) and dict(top)[tok] == lp and len(top) == 4
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True) and values[0] >= lp
    none = asyncio.run(e.generate(GenerateRequest([1, 2, 3], SamplingParams(max_tokens=4, seed=1))))
    assert none.top_logprobs is None


def test_fake_engine_response_format(model_dir):
    e = FakeEngine(model_dir, seed=0)
    for s in range(5):
        c = asyncio.run(
            e.generate(GenerateRequest([1, 2, 3], SamplingParams(max_tokens=200, seed=s, response_format=JSON_SCHEMA)))
        )
        assert c.finish_reason == "stop"
        jsonschema_rs.validate(SCHEMA, json.loads(e.tokenizer.decode(c.token_ids, skip_special_tokens=True)))
    scripted = FakeEngine(model_dir, script=lambda ids: '{"answer": 42}')
    c = asyncio.run(scripted.generate(GenerateRequest([1], SamplingParams(response_format=JSON_OBJECT))))
    assert json.loads(scripted.tokenizer.decode(c.token_ids, skip_special_tokens=True)) == {"answer": 42}
    with pytest.raises(UnsupportedRequest) as err:
        asyncio.run(
            e.generate(
                GenerateRequest(
                    [1],
                    SamplingParams(
                        response_format=fmt(
                            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}
                        )
                    ),
                )
            )
        )
    assert err.value.code == "invalid_json_schema"
