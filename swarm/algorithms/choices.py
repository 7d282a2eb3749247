"""The algorithm choices, one enum each, defined once.

Every other place that names them (the config models, the CLIs derived from
them, the live-control API, the researcher's knobs, the verl mapping) takes its
choices from these enums, so adding an estimator is a change here and in the
function that computes it.
"""

from __future__ import annotations

from enum import StrEnum


class Advantage(StrEnum):
    """Group advantage estimator (swarm.algorithms.advantages)."""

    grpo = "grpo"
    rloo = "rloo"
    reinforce_pp = "reinforce_pp"


class LossAgg(StrEnum):
    """How the policy loss averages (verl's `loss_agg_mode` names): over tokens or over samples."""

    token_mean = "token-mean"
    seq_mean_token_mean = "seq-mean-token-mean"


class DistillMode(StrEnum):
    """How on-policy distillation scores the student's tokens (swarm.algorithms.distill).

    `sampled`: the reverse KL estimated on the sampled token, as an advantage (tinker-cookbook's;
    any teacher, a URL too). `full`: the exact reverse KL over the whole vocabulary at every
    sampled position, as a loss term (GKD's; a local teacher, whose logits the step reads).
    """

    sampled = "sampled"
    full = "full"


__all__ = ["Advantage", "DistillMode", "LossAgg"]
