"""Training forwards that compute a prompt shared by several samples once.

A GRPO group is `group_size` completions of one prompt, so a training batch holds every
prompt `group_size` times. For a chat prompt with a short answer the prompt is most of the
positions (arith: 16 of ~20), and the plain forward computes each copy again. Here the
samples of a micro-batch are grouped by their *prefix* (every token before the first trained
one: the first prompt), each distinct prefix runs once through the base model with a KV cache,
the cache is indexed out to its samples (`index_select`: autograd sums their gradients back
into the one prefix computation), and only the suffixes (completion, later turns) run per
sample, attending to it. The hidden state that predicts a suffix's first token is the
prefix's last one; the rest come from the suffix forward. Exactly the update of the plain
forward, up to float rounding (attention summed in two pieces), checked against it in
tests/unit/test_shared_prefix.py.

Layout: prefixes left-padded (their last position is the last column), suffixes right-padded,
one attention mask over [prefix | suffix] and explicit positions, as the generation batcher
lays out its KV cache (swarm/engine/continuous.py).

Used by `policy_step` only where it is exact and pays: model types whose logits are
`lm_head(hidden)` (PLAIN_HEAD_MODELS), no sliding-window attention, and a batch whose
positions shrink by at least `MIN_SAVING` (`plan`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from swarm.engine.base import TrainSample
from swarm.engine.kv_layout import cache_kwargs, left_padded, returned_cache

#: use the shared forward when it saves at least this share of the positions
MIN_SAVING = 0.25


def split_point(sample: TrainSample) -> int:
    """Tokens before the first trained one (>= 1: the first token is never a target)."""
    for i, m in enumerate(sample.loss_mask):
        if m and i > 0:
            return i
    return len(sample.input_ids)


def plan(samples: Sequence[TrainSample], budget: int) -> list[list[list[int]]] | None:
    """Micro-batches as lists of prefix groups (sample indices sharing a prefix), or None when
    sharing would save under `MIN_SAVING` of the positions (the plain forward is then as good).

    Each micro-batch keeps (groups x longest prefix + rows x longest suffix) within `budget`
    tokens; a group too big for it is split into chunks that each compute the prefix again.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(tuple(s.input_ids[: split_point(s)]), []).append(i)
    total = sum(len(s.input_ids) for s in samples)
    shared = sum(len(p) * len(ix) for p, ix in groups.items()) - sum(len(p) for p in groups)
    if total == 0 or shared < MIN_SAVING * total:
        return None
    lengths = [len(s.input_ids) for s in samples]
    chunks: list[tuple[int, list[int]]] = []  # (prefix length, rows)
    for prefix, rows in groups.items():
        p = len(prefix)
        rows = sorted(rows, key=lambda i: lengths[i])
        while rows:  # at least one row per chunk, whatever the budget
            take = 1
            while take < len(rows) and p + (take + 1) * (lengths[rows[take]] - p) <= budget:
                take += 1
            chunks.append((p, rows[:take]))
            rows = rows[take:]
    chunks.sort(key=lambda c: (c[0], max(lengths[i] for i in c[1])))
    batches: list[list[list[int]]] = []
    cur: list[list[int]] = []
    p_max = s_max = n_rows = 0
    for p, rows in chunks:
        s_long = max(lengths[i] for i in rows) - p
        cost = (len(cur) + 1) * max(p_max, p) + (n_rows + len(rows)) * max(s_max, s_long)
        if cur and cost > budget:
            batches.append(cur)
            cur, p_max, s_max, n_rows = [], 0, 0, 0
        cur.append(rows)
        p_max, s_max, n_rows = max(p_max, p), max(s_max, s_long), n_rows + len(rows)
    if cur:
        batches.append(cur)
    return batches


def usable(model: torch.nn.Module) -> bool:
    """Whether the model's attention over a full KV cache equals its attention over the whole row."""
    cfg = model.config
    return not (getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True))


class SharedPrefixBatch:
    """One micro-batch in the shared layout; `pos` indexes the flattened [rows, suffix width] grid
    of "column j predicts suffix token j" at the trained tokens, in row-major order."""

    def __init__(
        self,
        samples: Sequence[TrainSample],
        groups: list[list[int]],
        adv: list[float],
        scales: list[float],
        device: torch.device,
        token_adv: Sequence[Sequence[float]] | None = None,
    ) -> None:
        order = [i for rows in groups for i in rows]  # row r of the suffix batch is sample order[r]
        cuts = [split_point(samples[rows[0]]) for rows in groups]
        prefix_ids, prefix_attn = left_padded([samples[rows[0]].input_ids[:c] for rows, c in zip(groups, cuts)])
        row_group = torch.tensor([g for g, rows in enumerate(groups) for _ in rows])
        row_cut = [cuts[g] for g, rows in enumerate(groups) for _ in rows]
        suffixes = [samples[i].input_ids[c:] for i, c in zip(order, row_cut)]
        width = max(len(x) for x in suffixes)
        flat_ids: list[int] = []
        flat_mask: list[int] = []
        flat_old: list[float] = []
        flat_extra: list[float] = []
        for i, c, suffix in zip(order, row_cut, suffixes):
            pad = width - len(suffix)
            s = samples[i]
            flat_ids += suffix + [0] * pad
            flat_mask += s.loss_mask[c:] + [0] * pad
            flat_old += s.rollout_logprobs[c:] + [0.0] * pad
            if token_adv is not None:
                flat_extra += list(token_adv[i][c:]) + [0.0] * pad
        n = len(order)
        lens = torch.tensor([len(x) for x in suffixes])
        suffix_attn = (torch.arange(width).unsqueeze(0) < lens.unsqueeze(1)).long()
        mask = torch.tensor(flat_mask, dtype=torch.bool)
        pos = mask.nonzero().squeeze(-1)
        rows = pos // width
        self.tokens = sum(len(samples[i].input_ids) for i in order)
        self.row_group = row_group.to(device, non_blocking=True)
        self.prefix_ids = prefix_ids.to(device, non_blocking=True)
        self.prefix_attn = prefix_attn.to(device, non_blocking=True)
        self.prefix_pos = (self.prefix_attn.cumsum(-1) - 1).clamp_min(0)
        self.suffix_ids = torch.tensor(flat_ids, dtype=torch.long).view(n, width).to(device, non_blocking=True)
        self.attn = torch.cat([self.prefix_attn[self.row_group], suffix_attn.to(device)], dim=1)
        cut = torch.tensor(row_cut, device=device).unsqueeze(1)
        self.suffix_pos = cut + torch.arange(width, device=device).unsqueeze(0)
        self.pos = pos.to(device, non_blocking=True)
        self.targets = self.suffix_ids.reshape(-1)[self.pos]
        self.old = torch.tensor(flat_old, dtype=torch.float32)[pos].to(device, non_blocking=True)
        self.adv = torch.tensor([adv[i] for i in order], dtype=torch.float32)[rows].to(device, non_blocking=True)
        if token_adv is not None:  # per-token advantage terms (distillation) on top of the episode's
            self.adv += torch.tensor(flat_extra, dtype=torch.float32)[pos].to(device, non_blocking=True)
        self.w = torch.tensor([samples[i].weight * scales[i] for i in order], dtype=torch.float32)[rows].to(
            device, non_blocking=True
        )


def shared_hidden(base: torch.nn.Module, mb: SharedPrefixBatch) -> torch.Tensor:
    """Final hidden states [N, H] at the trained positions of `mb` (N = its trained tokens)."""
    cache = DynamicCache()
    head = base(
        input_ids=mb.prefix_ids,
        attention_mask=mb.prefix_attn,
        position_ids=mb.prefix_pos,
        **cache_kwargs(base, cache),
        use_cache=True,
    )
    rows = DynamicCache()
    for j, layer in enumerate(returned_cache(head).layers):  # each sample attends to its group's prefix
        rows.update(layer.keys.index_select(0, mb.row_group), layer.values.index_select(0, mb.row_group), j)
    tail = base(
        input_ids=mb.suffix_ids,
        attention_mask=mb.attn,
        position_ids=mb.suffix_pos,
        **cache_kwargs(base, rows),
        use_cache=True,
    ).last_hidden_state
    last = head.last_hidden_state[:, -1:].index_select(0, mb.row_group)  # predicts each suffix's first token
    hidden = torch.cat([last, tail[:, :-1]], dim=1)
    return hidden.reshape(-1, hidden.shape[-1])[mb.pos]
