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
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from swarm.engine.kv_layout import pad_left


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
    """LRU of `PrefilledPrompt`s keyed by the prompt's token ids: at most `max_tokens` prompt tokens
    in all (the KV), and at most `max_entries` prompts (each keeps a vocabulary's worth of logits:
    ~600 KB for Qwen2.5's 151,936 tokens in fp32)."""

    def __init__(self, max_tokens: int = 16384, max_entries: int = 256) -> None:
        self.max_tokens = max_tokens
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], PrefilledPrompt] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, prompt: tuple[int, ...]) -> bool:
        return prompt in self._entries

    def get(self, prompt: tuple[int, ...]) -> PrefilledPrompt | None:
        entry = self._entries.get(prompt)
        if entry is not None:
            self._entries.move_to_end(prompt)
        return entry

    def put(self, prompt: tuple[int, ...], entry: PrefilledPrompt) -> None:
        if len(prompt) > self.max_tokens or prompt in self._entries:
            return
        self._entries[prompt] = entry
        self._tokens += len(prompt)
        while self._tokens > self.max_tokens or len(self._entries) > self.max_entries:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def clear(self) -> None:
        """Forget everything (the weights changed: every stored KV is stale)."""
        self._entries.clear()
        self._tokens = 0


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
