"""What a long prompt may cost: a lower bound on its token count from its bytes alone
(`TokenBound`), and one large tokenization at a time (`LargePromptGate`).

Why: tokenizing is what a huge prompt costs. A 900k-character prompt took seconds and
~300 MB with the embedded tokenizer (nearly a token per character) only to be refused
as longer than the model's context (then 1,024 tokens); four at once took a gigabyte. The bound
costs two byte counts, so a prompt that cannot fit is refused before it is tokenized.

It is exact-safe: it never exceeds the real count, so it never refuses a prompt that fits.
With a byte-level BPE every token covers at most `longest` bytes of the text (a vocabulary
entry is one character per byte; an added token is its content), so a text of B bytes has
at least ceil(B / longest) tokens. A Unicode normalizer (NFC, Qwen2's) may shrink the text
first, by composing marks into their base or, under NFKC, mapping a 4-byte character to
one ASCII byte; an ASCII character is never changed and no character ever shrinks below a
quarter of its bytes, so B is then counted as ASCII characters plus a quarter of the other
bytes (checked for every code point; `tests/unit/test_prompt_bound.py` checks the bound
against the real count). The bound is loose for a large vocabulary (its longest tokens, runs of
spaces or dashes, are tens to hundreds of bytes): it refuses what is far past the context,
and the gate covers the rest.

Where a token may cover unbounded text there is no bound (`TokenBound.of` gives None) and
prompts are tokenized as before: a model that is not a byte-level BPE (an unknown word is
one `[UNK]`), a vocabulary missing a byte (BPE drops it), an added token that strips the
whitespace beside it, a pre-tokenizer that removes text, or any other normalizer.

`LargePromptGate`: what the bound lets through is tokenized, at ~300 bytes a character with the
embedded tokenizer (a 900k-character prompt: ~260 MB for a second or more), and glibc kept what the
render threads freed: four such prompts at once took RSS from 451 MB to 2 GB, and it stayed at
1.77 GB. Through the gate a rendered prompt over `LARGE_PROMPT_CHARS` is tokenized one at a time,
and the heap is trimmed after it (`malloc_trim`), so tokenizing holds at most one large prompt.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from tokenizers.pre_tokenizers import ByteLevel

log = logging.getLogger("swarm.server")
#: normalizers after which no character keeps less than a quarter of its bytes, and ASCII is unchanged
UNICODE_FORMS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
#: pre-tokenizers that keep every byte of the text (a `Split` unless its behavior is `Removed`)
KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Digits"})
#: rendered prompts longer than this are tokenized one at a time (`LargePromptGate`)
LARGE_PROMPT_CHARS = 131_072
T = TypeVar("T")


@dataclass(frozen=True)
class TokenBound:
    """`min_tokens(text)` <= the number of ids the tokenizer gives `text` (no special tokens added)."""

    longest: int  # bytes of text the longest token covers
    normalized: bool  # a Unicode normalization form runs before tokenizing

    @classmethod
    def of(cls, tokenizer: Any) -> TokenBound | None:
        """The bound for a Hugging Face fast tokenizer, or None where no token length bounds the text.

        Reads the live pipeline's parts (transformers may rebuild some of the file's), not the whole
        `to_str()`: a large vocabulary's merges would be tens of MB at start-up for nothing."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        try:
            parts = _parts(backend)
        except (AttributeError, TypeError, ValueError) as exc:  # not the tokenizers library we know
            log.info("no token bound for prompts (%s): every prompt under max_prompt_chars is tokenized", exc)
            return None
        why = _unbounded(parts)
        if why is not None:
            log.info("no token bound for prompts (%s): every prompt under max_prompt_chars is tokenized", why)
            return None
        vocab_longest = max((len(t) for t in parts["vocab"]), default=1)  # a character per byte
        added_longest = max((len(a.content.encode("utf-8")) for a in parts["added"]), default=1)
        return cls(max(vocab_longest, added_longest, 1), parts["normalizer"] is not None)

    def min_tokens(self, text: str) -> int:
        raw = len(text.encode("utf-8", "surrogatepass"))
        if self.normalized and not text.isascii():
            ascii_chars = len(text.encode("ascii", "ignore"))
            # bytes after normalizing >= ascii + (raw - ascii) / 4
            return -(-(3 * ascii_chars + raw) // (4 * self.longest))
        return -(-raw // self.longest)


def _parts(backend: Any) -> dict[str, Any]:
    """What the bound depends on, from a `tokenizers.Tokenizer` (components as their JSON form)."""

    def spec(part: Any) -> dict[str, Any] | None:
        return None if part is None else json.loads(part.__getstate__())

    model = backend.model
    return {
        "model": type(model).__name__,
        "affixes": (getattr(model, "continuing_subword_prefix", None), getattr(model, "end_of_word_suffix", None)),
        "vocab": backend.get_vocab(with_added_tokens=False),
        "pre_tokenizer": spec(backend.pre_tokenizer),
        "normalizer": spec(backend.normalizer),
        "added": list(backend.get_added_tokens_decoder().values()),
    }


def _unbounded(parts: dict[str, Any]) -> str | None:
    """Why a tokenizer (`_parts`) has no byte bound per token; None when it has one."""
    if parts["model"] != "BPE" or any(parts["affixes"]):
        return f"a {parts['model']} model, not a plain BPE"
    if not _keeps_bytes(parts["pre_tokenizer"]):
        return "not a byte-level pre-tokenizer that keeps every byte"
    if not set(ByteLevel.alphabet()) <= parts["vocab"].keys():
        return "the vocabulary lacks a byte"
    if any(a.lstrip or a.rstrip for a in parts["added"]):
        return "an added token strips the whitespace beside it"
    norm = parts["normalizer"]
    if norm is not None and norm.get("type") == "Sequence" and len(norm.get("normalizers") or []) == 1:
        norm = norm["normalizers"][0]
    if norm is not None and norm.get("type") not in UNICODE_FORMS:
        return f"a {norm.get('type')} normalizer"
    return None


def _keeps_bytes(pre: dict[str, Any] | None) -> bool:
    """A pre-tokenizer that ends in ByteLevel (a character per byte) and removes nothing."""
    steps = (pre.get("pretokenizers") or []) if pre is not None and pre.get("type") == "Sequence" else [pre]
    if not steps or any(
        s is None
        or s.get("type") not in KEEPING_PRE_TOKENIZERS
        or (s.get("type") == "Split" and s.get("behavior") == "Removed")
        for s in steps
    ):
        return False
    return steps[-1].get("type") == "ByteLevel"


class LargePromptGate:
    """Runs tokenizing jobs in `pool` one at a time, trimming the heap after each.

    The slot is freed when the job's thread is done, not when its request gives up: a client
    that hangs up mid-tokenizing cannot start another beside it."""

    def __init__(self, pool: Executor) -> None:
        self.pool = pool
        self._slot = asyncio.Semaphore(1)

    async def run(self, work: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        await self._slot.acquire()
        try:
            done = self.pool.submit(_trimmed, work)
        except BaseException:
            self._slot.release()
            raise
        done.add_done_callback(lambda _: _call_soon(loop, self._slot.release))
        return await asyncio.wrap_future(done)


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc; elsewhere nothing to trim this way
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def _trimmed(work: Callable[[], T]) -> T:
    """`work()`, then the freed heap handed back to the system (glibc keeps it in the thread's arena)."""
    try:
        return work()
    finally:
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> None:
    """`fn` on `loop` from another thread; nothing once the loop is closed (the server is gone)."""
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:
        pass


__all__ = ["LARGE_PROMPT_CHARS", "LargePromptGate", "TokenBound"]
