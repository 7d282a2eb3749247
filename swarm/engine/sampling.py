"""Per-row sampling for a batch whose rows asked for different knobs.

Rows of one decode step come from different episodes: each has its own
temperature, top-p and (optionally) seed. Unseeded rows share one generator and
one vectorised draw; seeded rows draw from their own generator so a seed gives
the same tokens whatever else shares the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator | None],
    shared: torch.Generator,
    plain: bool = False,
    nucleus: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens [B], raw logprobs of those tokens [B]).

    The logprob is under the raw model distribution (temperature 1, no nucleus):
    the quantity the trainer recomputes, so importance ratios start at 1.
    `plain` (every row at temperature 1 and top-p 1, known on the host) reuses
    the raw distribution; `nucleus` False skips the top-p sort; None checks.
    """
    logits = logits.float()
    raw_logp = F.log_softmax(logits, dim=-1)
    greedy = temperature <= 0
    if plain:
        probs = raw_logp.exp()
    else:
        scaled = logits / temperature.clamp_min(1e-6).unsqueeze(-1)
        probs = (top_p_filter(scaled, top_p) if nucleus is not False else scaled).softmax(-1)
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
    if not plain:
        tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, raw_logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
