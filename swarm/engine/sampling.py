"""Per-row sampling for a batch whose rows asked for different knobs.

Rows of one decode step come from different episodes: each has its own
temperature, top-p and (optionally) seed. Unseeded rows share one generator and
one vectorised draw; seeded rows draw from their own generator so a seed gives
the same tokens whatever else shares the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from swarm.engine.base import SamplingParams


@dataclass(frozen=True)
class RowKnobs:
    """A batch's per-row knobs as device tensors plus host-side flags (built when rows change)."""

    temperature: torch.Tensor  # [B]
    top_p: torch.Tensor  # [B]
    plain: bool  # every row at temperature 1 and top-p 1
    nucleus: bool  # some row has top-p < 1
    top_k: int  # the largest top_logprobs any row asked for (0: nobody)
    constrained: tuple[int, ...]  # indices of the rows with a grammar

    @classmethod
    def of(cls, params: Sequence[SamplingParams], constrained: Sequence[int], device: torch.device) -> RowKnobs:
        temps = [p.temperature for p in params]
        tops = [p.top_p for p in params]
        return cls(
            torch.tensor(temps, device=device),
            torch.tensor(tops, device=device),
            plain=all(t == 1.0 for t in temps) and all(p >= 1.0 for p in tops),
            nucleus=any(p < 1.0 for p in tops),
            top_k=max((p.top_logprobs for p in params), default=0),
            constrained=tuple(constrained),
        )


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's nucleus; `top_p` is [B] in (0, 1]."""
    if bool((top_p >= 1.0).all()):
        return logits
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    cum = probs.cumsum(-1)
    # keep a token if the mass before it is < p (so the top token is always kept)
    remove = (cum - probs) >= top_p.unsqueeze(-1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, sorted_idx, sorted_logits)


class Sampled(NamedTuple):
    """One decode step's draw: tokens [B], their raw logprobs [B], and (when asked) the top-k."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor | None = None  # [B, k] most likely first, under the raw distribution
    top_logprobs: torch.Tensor | None = None  # [B, k] their raw logprobs


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator | None],
    shared: torch.Generator,
    plain: bool = False,
    nucleus: bool | None = None,
    *,
    top_k: int = 0,
    constrained: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> Sampled:
    """Sample one token per row; return the tokens, their raw logprobs and optionally the top-k.

    The logprob is under the raw model distribution (temperature 1, no nucleus, no grammar mask):
    the quantity the trainer recomputes, so importance ratios start at 1. `top_k` > 0 also returns
    the k most likely tokens of every row under that same raw distribution (one `topk`; nothing at
    all is computed for it when 0). `plain` (every row at temperature 1 and top-p 1, known on the
    host) reuses the raw distribution; `nucleus` False skips the top-p sort; None checks.

    `constrained` (row indices [n]) with `allowed` ([n, V] bool) restricts those rows to their
    grammar's tokens: the mask applies to the sampling distribution (before top-p, as vLLM does)
    and to greedy picks, never to the returned logprobs. The other rows draw exactly as they would
    without the constrained ones in the batch (same probabilities, same uniforms).
    """
    logits = logits.float()
    raw_logp = F.log_softmax(logits, dim=-1)
    greedy = temperature <= 0
    if plain:
        probs = raw_logp.exp()
    else:
        scaled = logits / temperature.clamp_min(1e-6).unsqueeze(-1)
        probs = (top_p_filter(scaled, top_p) if nucleus is not False else scaled).softmax(-1)
    greedy_pick = logits.argmax(-1) if not plain else None
    if constrained is not None and allowed is not None:
        masked = logits[constrained].masked_fill(~allowed, float("-inf"))
        row_t = temperature[constrained].clamp_min(1e-6).unsqueeze(-1)
        sub = top_p_filter(masked / row_t, top_p[constrained]) if nucleus is not False else masked / row_t
        probs = probs.index_copy(0, constrained, sub.softmax(-1))
        if greedy_pick is not None:
            greedy_pick = greedy_pick.index_copy(0, constrained, masked.argmax(-1))
    # inverse-CDF sampling: one uniform per row, from the row's own generator when
    # it has a seed, so seeded rows are reproducible whatever shares the batch.
    u = torch.rand(logits.shape[0], generator=shared)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand(1, generator=g)[0]
    cdf = probs.cumsum(-1)
    cdf = cdf / cdf[:, -1:].clamp_min(1e-12)
    tokens = torch.searchsorted(cdf, u.to(cdf.device).unsqueeze(-1)).squeeze(-1).clamp_max(logits.shape[-1] - 1)
    # a uniform landing in a zero-probability tail must not pick a masked token
    tokens = torch.where(probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) > 0, tokens, probs.argmax(-1))
    if greedy_pick is not None:
        tokens = torch.where(greedy, greedy_pick, tokens)
    logps = raw_logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if top_k <= 0:
        return Sampled(tokens, logps)
    top_logps, top_ids = raw_logp.topk(min(top_k, raw_logp.shape[-1]), dim=-1)
    return Sampled(tokens, logps, top_ids, top_logps)
