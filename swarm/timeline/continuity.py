"""Token continuity: build a turn's prompt from the exact ids the model saw and produced.

Re-rendering a conversation and tokenizing it again does not always give back the
ids of earlier turns: BPE merges across a boundary differently, or a template
normalises whitespace. Then the model is trained on tokens it never produced, and
the timeline cannot merge turns (no token prefix). Instead, when the new request's
rendering starts with the decoded text of an earlier call (prompt + completion) of
the same episode and agent, the prompt becomes that call's exact ids followed by
the tokenization of only the new text (template glue and new messages).

Template-agnostic: it relies only on `render` (messages -> text) and
`decode`/`encode`. Templates that rewrite history (for example drop earlier
reasoning) fail the text-prefix test and fall back to plain rendering: separate
samples, still correct.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from swarm.samples import Call

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class ContinuedPrompt:
    prompt_ids: list[int]
    extended: int | None  # index of the prior call extended, None when rendered plainly
    drift: bool  # plain re-tokenization would have produced different ids


def continue_prompt(
    text: str,
    priors: Sequence[Call],
    encode: Encode,
    decode: Decode,
    mode: str = "exact",
) -> ContinuedPrompt:
    """Ids for a prompt whose full rendering is `text`.

    `mode="retokenize"` always tokenizes `text` afresh (still reporting drift);
    `mode="exact"` extends the prior call whose decoded ids form the longest
    prefix of `text`.
    """
    plain = encode(text)
    best: tuple[int, int] | None = None  # (prefix length in chars, prior index)
    for i, p in enumerate(priors):
        if not p.completion_ids:
            continue
        prefix = decode(p.prompt_ids + p.completion_ids)
        if prefix and text.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), i)
    if best is None:
        return ContinuedPrompt(plain, None, False)
    chars, i = best
    exact = priors[i].prompt_ids + priors[i].completion_ids + (encode(text[chars:]) if chars < len(text) else [])
    drift = exact != plain
    if mode == "retokenize":
        return ContinuedPrompt(plain, None, drift)
    return ContinuedPrompt(exact, i, drift)
