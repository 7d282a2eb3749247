"""Prefilled prompts kept for reuse: the KV cache and last-position logits of whole prompts.

Why: GRPO samples a group of G completions of one prompt, so the G episodes of a group send
the same first prompt (their first turn), often a few milliseconds apart. Prefilling is most of
the engine's generation work for short answers (on a CPU a 20-token prompt costs ~12 decode
steps), and computing it once per group instead of once per episode cuts that G-fold.

Exact prompts only: a hit is a prompt whose ids are all equal, so the reused KV and logits are
exactly what a fresh prefill would compute with these weights (a multi-turn prompt that merely
starts like a cached one is prefilled in full). The cache depends on the weights: the engine
clears it whenever they change (a train step, a checkpoint load). Bounded by prompt tokens,
least recently used out first.

With several LoRA adapters on one base (rows of different policies in one batch), a prefill is
valid only for the adapter that computed it: such entries are keyed by (adapter, prompt)
(`prompt_key`), and one adapter's entries can be dropped alone (its training step leaves the
other policies' prefills exact).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swarm.engine.kv_layout import pad_left

#: a prompt's ids (prefilled by the model as it is), or (adapter name, ids) for a prompt
#: prefilled through that LoRA adapter; ids are ints, so the two never collide
PromptKey = tuple[int, ...] | tuple[str, tuple[int, ...]]


def prompt_key(prompt_ids: Sequence[int], adapter: str | None = None) -> PromptKey:
    """The cache key of `prompt_ids` prefilled through `adapter` (None: no adapter named, the
    bare ids as before adapters existed)."""
    ids = tuple(prompt_ids)
    return ids if adapter is None else (adapter, ids)


def _adapter_of(key: PromptKey) -> str | None:
    return key[0] if key and isinstance(key[0], str) else None


def _tokens(key: PromptKey) -> int:
    """Prompt tokens of a key (what the budget counts: the entry's KV)."""
    return len(key[1]) if _adapter_of(key) is not None else len(key)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PrefilledPrompt:
    """One prompt's prefill: per-layer keys and values [1, H, L, D], its attention row [1, L]
    (1 = a real token; L may include masked padding) and the logits after its last token [V]."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    attn: torch.Tensor
    logits: torch.Tensor

    @property
    def width(self) -> int:
        return self.attn.shape[1]


class PromptCache:
    """LRU of `PrefilledPrompt`s keyed by `prompt_key` (the prompt's token ids, with the adapter
    that prefilled it if any): at most `max_tokens` prompt tokens
    in all (the KV), and at most `max_entries` prompts (each keeps a vocabulary's worth of logits:
    ~600 KB for Qwen2.5's 151,936 tokens in fp32)."""

    def __init__(self, max_tokens: int = 16384, max_entries: int = 256) -> None:
        self.max_tokens = max_tokens
        self.max_entries = max_entries
        self._entries: OrderedDict[PromptKey, PrefilledPrompt] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: PromptKey) -> bool:
        return key in self._entries

    def get(self, key: PromptKey) -> PrefilledPrompt | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: PromptKey, entry: PrefilledPrompt) -> None:
        size = _tokens(key)
        if size > self.max_tokens or key in self._entries:
            return
        self._entries[key] = entry
        self._tokens += size
        while self._tokens > self.max_tokens or len(self._entries) > self.max_entries:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= _tokens(old)

    def clear(self, adapter: str | None = None) -> None:
        """Forget what the changed weights computed: everything (None: the base or the only
        policy changed, every stored KV is stale), or the entries of one adapter (its training
        step changed only its own LoRA weights)."""
        if adapter is None:
            self._entries.clear()
            self._tokens = 0
            return
        for key in [k for k in self._entries if _adapter_of(k) == adapter]:
            del self._entries[key]
            self._tokens -= _tokens(key)


def split_rows(
    keys: list[torch.Tensor], values: list[torch.Tensor], attn: torch.Tensor, logits: torch.Tensor
) -> list[PrefilledPrompt]:
    """One `PrefilledPrompt` per row of a batched prefill, each its own copy with its leading
    all-padding columns trimmed (a short prompt in a batch of long ones is stored narrow)."""
    out = []
    for i in range(attn.shape[0]):
        row = attn[i]
        start = int(row.argmax()) if bool(row.any()) else 0  # the first real column
        out.append(
            PrefilledPrompt(
                keys=tuple(k[i : i + 1, :, start:].clone() for k in keys),
                values=tuple(v[i : i + 1, :, start:].clone() for v in values),
                attn=attn[i : i + 1, start:].clone(),
                logits=logits[i].clone(),
            )
        )
    return out


def stack(entries: list[PrefilledPrompt]) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Rows side by side, each left-padded (masked) to the widest: per-layer keys and values
    [n, H, W, D], attention [n, W], logits [n, V]."""
    width = max(e.width for e in entries)
    layers = len(entries[0].keys)
    keys = [torch.cat([pad_left(e.keys[j], width, dim=2) for e in entries], dim=0) for j in range(layers)]
    values = [torch.cat([pad_left(e.values[j], width, dim=2) for e in entries], dim=0) for j in range(layers)]
    attn = torch.cat([pad_left(e.attn, width) for e in entries], dim=0)
    logits = torch.stack([e.logits for e in entries])
    return keys, values, attn, logits
