"""A group sampled in one call trains the same after a restart as before it (the `--resume` loss spike).

Each choice of a group call is its own member of the GRPO group (`<episode>/<i>`,
tests/server/test_group_call.py). The durable buffer used to restore every sample of a row
under the row's id, so a replayed group collapsed into its distinct rewards: four choices
all rewarded 1.0 became a group of one (advantage = the reward, 1.0, instead of 0), and
[1, 1, 0, 0] two units (+-0.707 instead of +-0.866). On a well-trained arith run most
groups are all-correct, hence the first step after `--resume` showing loss -0.69 where
every other step had |loss| <= 0.1.
"""

from __future__ import annotations

import time
from pathlib import Path

from swarm.client import SwarmClient
from swarm.engine import TrainConfig
from swarm.engine.policy_step import sample_advantages
from swarm.samples import Call
from swarm.server.buffer import DurableBuffer, encode_samples
from swarm.timeline import episode_samples

MESSAGES = [{"role": "user", "content": "What is 12+30?"}]


def _calls(n: int) -> list[Call]:
    return [Call("main", [1, 2, 3], [10 + i, 20 + i], [-0.5, -0.25], 4) for i in range(n)]


def test_the_buffer_keeps_each_choice_a_member_of_its_group(tmp_path: Path) -> None:
    buf = DurableBuffer(tmp_path / "buffer.sqlite")
    played = {}
    for ep, rewards in (("a", [1.0, 1.0, 1.0, 1.0]), ("b", [1.0, 1.0, 0.0, 0.0])):
        played[ep] = episode_samples(_calls(4), ep, f"g-{ep}", 0.0, choice_rewards=rewards)
        buf.add(
            episode_id=ep,
            group_id=f"g-{ep}",
            task_id=ep,
            task_family="arith",
            epoch=0,
            policy_version=4,
            status="ok",
            reward=sum(rewards) / 4,
            state="buffered",
            idempotency_key=None,
            response={},
            payload={"samples": encode_samples(played[ep])},
        )
    restored = {row.id: row.samples() for row in buf.buffered()}
    buf.close()
    for ep, samples in played.items():
        assert [s.episode_id for s in restored[ep]] == [s.episode_id for s in samples]
        assert sample_advantages(restored[ep], TrainConfig()) == sample_advantages(samples, TrainConfig())
    assert sample_advantages(restored["a"], TrainConfig()) == [0.0] * 4  # not 1.0: a group of four equals
    # rows written before sample ids were stored still load (one member per row, as they trained then)
    old = encode_samples(played["b"])
    for s in old:
        del s["episode_id"]
    buf = DurableBuffer(tmp_path / "old.sqlite")
    buf.add(
        episode_id="b",
        group_id="g-b",
        task_id="b",
        task_family="arith",
        epoch=0,
        policy_version=4,
        status="ok",
        reward=0.5,
        state="buffered",
        idempotency_key=None,
        response={},
        payload={"samples": old},
    )
    assert {s.episode_id for s in buf.buffered()[0].samples()} == {"b"}
    buf.close()


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert predicate()


def test_a_replayed_group_call_trains_with_its_own_advantages(make_server) -> None:
    """Step 1 trains, then two group-call episodes are acknowledged but not trained when the server
    stops; the restart replays them: the step they train sees the advantages they had when played."""
    srv = make_server(group_size=1, batch_groups=1)
    client = SwarmClient(srv.url, srv.token)
    ep = client.claim("t0")
    ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, n=4, max_tokens=4)
    ep.finish_choices([1.0, 0.0, 0.0, 0.0])
    _wait(lambda: srv.swarm.trainer.step == 1)
    srv.stop()  # checkpoint at step 1
    srv = make_server(group_size=1, batch_groups=3)  # room for three groups: two never make a step
    client = SwarmClient(srv.url, srv.token)
    for task, rewards in (("t1", [1.0, 1.0, 1.0, 1.0]), ("t2", [1.0, 1.0, 0.0, 0.0])):
        ep = client.claim(task)
        ep.openai.chat.completions.create(model=ep.model, messages=MESSAGES, n=4, max_tokens=4)
        ep.finish_choices(rewards)
    assert srv.swarm.trainer.step == 1
    srv.stop()
    srv = make_server(group_size=1, batch_groups=2)  # resumes step 1; the two groups fill its window
    _wait(lambda: srv.swarm.trainer.step == 2)
    [batch] = list(srv.swarm.engine.batches)
    assert len({s.episode_id for s in batch.samples}) == 8
    by_group = {}
    for s, a in zip(batch.samples, sample_advantages(batch.samples, TrainConfig())):
        by_group.setdefault(s.group_id, []).append((s.reward, round(a, 3)))
    assert sorted(sorted(v) for v in by_group.values()) == [
        [(0.0, -0.866), (0.0, -0.866), (1.0, 0.866), (1.0, 0.866)],
        [(1.0, 0.0), (1.0, 0.0), (1.0, 0.0), (1.0, 0.0)],
    ]
    assert srv.swarm.counters["episodes_replayed"] == 2
