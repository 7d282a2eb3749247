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


__all__ = ["Advantage", "LossAgg"]
