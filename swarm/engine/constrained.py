"""Constrained decoding for OpenAI's `response_format`, with llguidance over the logits.

`json_object` means any JSON object, `json_schema` that schema (`{"type": "text"}` or None:
unconstrained). A request's format is compiled once into an llguidance grammar (cached per format
text, so a fleet asking the same schema compiles it once) and every constrained request gets its
own `LLMatcher`, a copy of the cached one. Per decode step the engine asks each constrained row's
matcher for the set of tokens the grammar allows next (a bitmask, `fill_masks`), masks the rest
before sampling, and feeds the sampled token back (`LLMatcher.consume_token`). EOS is in the mask
only where the grammar accepts, so a constrained completion that stops is valid JSON; one that runs
out of `max_tokens` first is a valid *prefix* with `finish_reason: "length"` (as OpenAI's).

Why llguidance (docs/constrained-decoding.md): a Rust wheel with no compile step and no torch
dependency, masks in tens of microseconds for a 150k vocabulary, no per-schema precompilation
(a schema's first request pays well under a millisecond here), full JSON-schema support with precise
error messages for what it refuses, and it is what vLLM's `guidance` backend runs, so the torch and
vllm engines constrain the same way (`swarm.engine.vllm.server` selects it).

JSON is generated compact (`{"a":1,"b":[2,3]}`: no free whitespace): free whitespace lets a small
or untrained model loop on spaces and newlines until the budget runs out. These are the options of
vLLM's guidance backend with `disable_any_whitespace`, which the vllm engine sets, so both engines
apply the very same grammar.

Besides OpenAI's formats, the core may ask for `{"type": "grammar", "grammar": LARK}`: an llguidance
Lark grammar (`swarm.chat.tool_grammar`: a well-formed tool call, or the answer's schema). vLLM gets
the same text as its structured outputs' `grammar`.

A constrained completion ends with the chat template's end-of-turn token (`<|im_end|>` where the
tokenizer has it, else the first EOS given): that is the one EOS the grammar admits, so the trained
sample ends as the template renders the turn and the next turn continues it exactly.

Rows nobody constrains never touch this module: the batcher only calls in when a row has a matcher.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import llguidance
import llguidance.hf
import torch

from swarm.engine.base import UnsupportedRequest

#: generated JSON has no free whitespace (llguidance's compact separators; vLLM's disable_any_whitespace)
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
CACHE_SIZE = 128  # compiled formats kept; a fleet usually asks one or two
END_OF_TURN = "<|im_end|>"


def _format(response_format: str) -> dict[str, Any]:
    try:
        fmt = json.loads(response_format)
    except json.JSONDecodeError as exc:
        raise UnsupportedRequest("invalid_response_format", f"response_format is not JSON: {exc}") from None
    if not isinstance(fmt, dict):
        raise UnsupportedRequest("invalid_response_format", "response_format must be an object")
    return fmt


def grammar_of(response_format: str) -> str | None:
    """The Lark grammar of a canonical `{"type": "grammar", "grammar": ...}` format (else None)."""
    fmt = _format(response_format)
    if fmt.get("type") != "grammar":
        return None
    grammar = fmt.get("grammar")
    if not isinstance(grammar, str) or not grammar:
        raise UnsupportedRequest("invalid_response_format", "a grammar format needs its grammar text")
    return grammar


def json_schema_of(response_format: str) -> dict[str, Any] | None:
    """The JSON schema a canonical `response_format` text asks for (None: unconstrained).

    Raises `UnsupportedRequest` (code `invalid_response_format`) for a format that is not one of
    OpenAI's `text`, `json_object`, `json_schema` (or the core's `grammar`, whose schema is None here).
    """
    fmt = _format(response_format)
    kind = fmt.get("type")
    if kind in (None, "text", "grammar"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise UnsupportedRequest(
                "invalid_response_format", "response_format json_schema needs a json_schema object"
            )
        schema = spec.get("schema", {})  # OpenAI: optional; absent means any JSON value
        if not isinstance(schema, (dict, bool)):
            raise UnsupportedRequest("invalid_json_schema", "response_format.json_schema.schema must be an object")
        return schema if isinstance(schema, dict) else ({} if schema else {"not": {}})
    raise UnsupportedRequest(
        "invalid_response_format", f"response_format.type {kind!r} is not one of text, json_object, json_schema"
    )


class Grammars:
    """Compiles `response_format`s into llguidance matchers for one tokenizer (thread-safe).

    `vocab_size` is the model's logits width (it can exceed the tokenizer's: those ids are never
    allowed); `eos_ids` are the tokens that may end a completion once the grammar accepts.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]) -> None:
        self._hf = tokenizer
        self.width = int(vocab_size)  # the logits' width: masks have this many columns
        self.vocab_size = max(self.width, len(tokenizer))  # llguidance's: every id the tokenizer knows
        self.eos_ids = sorted(set(int(i) for i in eos_ids))
        end = tokenizer.convert_tokens_to_ids(END_OF_TURN) if hasattr(tokenizer, "convert_tokens_to_ids") else None
        #: the one EOS a grammar admits: the template's end of turn where it is among `eos_ids`
        self.end_ids = [end] if isinstance(end, int) and end in self.eos_ids else self.eos_ids[:1]
        self._tok: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: llguidance.LLExecutor | None = None
        self._bitmask = torch.empty(0, (self.vocab_size + 31) // 32, dtype=torch.int32)  # reused, grown on demand

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built on first use (tens of ms; about 1 s for 150k tokens)."""
        with self._lock:
            if self._tok is None:
                self._tok = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self.vocab_size, eos_token=self.end_ids or None
                )
            return self._tok

    def matcher(self, response_format: str) -> llguidance.LLMatcher | None:
        """A fresh matcher for this format (None: unconstrained). `UnsupportedRequest` with
        llguidance's own message for a schema it cannot compile (invalid, or a keyword it does not
        implement): the caller answers 400 before generating anything."""
        with self._lock:
            template = self._cache.get(response_format)
            if template is not None:
                self._cache.move_to_end(response_format)
                return template.deep_copy()
        lark = grammar_of(response_format)
        schema = json_schema_of(response_format) if lark is None else None
        if lark is None and schema is None:
            return None
        try:
            if lark is not None:
                grammar = llguidance.LLMatcher.grammar_from_lark(lark)
            else:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise UnsupportedRequest("invalid_json_schema", f"json_schema: {exc}") from None
        template = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise UnsupportedRequest("invalid_json_schema", f"json_schema: {template.get_error()}")
        with self._lock:
            self._cache[response_format] = template
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return template.deep_copy()

    def fill_masks(self, matchers: Sequence[llguidance.LLMatcher]) -> torch.Tensor:
        """[n, vocab] bool: True where the grammar allows the token next, one row per matcher.

        One caller at a time (it reuses one bitmask buffer): the batcher's worker thread.

        A matcher in an error state (it consumed a token its mask forbade: cannot happen here) or
        stopped (the grammar is complete) allows only EOS, so its row ends at once.
        """
        n = len(matchers)
        if self._bitmask.shape[0] < n:  # one buffer for every step (the batcher's worker is its only user)
            self._bitmask = torch.empty(max(n, 2 * self._bitmask.shape[0]), self._bitmask.shape[1], dtype=torch.int32)
        bitmask = self._bitmask[:n]  # llguidance writes every word of each row (contiguous: whole rows)
        # What llguidance.torch's fill_next_token_bitmask(_par) do, called directly: importing that module
        # costs ~0.8 s of every server's start (its torch.compile decorators import dynamo and inductor)
        words = bitmask.shape[1]
        if n == 1:
            matchers[0].unsafe_compute_mask_ptr(bitmask.data_ptr(), words * 4)
        else:
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            self._executor.unsafe_compute_mask_ptr(
                [(m, i) for i, m in enumerate(matchers)], bitmask.data_ptr(), words * 4, n
            )
        return unpack_bitmask(bitmask, self.width)


_SHIFTS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's packed int32 words (bit j of word i = token 32 i + j) as [n, vocab] bool.

    Plain tensor ops instead of `llguidance.torch.apply_token_bitmask_inplace`, whose kernel is
    `torch.compile`d: on a CPU that needs a C++ toolchain and seconds of compilation on first use.
    """
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


__all__ = ["END_OF_TURN", "Grammars", "JSON_OPTIONS", "grammar_of", "json_schema_of", "unpack_bitmask"]
