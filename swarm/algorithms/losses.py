"""Policy-gradient losses on token tensors: PPO-clip, KL estimators, entropy.

All functions take [batch, time] tensors plus a float `weights` tensor that is
zero on tokens that are not trained (prompt, tool output, padding) and carries
per-sample weights elsewhere. Aggregation is a weighted sum over the whole
batch divided by a batch-wide `denom` (callers doing gradient accumulation pass
it); `loss_scales` turns the aggregation mode ("token-mean", as in DAPO/verl's
default, or "seq-mean-token-mean") into per-sample weights and that denominator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from swarm.algorithms.choices import LossAgg


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target_t | prefix) for every position; logits [B,T,V], targets [B,T]."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref): unbiased, always >= 0, low variance."""
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return log_ratio.exp() - log_ratio - 1.0


LOSS_AGG = tuple(m.value for m in LossAgg)


def loss_scales(masks: Sequence[Sequence[int]], weights: Sequence[float], mode: str) -> tuple[list[float], float]:
    """Per-sample multipliers of the token weights, and the loss denominator, of an aggregation mode.

    The loss is sum over samples s and trained tokens t of scale_s * weight_s * l_st, over the
    denominator (verl's `loss_agg_mode` of the same names):

    * `token-mean`: scale 1, denominator the weighted count of trained tokens. Every token weighs
      the same, so long samples dominate the step (the DAPO choice; verl's default).
    * `seq-mean-token-mean`: scale 1/(trained tokens of s), denominator the sum of weights: each
      sample's tokens average first, then the samples. A 3-token answer weighs as much as a
      300-token dialogue, which a task mix of short and long tasks wants.

    `masks` are the loss masks as the loss sees them (targets: the first position dropped).
    """
    if mode == "token-mean":
        denom = sum(sum(m) * w for m, w in zip(masks, weights))
        return [1.0] * len(masks), max(float(denom), 1e-8)
    if mode == "seq-mean-token-mean":
        scales = [1.0 / max(1, sum(m)) for m in masks]
        denom = sum(w for m, w in zip(masks, weights) if sum(m))
        return scales, max(float(denom), 1e-8)
    raise ValueError(f"unknown loss aggregation {mode!r}; one of {', '.join(LOSS_AGG)}")


def masked_sum_mean(x: torch.Tensor, weights: torch.Tensor, denom: float | torch.Tensor) -> torch.Tensor:
    return (x * weights).sum() / denom


@dataclass
class PPOTerms:
    loss: torch.Tensor
    pg_loss: torch.Tensor
    clipfrac: torch.Tensor
    approx_kl: torch.Tensor


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    denom: float | torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> PPOTerms:
    """Clipped surrogate: -min(r A, clip(r, 1-eps_lo, 1+eps_hi) A), weighted token mean.

    `old_logp` are the rollout logprobs recorded by the engine at generation time;
    on-policy the ratio is 1 up to kernel noise and this reduces to REINFORCE with
    a group baseline, while off-policy (stale) samples are kept in a trust region.
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    pg = masked_sum_mean(per_token, weights, denom)
    clipfrac = masked_sum_mean((clipped > unclipped).float(), weights, denom)
    approx_kl = masked_sum_mean(kl_k3(logp.detach(), old_logp), weights, denom)
    return PPOTerms(loss=pg, pg_loss=pg.detach(), clipfrac=clipfrac.detach(), approx_kl=approx_kl.detach())
