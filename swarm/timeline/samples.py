"""Turn an episode's merged segments into `TrainSample`s carrying its reward."""

from __future__ import annotations

from typing import Mapping, Sequence

from swarm.samples import Call, TrainSample
from swarm.timeline.merge import merge


def episode_samples(
    calls: Sequence[Call],
    episode_id: str,
    group_id: str,
    reward: float,
    agent_rewards: Mapping[str, float] | None = None,
    merge_enabled: bool = True,
    per_episode_norm: bool = False,
) -> list[TrainSample]:
    """Samples of one finished episode.

    `agent_rewards` overrides the episode reward for named agents (teams where
    roles are scored separately). With `per_episode_norm`, the episode's samples
    share a total weight of 1 so episodes that split into many samples (branchy
    or history-rewriting agents) do not dominate the batch.
    """
    segments = merge(calls, enabled=merge_enabled)
    weight = 1.0 / len(segments) if (per_episode_norm and segments) else 1.0
    rewards = dict(agent_rewards or {})
    return [
        TrainSample(
            input_ids=s.input_ids,
            loss_mask=s.loss_mask,
            rollout_logprobs=s.logprobs,
            episode_id=episode_id,
            group_id=group_id,
            reward=float(rewards.get(s.agent, reward)),
            weight=weight,
            policy_version=s.policy_version,
        )
        for s in segments
    ]
