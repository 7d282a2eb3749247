"""A GRPO group sampled in one call: `n` choices, a reward per choice (`choice_rewards`).

The claims that matter: each choice trains as its own sample with its own reward and its own
advantage (choices with equal rewards are still separate members of the group), a finish whose
rewards do not fit the calls is a 400 that leaves the episode open, and the fleet and the
built-in arith workflow drive it end to end against a real server on loopback.
"""

from __future__ import annotations

import time

import httpx
import pytest

from swarm.client import SwarmClient, run_fleet
from swarm.engine import TrainConfig
from swarm.engine.policy_step import sample_advantages
from swarm.samples import Call
from swarm.tasks import arith
from swarm.timeline import episode_samples

MESSAGES = [{"role": "user", "content": "What is 12+30?"}]


def _calls(n: int, prompt: list[int] | None = None) -> list[Call]:
    return [Call("main", prompt or [1, 2, 3], [10 + i, 20 + i], [-0.5, -0.25], 4) for i in range(n)]


def test_each_choice_is_a_sample_and_a_member_of_the_group() -> None:
    samples = episode_samples(_calls(4), "ep", "g", 0.0, choice_rewards=[1.0, 1.0, 0.0, 0.0])
    assert [s.episode_id for s in samples] == ["ep/0", "ep/1", "ep/2", "ep/3"]
    assert [s.reward for s in samples] == [1.0, 1.0, 0.0, 0.0]
    assert [s.input_ids for s in samples] == [[1, 2, 3, 10 + i, 20 + i] for i in range(4)]
    assert all(s.loss_mask == [0, 0, 0, 1, 1] and s.policy_version == 4 for s in samples)
    # four members, not two units of equal reward: (r - 0.5) / std of four (unbiased, 0.577) = +-0.866;
    # two units would give +-0.707
    assert sample_advantages(samples, TrainConfig()) == pytest.approx([0.866, 0.866, -0.866, -0.866], abs=1e-3)
    uneven = episode_samples(_calls(4), "ep", "g", 0.0, choice_rewards=[1.0, 0.0, 0.0, 0.0])
    assert sample_advantages(uneven, TrainConfig()) == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-3)


def test_choice_rewards_must_fit_one_call() -> None:
    with pytest.raises(ValueError, match="3 rewards for 4"):
        episode_samples(_calls(4), "ep", "g", 0.0, choice_rewards=[1.0, 0.0, 0.0])
    two_turns = _calls(1) + _calls(1, prompt=[1, 2, 3, 10, 20, 7])
    with pytest.raises(ValueError, match="several calls"):
        episode_samples(two_turns, "ep", "g", 0.0, choice_rewards=[1.0, 0.0])


def test_a_group_in_one_call_trains_a_reward_per_choice(make_server) -> None:
    srv = make_server(group_size=1, batch_groups=1)
    client = SwarmClient(srv.url, srv.token)
    ep = client.claim("t1")
    r = ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, n=4, max_tokens=6)
    assert len(r.choices) == 4
    bad = httpx.post(
        f"{srv.url}/swarm/v1/episodes/{ep.id}/finish",
        json={"choice_rewards": [1.0, 0.0]},
        headers={"Authorization": f"Bearer {ep.api_key}"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_choice_rewards", bad.text
    for body in (
        {},
        {"choice_rewards": []},
        {"choice_rewards": ["1"]},
        {"choice_rewards": [1.0] * 4, "agent_rewards": {"a": 1.0}},
    ):
        r = httpx.post(
            f"{srv.url}/swarm/v1/episodes/{ep.id}/finish", json=body, headers={"Authorization": f"Bearer {ep.api_key}"}
        )
        assert r.status_code == 400, (body, r.text)
    done = ep.finish_choices([1.0, 0.0, 0.0, 0.5])  # the episode stayed open through the 400s
    assert done.samples == 4 and done.reward == pytest.approx(0.375)
    deadline = time.monotonic() + 20
    while not srv.swarm.engine.batches and time.monotonic() < deadline:
        time.sleep(0.05)
    [batch] = list(srv.swarm.engine.batches)
    assert sorted(s.reward for s in batch.samples) == [0.0, 0.0, 0.5, 1.0]
    assert len({s.episode_id for s in batch.samples}) == 4 and {s.group_id for s in batch.samples} == {ep.group_id}


def test_the_fleet_and_arith_sample_each_group_in_one_call(make_server) -> None:
    srv = make_server(group_size=1, batch_groups=2)
    client = SwarmClient(srv.url, srv.token)
    stats = run_fleet(client, arith.workflow, arith.dataset(0, 6), n=1, concurrency=3, epochs=1, choices=4)
    assert stats.finished == 6 and stats.failed == 0
    assert srv.swarm.counters["calls"] == 24  # 6 episodes x one call of 4 choices
    deadline = time.monotonic() + 20
    while srv.swarm.trainer.step < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.swarm.trainer.step == 3
    assert all(len(b.samples) == 8 for b in srv.swarm.engine.batches)  # 2 groups x 4 choices a step
    # a workflow that ignores `episode.choices` is told so, never trained as a group of one
    stats = run_fleet(
        client, lambda task, ep: 1.0, arith.dataset(1, 1), n=1, concurrency=1, epochs=1, choices=4, max_attempts=1
    )
    assert stats.finished == 0 and "choices=4" in stats.errors[-1]
