"""The token lower bound that refuses an impossible prompt before tokenizing it (`swarm.server.prompt_bound`).

It must never refuse a prompt that would fit: a property test over random texts compares it to
the real token count of the embedded model's tokenizer. And a prompt it refuses must never reach
the tokenizer at all (that is what costs seconds and hundreds of MB).
"""

from __future__ import annotations

import asyncio
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from swarm.engine.fake import FakeEngine
from swarm.model.tokenizer import CONTEXT_LENGTH
from swarm.samples import Call
from swarm.server.counters import Counters
from swarm.server.exceptions import InvalidRequest
from swarm.server.generation import ChatTurn, GenerationCore, Sampling
from swarm.server.generation_context import GenerationContext, GenerationLimits, context_length
from swarm.server.prompt_bound import LARGE_PROMPT_CHARS, TokenBound
from swarm.server.render import ChatRenderer
from swarm.server.trainer import GenerationGate
from swarm.testing import tiny_model_dir

CONTEXT = CONTEXT_LENGTH  # the embedded model's (4,096 since build 6)
LIMITS = GenerationLimits(
    max_prompt_chars=1_000_000,
    max_tokens_limit=64,
    default_max_tokens=16,
    default_temperature=1.0,
    temperature=None,
    generate_timeout_s=None,
    tool_parser="hermes",
    continuity="exact",
)
SENTENCE = "The quick brown fox, 12 jumps over the lazy dog; naïve café ünïcode 東京. "
#: what makes a bound wrong if anything does: the longest tokens (special, added, vocab), and text that a
#: Unicode normalizer shrinks (combining marks, Hangul jamo, compatibility forms) or that decodes oddly
PIECES = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "description",
    " description",
    "parameters",
    " integers",
    "properties",
    "e\u0301",
    "u\u0308\u0304",
    "e\u0302\u0323",
    "\u03b1\u0313\u0301\u0345",
    "\u1100\u1161\u11a8",
    "\u0958",
    "\u2126",
    "\u212a",
    "\uff21",
    "\U0001d400",
    "\ufb01",
    "\u3392",
    "\ufdfa",
    "\ufffd",
    "\u0301",
    "\u0338",
    "<\u0338",
    "東京",
    "😀",
    "\r\n",
    "\n\n",
    "    ",
    "\t",
    "12345",
    "'s",
    "'ll",
]
TEXTS = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(st.characters(codec="utf-8"), max_size=12)), max_size=60
).map("".join)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("bound"))


@pytest.fixture(scope="module")
def renderer(model_dir: Path) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(model_dir))


def test_the_embedded_tokenizer_has_a_bound(renderer: ChatRenderer) -> None:
    bound = renderer.bound
    assert bound is not None and bound.normalized  # Qwen2's NFC normalizer
    assert bound.longest == len("</tool_response>")  # the longest of its tokens, in bytes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
def test_the_bound_never_exceeds_the_real_token_count(renderer: ChatRenderer, text: str) -> None:
    assert renderer.bound is not None
    real = len(renderer.encode(text))
    assert renderer.bound.min_tokens(text) <= real
    assert renderer.bound.min_tokens(text) <= len(renderer.tok.encode(text, add_special_tokens=False))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=400).map("".join))
def test_the_bound_never_exceeds_the_count_of_long_texts(renderer: ChatRenderer, text: str) -> None:
    """Past `DIRECT_ENCODE_CHARS` the renderer tokenizes through `encode_batch_fast`: the same ids."""
    text = text * (17_000 // len(text) + 1)
    ids = renderer.encode(text)
    assert ids == renderer.tok.encode(text, add_special_tokens=False)
    assert renderer.bound is not None and renderer.bound.min_tokens(text) <= len(ids)


def test_the_bound_is_tight_on_the_longest_tokens(renderer: ChatRenderer) -> None:
    assert renderer.bound is not None
    text = "</tool_response>" * 900
    assert renderer.bound.min_tokens(text) == 900 == len(renderer.encode(text))


def test_no_character_shrinks_below_the_floor() -> None:
    """The normalized floor: ASCII kept, no character (alone, or recomposed from its decomposition) under a
    quarter of its bytes, for every assigned code point and every Unicode form."""

    def floor4(s: str) -> int:  # 4x (ascii + other bytes / 4)
        return 3 * len(s.encode("ascii", "ignore")) + len(s.encode())

    bad = []
    for cp in range(0x80, 0x110000):
        c = chr(cp)
        if 0xD800 <= cp < 0xE000 or unicodedata.category(c) == "Cn":
            continue
        for dec, comp in (("NFD", "NFC"), ("NFKD", "NFKC")):
            d = unicodedata.normalize(dec, c)
            if min(len(d.encode()), len(unicodedata.normalize(comp, c).encode())) * 4 < floor4(c) or len(
                unicodedata.normalize(comp, d).encode()
            ) * 4 < floor4(d):
                bad.append((hex(cp), dec))
    assert bad == []


def test_the_issue_prompt_is_far_past_the_context(renderer: ChatRenderer) -> None:
    assert renderer.bound is not None
    text = (SENTENCE * 20_000)[:900_000]
    assert renderer.bound.min_tokens(text) > 10 * CONTEXT


def _fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _byte_bpe(vocab: dict[str, int] | None = None) -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab or {c: i for i, c in enumerate(sorted(alphabet))}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def test_a_plain_byte_level_bpe_counts_raw_bytes() -> None:
    bound = TokenBound.of(_fast(_byte_bpe()))
    assert bound is not None and bound.longest == 1 and not bound.normalized
    assert bound.min_tokens("naïve 東京") == len("naïve 東京".encode())


@pytest.mark.parametrize("why", ["wordpiece", "lstrip", "missing byte", "lowercase", "removed split"])
def test_tokenizers_it_cannot_bound_get_none(why: str) -> None:
    """Where a token may cover unbounded text (an unknown word, stripped whitespace, a dropped byte, a
    normalizer or pre-tokenizer that deletes), no estimate: such prompts are always tokenized."""
    if why == "wordpiece":
        tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        fast = _fast(tok)
    elif why == "missing byte":
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[1:]
        fast = _fast(_byte_bpe({c: i for i, c in enumerate(alphabet)}))
    else:
        tok = _byte_bpe()
        if why == "lowercase":
            tok.normalizer = normalizers.Lowercase()
        elif why == "removed split":
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(" ", behavior="removed"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
            )
        fast = _fast(tok)
        if why == "lstrip":
            from tokenizers import AddedToken  # lazy: only this case adds one

            fast.add_tokens([AddedToken("<x>", lstrip=True)])
    assert TokenBound.of(fast) is None
    assert ChatRenderer(fast).past_context("x" * 100_000, [], "main", 10) is None


def test_a_continued_prompt_is_bounded_by_its_prior_ids(
    renderer: ChatRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Continuity reuses a prior call's exact ids: the bound then counts those ids, never their text."""
    first = renderer.render([{"role": "user", "content": "hi " * 40}])
    prior = Call("main", renderer.encode(first), renderer.encode("hello<|im_end|>"), [0.0] * 4)
    text = renderer.render(
        [
            {"role": "user", "content": "hi " * 40},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "<|endoftext|>" * 50},
        ]
    )
    prefix = renderer.tok.decode(prior.prompt_ids + prior.completion_ids, skip_special_tokens=False)
    assert text.startswith(prefix)
    got = renderer.chat_prompt(text, [prior], "main")
    assert got.continued and renderer.past_context(text, [prior], "main", len(got.ids) + 1) is None  # it fits
    # a bound of a byte per token: the text's count is its bytes, the continued prompt's far less
    monkeypatch.setattr(renderer, "bound", TokenBound(longest=1, normalized=False))
    plain = len(text.encode())
    continued = len(prior.prompt_ids) + len(prior.completion_ids) + len(text[len(prefix) :].encode())
    assert continued < plain
    assert renderer.past_context(text, [prior], "main", continued) == continued
    assert renderer.past_context(text, [prior], "main", continued + 1) is None  # may fit: extends the prior
    assert renderer.past_context(text, [prior], "main", continued + 1, mode="retokenize") == plain
    assert renderer.past_context(text, [prior], "other", continued + 1) == plain  # another agent's calls


@pytest.fixture
def core(model_dir: Path) -> Iterator[GenerationCore]:
    engine = FakeEngine(model_dir, seed=0, script=lambda ids: "ok")
    assert context_length(engine, model_dir) == CONTEXT  # what the server reads: the model's config
    ctx = GenerationContext(
        engine,
        GenerationGate(),
        ChatRenderer(engine.tokenizer),
        limits=lambda: LIMITS,
        counters=Counters(),
        context_length=context_length(engine, model_dir),
    )
    made = GenerationCore(ctx)
    yield made
    made.pool.shutdown()


def test_an_impossible_prompt_is_refused_without_tokenizing(
    core: GenerationCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("tokenized a prompt the bound refuses")

    renderer = core.ctx.renderer
    monkeypatch.setattr(renderer, "encode", never)
    monkeypatch.setattr(renderer, "_rust_encode", never)
    monkeypatch.setattr(renderer, "_rust_encode_long", never)
    monkeypatch.setattr(renderer.tok, "encode", never)
    text = (SENTENCE * 20_000)[:900_000]

    async def chat() -> Any:
        return await core.prepare_chat(ChatTurn(messages=[{"role": "user", "content": text}]))

    async def raw() -> Any:
        return await core.prepare_text(text, Sampling())

    for go in (chat, raw):
        with pytest.raises(InvalidRequest) as err:
            asyncio.run(go())
        assert err.value.code == "context_length_exceeded"
        assert f"the model's {CONTEXT}-token context" in err.value.message


def test_a_prompt_long_in_characters_that_fits_is_served(core: GenerationCore) -> None:
    """Near the tightest the bound gets (every token nearly its longest): still no false refusal."""
    content = "</tool_response>" * (CONTEXT - 24)  # a token each; with the template ~10 short of the context

    async def go() -> Any:
        prepared = await core.prepare_chat(
            ChatTurn(messages=[{"role": "user", "content": content}], sampling=Sampling(max_tokens=4))
        )
        return prepared, await prepared.run()

    prepared, result = asyncio.run(go())
    assert CONTEXT - 30 < len(prepared.prompt_ids) < CONTEXT - 4 and result.choices[0].ids
    digits = content + "1" * 30  # one token per digit: past the context, though the bound is not
    assert core.ctx.renderer.past_context(digits, [], "main", CONTEXT) is None
    with pytest.raises(InvalidRequest) as err:  # refused by its real count, as before
        asyncio.run(core.prepare_chat(ChatTurn(messages=[{"role": "user", "content": digits}])))
    assert err.value.code == "context_length_exceeded"


def test_large_prompts_without_a_bound_are_tokenized_one_at_a_time(
    core: GenerationCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no bound refuses a long prompt, its tokenizing (hundreds of MB) is one at a time, and a
    request that gives up frees the slot only once its thread is done."""
    renderer = core.ctx.renderer
    monkeypatch.setattr(renderer, "bound", None)
    running, most = [0], [0]

    def encode(text: str) -> list[int]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        time.sleep(0.1)
        running[0] -= 1
        return [5] * (CONTEXT + 1)

    monkeypatch.setattr(renderer, "encode", encode)
    big = "x" * (LARGE_PROMPT_CHARS + 1)

    async def one() -> str:
        try:
            await core.prepare_text(big, Sampling())
        except InvalidRequest as exc:
            return exc.code
        return "served"

    async def go() -> list[Any]:
        quitter = asyncio.create_task(one())
        await asyncio.sleep(0.03)  # tokenizing in its thread
        quitter.cancel()
        return await asyncio.gather(*(one() for _ in range(3)))

    assert asyncio.run(go()) == ["context_length_exceeded"] * 3  # by the real count, as before
    assert most[0] == 1
