"""Samples shaped like the swarm server's: merged multi-turn, tool tokens unmasked, groups of episodes."""

from __future__ import annotations

import random

from swarm.samples import TrainSample


def sample(
    prompt: list[int],
    turns: list[tuple[list[int], list[int]]],
    reward: float,
    episode: str,
    group: str,
    rng: random.Random,
) -> TrainSample:
    """prompt, then (generated, tool/template) turn pairs; logprobs random on generated tokens only."""
    ids, mask, lps = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    for gen, env in turns:
        ids += gen + env
        mask += [1] * len(gen) + [0] * len(env)
        lps += [-rng.uniform(0.05, 3.0) for _ in gen] + [0.0] * len(env)
    return TrainSample(
        input_ids=ids, loss_mask=mask, rollout_logprobs=lps, episode_id=episode, group_id=group, reward=reward
    )


def batch(groups: int = 3, n: int = 4, seed: int = 0, multi_sample: bool = False) -> list[TrainSample]:
    """`groups` groups of `n` episodes with varied lengths and rewards; optionally 2 samples per episode."""
    rng = random.Random(seed)
    out: list[TrainSample] = []
    for g in range(groups):
        for e in range(n):
            prompt = [rng.randrange(3, 500) for _ in range(rng.randint(2, 9))]
            turns = [
                (
                    [rng.randrange(3, 500) for _ in range(rng.randint(1, 7))],
                    [rng.randrange(3, 500) for _ in range(rng.randint(0, 4))],
                )
                for _ in range(rng.randint(1, 3))
            ]
            turns[-1] = (turns[-1][0], [])  # an episode ends on a generated token
            reward = float(rng.choice([0.0, 0.5, 1.0, 1.0, 0.25 * rng.randint(0, 4)]))
            out.append(sample(prompt, turns, reward, f"ep{g}-{e}", f"task{g}", rng))
            if multi_sample:  # a second, non-prefix-sharing sample of the same episode (context rewrite)
                p2 = [rng.randrange(3, 500) for _ in range(rng.randint(2, 5))]
                out.append(
                    sample(p2, [([rng.randrange(3, 500) for _ in range(3)], [])], reward, f"ep{g}-{e}", f"task{g}", rng)
                )
    return out
