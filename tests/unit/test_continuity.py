"""Token continuity on a real tokenizer: exact ids reused, drift counted, rewritten history falls back."""

from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer

from swarm.model.build import build_untrained
from swarm.timeline import Call, continue_prompt, merge


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_untrained(tmp_path_factory.mktemp("m") / "tiny"))


def _render(tok, messages, template=None):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, chat_template=template)


def _enc(tok):
    return lambda s: tok.encode(s, add_special_tokens=False)


def _dec(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def _split_tokens(tok, text):
    """Ids spelling `text` one character at a time: what a sampler may well produce,
    and what a fresh tokenization merges differently."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


def test_multi_turn_drift_counted_and_exact_ids_used(tok):
    msgs = [{"role": "user", "content": "guess a number"}]
    p1 = _enc(tok)(_render(tok, msgs))
    reply = "the answer is"
    c1 = _split_tokens(tok, reply) + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert _split_tokens(tok, reply) != _enc(tok)(reply), "test needs a reply that BPE merges differently"
    msgs2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "higher"}]
    text2 = _render(tok, msgs2)
    out = continue_prompt(text2, [Call("main", p1, c1, [0.0] * len(c1))], _enc(tok), _dec(tok))
    assert out.extended == 0 and out.drift
    assert out.prompt_ids[: len(p1) + len(c1)] == p1 + c1  # the model's own tokens, not a re-tokenization
    assert _dec(tok)(out.prompt_ids) == text2  # and still exactly the rendered conversation
    # retokenize mode: plain ids, drift still reported
    plain = continue_prompt(text2, [Call("main", p1, c1, [0.0] * len(c1))], _enc(tok), _dec(tok), mode="retokenize")
    assert plain.prompt_ids == _enc(tok)(text2) and plain.drift and plain.extended is None
    # and only the exact prompt lets the timeline merge the two turns
    c2 = _enc(tok)("ok")
    exact_calls = [Call("main", p1, c1, [0.0] * len(c1)), Call("main", out.prompt_ids, c2, [0.0] * len(c2))]
    plain_calls = [exact_calls[0], Call("main", plain.prompt_ids, c2, [0.0] * len(c2))]
    assert len(merge(exact_calls)) == 1 and len(merge(plain_calls)) == 2


def test_no_drift_when_tokenization_is_stable(tok):
    msgs = [{"role": "user", "content": "hi"}]
    p1 = _enc(tok)(_render(tok, msgs))
    c1 = _enc(tok)("hello") + [tok.convert_tokens_to_ids("<|im_end|>")]
    text2 = _render(tok, msgs + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}])
    out = continue_prompt(text2, [Call("main", p1, c1, [0.0] * len(c1))], _enc(tok), _dec(tok))
    assert out.extended == 0 and not out.drift and out.prompt_ids == _enc(tok)(text2)


STRIP_THINK = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_that_strips_reasoning_falls_back_to_separate_samples(tok):
    msgs = [{"role": "user", "content": "2+2?"}]
    p1 = _enc(tok)(_render(tok, msgs, STRIP_THINK))
    reply = "<think>two and two</think>4"
    c1 = _enc(tok)(reply) + [tok.convert_tokens_to_ids("<|im_end|>")]
    msgs2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "and 3+3?"}]
    text2 = _render(tok, msgs2, STRIP_THINK)
    assert "two and two" not in text2
    out = continue_prompt(text2, [Call("main", p1, c1, [0.0] * len(c1))], _enc(tok), _dec(tok))
    assert out.extended is None and out.prompt_ids == _enc(tok)(text2)
    c2 = _enc(tok)("6") + [tok.convert_tokens_to_ids("<|im_end|>")]
    calls = [Call("main", p1, c1, [-0.1] * len(c1)), Call("main", out.prompt_ids, c2, [-0.2] * len(c2))]
    segs = merge(calls)
    assert len(segs) == 2  # no token prefix: unmerged, each call its own sample
    for seg, call in zip(segs, calls):
        assert seg.input_ids == call.full
        assert seg.loss_mask == [0] * len(call.prompt_ids) + [1] * len(call.completion_ids)
        assert re.sub(r"\s", "", _dec(tok)(seg.input_ids[len(call.prompt_ids) :])).startswith(
            re.sub(r"\s", "", _dec(tok)(call.completion_ids))[:3]
        )
