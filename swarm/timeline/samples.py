"""Turn an episode's merged segments into `TrainSample`s carrying its reward."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    choice_rewards: Sequence[float] | None = None,
) -> list[TrainSample]:
    """Samples of one finished episode.

    `agent_rewards` overrides the episode reward for named agents (teams where
    roles are scored separately). With `per_episode_norm`, the episode's samples
    share a total weight of 1 so episodes that split into many samples (branchy
    or history-rewriting agents) do not dominate the batch.

    `choice_rewards`: the episode is one call with n choices (n calls of one prompt),
    scored one by one. Each choice is a sample with its own reward and its own unit id
    (`<episode>/<i>`), so the group-relative advantage compares the choices with each
    other: the choices are the GRPO group. ValueError when the calls are not that.
    """
    if choice_rewards is not None:
        return _choice_samples(calls, episode_id, group_id, choice_rewards, per_episode_norm)
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


def _choice_samples(
    calls: Sequence[Call], episode_id: str, group_id: str, rewards: Sequence[float], per_episode_norm: bool
) -> list[TrainSample]:
    if len(calls) != len(rewards):
        raise ValueError(
            f"choice_rewards has {len(rewards)} rewards for {len(calls)} recorded choices: "
            "score every choice of the episode's one call, in order"
        )
    if any(c.prompt_ids != calls[0].prompt_ids or c.agent != calls[0].agent for c in calls):
        raise ValueError(
            "choice_rewards needs an episode of one call (its n choices share one prompt); "
            "this episode made several calls"
        )
    weight = 1.0 / len(calls) if per_episode_norm else 1.0
    out = []
    for i, (call, reward) in enumerate(zip(calls, rewards)):
        [s] = merge([call], enabled=False)
        out.append(
            TrainSample(
                input_ids=s.input_ids,
                loss_mask=s.loss_mask,
                rollout_logprobs=s.logprobs,
                episode_id=f"{episode_id}/{i}",
                group_id=group_id,
                reward=float(reward),
                weight=weight,
                policy_version=s.policy_version,
            )
        )
    return out
