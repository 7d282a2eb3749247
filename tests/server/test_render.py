"""Chat rendering, token continuity and incremental detokenizing with stop strings."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarm.samples import Call
from swarm.server.exceptions import InvalidRequest
from swarm.server.render import ChatRenderer, OutputText


@pytest.fixture(scope="module")
def renderer(model_dir: Path) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(model_dir))


def test_render_uses_the_chat_template(renderer: ChatRenderer) -> None:
    text = renderer.render([{"role": "user", "content": "What is 4+5?"}])
    assert text.endswith("<|im_start|>assistant\n")
    ids = renderer.encode(text)
    assert renderer.tok.decode(ids) == text
    assert renderer.stop_token_ids  # <|im_end|> at least


def test_continuation_reuses_generated_ids(renderer: ChatRenderer) -> None:
    first = renderer.render([{"role": "user", "content": "hi"}])
    prompt_ids = renderer.encode(first)
    # ids a tokenizer would never produce for this text: single characters, not merges
    said = "What is"
    completion = [i for t in said for i in renderer.tok.encode(t, add_special_tokens=False)]
    completion.append(renderer.tok.convert_tokens_to_ids("<|im_end|>"))
    call = Call("main", prompt_ids, completion, [-1.0] * len(completion), 0)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "again"},
    ]
    prompt = renderer.chat_prompt(renderer.render(messages), [call], "main")
    assert prompt.continued
    assert prompt.ids[: len(prompt_ids) + len(completion)] == prompt_ids + completion
    assert renderer.tok.decode(prompt.ids) == renderer.render(messages)
    assert prompt.drift  # plain re-tokenization would have merged "What" into fewer ids
    other = renderer.chat_prompt(renderer.render(messages), [call], "critic")  # other agent: no reuse
    assert not other.continued


def test_bad_inputs_are_client_errors(renderer: ChatRenderer) -> None:
    with pytest.raises(InvalidRequest):
        renderer.encode("\ud800")
    with pytest.raises(InvalidRequest):
        renderer.check_ids([0, 10**9])


def _ids(renderer: ChatRenderer, text: str) -> list[int]:
    return renderer.encode(text)


def test_output_text_without_stop_decodes_exactly(renderer: ChatRenderer) -> None:
    ids = _ids(renderer, "hello world, the answer is 42")
    out = OutputText(renderer)
    pieces = []
    for i in range(0, len(ids), 2):
        text, kept, _ = out.add(ids[i : i + 2], [-1.0] * len(ids[i : i + 2]))
        pieces.append(text)
        assert len(kept) == len(ids[i : i + 2])
    pieces.append(out.finish())
    assert "".join(pieces) == renderer.decode(ids) == out.text


def test_output_text_stop_string_cuts_text_and_ids(renderer: ChatRenderer) -> None:
    ids = _ids(renderer, "answer: 42\nSTOP and more text")
    out = OutputText(renderer, stop=("STOP",))
    pieces = []
    for i in range(0, len(ids), 3):
        text, _, _ = out.add(ids[i : i + 3], [-1.0] * len(ids[i : i + 3]))
        pieces.append(text)
    pieces.append(out.finish())
    assert out.stopped
    assert "".join(pieces) == out.text == "answer: 42\n"
    assert "STOP" in renderer.decode(out.ids) and "more" not in renderer.decode(out.ids)
    assert len(out.logprobs) == len(out.ids)


def test_partial_utf8_is_held_back(renderer: ChatRenderer) -> None:
    ids = _ids(renderer, "é€")  # multi-byte characters, split over byte tokens
    out = OutputText(renderer)
    streamed = "".join(out.add([i], [0.0])[0] for i in ids) + out.finish()
    assert streamed == "é€"
