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


def select_rows(cache: Any, attn: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Keep the rows `index` of a batch's KV cache (in place) and of its mask `attn` [B, L], then drop
    the columns that are padding for every row left (wherever they are: masked columns carry nothing,
    and positions are explicit per row), so the cache stays as narrow as its live rows. The new mask."""
    cache.batch_select_indices(index)
    attn = attn[index]
    live = attn.any(0)
    if not bool(live.all()):
        cols = live.nonzero().squeeze(-1)
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(2, cols)
            layer.values = layer.values.index_select(2, cols)
        attn = attn.index_select(1, cols)
    return attn


def repeat_row(cache: Any, n: int) -> None:
    """A one-row cache (a prefix shared by `n` prompts) copied to `n` rows, in place."""
    for layer in cache.layers:
        layer.keys = layer.keys.expand(n, -1, -1, -1).contiguous()
        layer.values = layer.values.expand(n, -1, -1, -1).contiguous()


def splice_rows(cache: Any, attn: torch.Tensor, new_cache: Any, new_attn: torch.Tensor) -> torch.Tensor:
    """Append `new_cache`'s rows (newly prefilled) to `cache`'s in place, left-padding the narrower
    side to the wider one's width. The joined mask."""
    width = max(attn.shape[1], new_attn.shape[1])
    for old_layer, new_layer in zip(cache.layers, new_cache.layers):
        old_layer.keys = cat_left_padded(old_layer.keys, new_layer.keys, width)
        old_layer.values = cat_left_padded(old_layer.values, new_layer.values, width)
    return torch.cat([pad_left(attn, width), pad_left(new_attn, width)], dim=0)


def fused_inputs(
    cache: Any, attn: torch.Tensor, pending: torch.Tensor, prompts: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, positions, attention mask) of one forward in which the batch's `B` running rows feed
    their pending token while `prompts` join it: the running rows' token sits in the step's last
    column (their other columns masked), the new rows' left-padded prompts fill theirs, and the new
    rows join `cache` (in place) with all-masked entries of its current width."""
    dev = attn.device
    b, n = attn.shape[0], len(prompts)
    new_ids, new_attn = left_padded(prompts)
    width = new_ids.shape[1]
    ids = torch.zeros(b + n, width, dtype=torch.long, device=dev)
    ids[:b, -1] = pending
    ids[b:] = new_ids.to(dev)
    step_attn = torch.zeros(b + n, width, dtype=torch.long, device=dev)
    step_attn[:b, -1] = 1
    step_attn[b:] = new_attn.to(dev)
    pos = torch.zeros(b + n, width, dtype=torch.long, device=dev)
    pos[:b, -1] = attn.sum(-1)
    pos[b:] = (step_attn[b:].cumsum(-1) - 1).clamp_min(0)
    for layer in cache.layers:
        layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(n, *layer.keys.shape[1:])], dim=0)
        layer.values = torch.cat([layer.values, layer.values.new_zeros(n, *layer.values.shape[1:])], dim=0)
    joined = torch.cat([torch.cat([attn, attn.new_zeros(n, attn.shape[1])], dim=0), step_attn], dim=1)
    return ids, pos, joined
