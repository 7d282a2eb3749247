"""Pure policy-gradient math: advantages and losses (tensors in, tensors out; no I/O).

The names below are imported on first use (PEP 562): the config models and the
CLIs need `swarm.algorithms.choices` at start-up and should not pay for torch.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from swarm.algorithms.choices import Advantage, LossAgg

_LAZY = {
    **dict.fromkeys(
        ["ESTIMATORS", "compute_advantages", "grpo", "reinforce_pp_baseline", "rloo"], "swarm.algorithms.advantages"
    ),
    **dict.fromkeys(["distill_advantages", "mean_reverse_kl", "reverse_kl"], "swarm.algorithms.distill"),
    **dict.fromkeys(
        [
            "LOSS_AGG",
            "PPOTerms",
            "entropy_from_logits",
            "kl_k3",
            "loss_scales",
            "masked_sum_mean",
            "ppo_clip_loss",
            "token_logprobs",
        ],
        "swarm.algorithms.losses",
    ),
}

if _typing.TYPE_CHECKING:
    from swarm.algorithms.advantages import ESTIMATORS, compute_advantages, grpo, reinforce_pp_baseline, rloo
    from swarm.algorithms.distill import distill_advantages, mean_reverse_kl, reverse_kl
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


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swarm.algorithms' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ESTIMATORS",
    "LOSS_AGG",
    "Advantage",
    "LossAgg",
    "PPOTerms",
    "compute_advantages",
    "distill_advantages",
    "entropy_from_logits",
    "grpo",
    "kl_k3",
    "loss_scales",
    "masked_sum_mean",
    "mean_reverse_kl",
    "ppo_clip_loss",
    "reinforce_pp_baseline",
    "reverse_kl",
    "rloo",
    "token_logprobs",
]
