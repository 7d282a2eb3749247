"""Row layout of a batched KV cache: left padding, splicing, shared prefixes.

Rows of a batch are right-aligned (left-padded, the padding masked), so every row's next token
lands in the same last column. These helpers build and join such layouts; the batcher owns
when they are used. `cache_kwargs` / `returned_cache` pass a cache to a model and take it back
under the name its transformers version uses.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and attention mask [n, longest] with each prompt right-aligned."""
    width = max(len(p) for p in prompts)
    flat: list[int] = []
    for p in prompts:
        flat += [0] * (width - len(p))
        flat += p
    ids = torch.tensor(flat, dtype=torch.long).view(len(prompts), width)
    lens = torch.tensor([len(p) for p in prompts])
    attn = (torch.arange(width).unsqueeze(0) >= (width - lens).unsqueeze(1)).long()
    return ids, attn


def common_prefix(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own (its last)."""
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for i in range(n):
        t = first[i]
        if any(p[i] != t for p in prompts):
            return i
    return max(n, 0)


def pad_left(t: torch.Tensor, width: int, dim: int = -1) -> torch.Tensor:
    """`t` with zeros (masked padding) prepended along `dim` up to `width`."""
    extra = width - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def cat_left_padded(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """Concatenate two [B, H, L, D] caches along batch after left-padding L to `width`."""
    return torch.cat([pad_left(a, width, dim=2), pad_left(b, width, dim=2)], dim=0)


@functools.cache
def _cache_name(model_type: type) -> str:
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`{name: cache}` for `model(...)`: transformers 5.2x renamed `past_key_values` to `cache` and
    warns (a FutureWarning per forward, into every server log) on the old name; older versions
    know only the old one. Decided once per model class, from its `forward` signature."""
    return {_cache_name(type(model)): cache}


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned: `out.cache`, or `out.past_key_values` before the rename
    (reading the old name on a new output logs a deprecation warning)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
