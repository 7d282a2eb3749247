"""Messages to prompt ids, and completion ids back to text.

Token continuity: an agent re-sends its conversation each turn. Re-tokenizing the
rendered text can split the model's own earlier output differently from how it
was generated, which breaks the timeline's prefix merge and trains on ids the
model never produced. So when the rendered prompt *text* starts with the decoded
text of an earlier call of the same episode and agent (prompt + completion), the
new prompt reuses that call's exact ids and tokenizes only the new tail. Where
plain re-tokenization would have produced other ids, `drift` counts it.

Output text follows OpenAI's stop semantics: the stop string and anything after
it are cut from the text, while the token ids keep what was generated up to the
token that completed the stop string (the ids are what training sees). Without a
stop string, `decode(token_ids, skip_special_tokens=True) == text` holds.

Tools render one way whichever route they came by (`canonical_tools`): the chat, Messages and
Responses routes hand the same function to the template as the same dict, keys in one order
(`type`, then `function` with `name`, `description`, `parameters`), so one tool is one prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swarm.chat.tool_grammar import END_OF_TURN, MARKERS
from swarm.samples import Call
from swarm.server.exceptions import InvalidRequest
from swarm.server.prompt_bound import TokenBound
from swarm.timeline import continue_prompt

DIRECT_ENCODE_CHARS = 16384  # longer: through `encode_batch_fast`, which lets the GIL go
REPLACEMENT = "\ufffd"  # an incomplete UTF-8 sequence decodes to this; wait for more bytes


def canonical_tools(tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools as the template sees them on every route: `{"type": "function", "function":
    {"name", "description" (when given), "parameters"}}`, in that key order, other keys (`strict`)
    dropped; a tool of another type passes as it is. Absent parameters read as an empty object schema."""
    if not tools:
        return None
    out: list[dict[str, Any]] = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type", "function") != "function" or not isinstance(fn, dict):
            out.append(t)
            continue
        one: dict[str, Any] = {"name": fn.get("name")}
        if fn.get("description"):
            one["description"] = fn["description"]
        params = fn.get("parameters")
        one["parameters"] = params if params is not None else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": one})
    return out


@dataclass
class Prompt:
    ids: list[int]
    continued: bool = False  # reused an earlier call's exact ids
    drift: bool = False  # plain re-tokenization would have given other ids


class ChatRenderer:
    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        self.tok = tokenizer
        self.vocab_size = vocab_size or len(tokenizer)
        # A fast tokenizer's Rust core, called directly for short texts: `tok.encode` goes through
        # `encode_batch`, which costs ~50% more per short prompt and, unless
        # TOKENIZERS_PARALLELISM=false, wakes a rayon thread pool that spins on the cores the engine
        # needs (the ids are the same). Long texts go through `encode_batch_fast`: it releases the GIL,
        # the single-text call does not, and a long prompt is tokenized in a pool beside the event
        # loop; unlike `encode_batch` it tracks no offsets: half the time and ~30% less memory for a
        # long prompt (the ids are the same).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._rust_encode = getattr(backend, "encode", None)
        self._rust_encode_long = getattr(backend, "encode_batch_fast", None)  # tokenizers >= 0.21
        ids: list[int] = []
        for t in ("<|im_end|>", "<|endoftext|>", getattr(tokenizer, "eos_token", None)):
            i = tokenizer.convert_tokens_to_ids(t) if t else None
            if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id and i not in ids:
                ids.append(i)
        self.stop_token_ids = tuple(ids)
        #: tool-call markers and the end of turn this tokenizer holds as one token each (tool-call grammars)
        self.marker_tokens: dict[str, int] = {}
        for t in (*MARKERS, END_OF_TURN):
            i = tokenizer.convert_tokens_to_ids(t)
            if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id:
                self.marker_tokens[t] = i
        self.bound = TokenBound.of(tokenizer)  # None: no cheap lower bound, prompts are always tokenized

    # -- prompts --------------------------------------------------------------
    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools:
            kwargs["tools"] = canonical_tools(tools)
        try:
            text = self.tok.apply_chat_template(messages, **kwargs)
        except Exception as exc:  # template errors (bad roles, raise_exception) are the client's
            raise InvalidRequest("invalid_messages", f"cannot render messages with the chat template: {exc}") from exc
        if not isinstance(text, str):
            raise InvalidRequest("invalid_messages", "chat template did not render to text")
        return text

    def encode(self, text: str) -> list[int]:
        try:
            if self._rust_encode is not None and len(text) <= DIRECT_ENCODE_CHARS:
                return self._rust_encode(text, add_special_tokens=False).ids
            if self._rust_encode_long is not None:
                return self._rust_encode_long([text], add_special_tokens=False)[0].ids
            return list(self.tok.encode(text, add_special_tokens=False))
        except Exception as exc:  # e.g. lone surrogates that are not valid UTF-8
            raise InvalidRequest("invalid_prompt", f"cannot tokenize the prompt: {exc}") from exc

    def chat_prompt(self, text: str, history: Sequence[Call], agent: str, mode: str = "exact") -> Prompt:
        """Prompt ids for rendered `text`, continuing the longest matching earlier call of `agent`.

        The rule itself lives in `swarm.timeline.continuity` (pure, shared with the benchmarks).
        """
        priors = [c for c in history if c.agent == agent]
        got = continue_prompt(
            text, priors, self.encode, lambda ids: self.tok.decode(ids, skip_special_tokens=False), mode=mode
        )
        return Prompt(list(got.prompt_ids), continued=got.extended is not None, drift=got.drift)

    def past_context(
        self, text: str, history: Sequence[Call], agent: str, context_length: int | None, mode: str = "exact"
    ) -> int | None:
        """A count the prompt of `text` surely reaches (whichever way `chat_prompt` builds it) when even
        that leaves no room in `context_length`; None when it may fit, or nothing bounds it.

        Counted from bytes (`TokenBound`), so such a prompt is refused before it is tokenized. A
        continued prompt is an earlier call's exact ids plus the tokenized tail: where an earlier
        call's text starts `text`, those ids are counted rather than their text (the model's own ids
        may cover more bytes each than a re-tokenization could). Only a prompt past the context by
        its bytes looks at the earlier calls, so an ordinary turn decodes nothing more.
        """
        if self.bound is None or context_length is None:
            return None
        least = self.bound.min_tokens(text)
        if least < context_length or mode != "exact":
            return least if least >= context_length else None
        for c in history:  # the smallest over every call continuity could extend: whichever it picks
            if c.agent != agent or not c.completion_ids:
                continue
            prefix = self.tok.decode(c.prompt_ids + c.completion_ids, skip_special_tokens=False)
            if prefix and text.startswith(prefix):
                tail = self.bound.min_tokens(text[len(prefix) :])
                least = min(least, len(c.prompt_ids) + len(c.completion_ids) + tail)
        return least if least >= context_length else None

    def check_ids(self, ids: Sequence[int]) -> list[int]:
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise InvalidRequest("invalid_prompt", f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return list(ids)

    # -- outputs --------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=False)


class OutputText:
    """Incremental detokenizer for one completion, with stop strings and UTF-8 hold-back.

    `add()` returns the new visible text plus the ids/logprobs kept from this
    chunk; once a stop string appears, `stopped` is set and later ids are dropped.
    """

    def __init__(self, renderer: ChatRenderer, stop: Sequence[str] = ()) -> None:
        self.r = renderer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""  # visible text so far (after stop truncation)
        self.sent = 0  # chars of `text` already handed out
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def add(self, ids: Sequence[int], logprobs: Sequence[float]) -> tuple[str, list[int], list[float]]:
        if self.stopped:
            return "", [], []
        start = len(self.ids)
        if self.stop:
            for tok, lp in zip(ids, logprobs):  # token by token: where exactly the stop completed
                self.ids.append(tok)
                self.logprobs.append(lp)
                if self._cut(self.r.decode(self.ids)):
                    break
        else:
            self.ids += list(ids)
            self.logprobs += list(logprobs)
            self.text = self.r.decode(self.ids)
        return self._emit(final=self.stopped), self.ids[start:], self.logprobs[start:]

    def _cut(self, text: str) -> bool:
        hits = [i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stop) if i >= 0]
        if hits:
            at = min(hits)
            self.matched = next(s for s in self.stop if text.find(s, max(0, self.sent - len(s))) == at)
            self.text = text[:at]
            self.stopped = True
            return True
        self.text = text
        return False

    def finish(self) -> str:
        """The rest of the text (held-back bytes included) once generation ended."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        end = len(self.text)
        if not final:
            while end > self.sent and self.text[end - 1] == REPLACEMENT:
                end -= 1
            for s in self.stop:  # a suffix that may grow into a stop string stays back
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text[end - k : end] == s[:k]:
                        end -= k
                        break
        end = max(end, self.sent)
        delta = self.text[self.sent : end]
        self.sent = end
        return delta
