"""Group-relative advantages: GRPO, RLOO and REINFORCE++-baseline.

Every estimator here takes one scalar reward per episode plus the id of its group
(episodes of the same task) and returns one scalar advantage per episode. Token
level broadcasting is the loss's business. The formulas follow verl's
`core_algos` (unbiased std, epsilon 1e-6, a lone episode gets advantage 0) so a
run on the torch engine and one on the verl engine agree; tests check parity.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from swarm.algorithms.choices import Advantage

EPS = 1e-6


def _groups(group_ids: Sequence[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        out[g].append(i)
    return out


def grpo(rewards: torch.Tensor, group_ids: Sequence[str], normalize_std: bool = True) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps); mean 0 / std 1 for a group of one."""
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for idx in _groups(group_ids).values():
        r = rewards[idx].float()
        if len(idx) == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = r.mean(), r.std()
        adv[idx] = (r - mean) / (std + EPS) if normalize_std else r - mean
    return adv


def rloo(rewards: torch.Tensor, group_ids: Sequence[str]) -> torch.Tensor:
    """Leave-one-out baseline: r_i - mean of the other n-1 rewards of the group."""
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    for idx in _groups(group_ids).values():
        r = rewards[idx].float()
        n = len(idx)
        if n == 1:
            adv[idx] = 0.0
        else:
            adv[idx] = r * n / (n - 1) - r.mean() * n / (n - 1)
    return adv


def reinforce_pp_baseline(rewards: torch.Tensor, group_ids: Sequence[str]) -> torch.Tensor:
    """Group mean subtracted, then whitened across the whole batch (REINFORCE++-baseline)."""
    centered = grpo(rewards, group_ids, normalize_std=False)
    if centered.numel() < 2:
        return centered
    return (centered - centered.mean()) / (centered.std() + EPS)


ESTIMATORS = tuple(a.value for a in Advantage)


def compute_advantages(
    rewards: Sequence[float], group_ids: Sequence[str], method: str = "grpo", normalize_std: bool = True
) -> list[float]:
    """Advantages for episodes given their rewards and group ids (lists in, list out)."""
    if len(rewards) != len(group_ids):
        raise ValueError("rewards and group_ids differ in length")
    r = torch.tensor(list(rewards), dtype=torch.float32)
    if method == "grpo":
        adv = grpo(r, group_ids, normalize_std)
    elif method == "rloo":
        adv = rloo(r, group_ids)
    elif method == "reinforce_pp":
        adv = reinforce_pp_baseline(r, group_ids)
    else:
        raise ValueError(f"unknown advantage estimator {method!r}; choose one of {ESTIMATORS}")
    return adv.tolist()
