"""Pure policy-gradient math: advantages and losses (tensors in, tensors out; no I/O)."""

from swarm.algorithms.advantages import ESTIMATORS, compute_advantages, grpo, reinforce_pp_baseline, rloo
from swarm.algorithms.losses import (
    LOSS_AGG,
    PPOTerms,
    entropy_from_logits,
    kl_k3,
    loss_scales,
    masked_sum_mean,
    ppo_clip_loss,
    token_logprobs,
)

__all__ = [
    "ESTIMATORS",
    "LOSS_AGG",
    "PPOTerms",
    "compute_advantages",
    "entropy_from_logits",
    "grpo",
    "kl_k3",
    "loss_scales",
    "masked_sum_mean",
    "ppo_clip_loss",
    "reinforce_pp_baseline",
    "rloo",
    "token_logprobs",
]
