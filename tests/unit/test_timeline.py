"""Timeline merging: hand cases plus hypothesis properties over random call trees."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.timeline import Call, episode_samples, merge, merge_stats


def _call(prompt, completion, agent="main", base=0.0):
    return Call(agent, list(prompt), list(completion), [base - 0.01 * i for i in range(len(completion))])


def test_linear_episode_merges_into_one_sample():
    c1 = _call([1, 2], [3, 4])
    c2 = _call([1, 2, 3, 4, 5], [6])  # user turn 5 appended
    c3 = _call([1, 2, 3, 4, 5, 6, 7, 8], [9, 9])
    segs = merge([c1, c2, c3])
    assert len(segs) == 1
    s = segs[0]
    assert s.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]
    assert s.loss_mask == [0, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    assert s.logprobs[2:4] == c1.logprobs and s.logprobs[5] == c2.logprobs[0]
    st_ = merge_stats([c1, c2, c3], segs)
    assert st_.merge_ratio == 3 and st_.tokens_unmerged == 4 + 6 + 10 and st_.tokens_merged == 10


def test_no_merge_when_history_rewritten():
    c1 = _call([1, 2], [7, 3, 4])  # e.g. reasoning 7 later stripped by the template
    c2 = _call([1, 2, 3, 4, 5], [6])
    segs = merge([c1, c2])
    assert len(segs) == 2
    assert segs[0].loss_mask == [0, 0, 1, 1, 1] and segs[1].loss_mask == [0, 0, 0, 0, 0, 1]


def test_branches_train_shared_call_once():
    root = _call([1], [2])
    b1 = _call([1, 2, 3], [4])
    b2 = _call([1, 2, 5], [6])
    segs = merge([root, b1, b2])
    assert len(segs) == 2
    trained_at_2 = sum(s.loss_mask[1] for s in segs)
    assert trained_at_2 == 1


def test_retries_with_same_prompt_stay_separate():
    a = _call([1, 2], [3])
    b = _call([1, 2], [3, 4])
    host = _call([1, 2, 3, 4, 5], [6])
    segs = merge([a, b, host])
    total = sum(sum(s.loss_mask) for s in segs)
    assert total == 1 + 2 + 1


def test_agents_merge_separately():
    a = _call([1], [2], agent="planner")
    b = _call([1, 2, 3], [4], agent="coder")
    segs = merge([a, b])
    assert len(segs) == 2 and {s.agent for s in segs} == {"planner", "coder"}


def test_merge_off_keeps_one_sample_per_call():
    c1 = _call([1, 2], [3])
    c2 = _call([1, 2, 3, 4], [5])
    assert len(merge([c1, c2], enabled=False)) == 2


def test_episode_samples_weights_and_rewards():
    c1 = _call([1], [2], agent="a")
    c2 = _call([1], [3], agent="b")
    out = episode_samples([c1, c2], "ep", "task", 0.5, agent_rewards={"b": 1.0}, per_episode_norm=True)
    assert [s.reward for s in out] == [0.5, 1.0]
    assert [s.weight for s in out] == [0.5, 0.5]


# ---- properties --------------------------------------------------------------


@st.composite
def call_trees(draw):
    """Random episodes: calls that extend earlier calls (linear, branching), retries,
    several agents, and calls whose history was rewritten (not a prefix)."""
    rng = random.Random(draw(st.integers(0, 10**6)))
    n = draw(st.integers(1, 12))
    agents = ["a", "b", "c"][: draw(st.integers(1, 3))]
    calls: list[Call] = []
    for k in range(n):
        agent = rng.choice(agents)
        mine = [c for c in calls if c.agent == agent]
        kind = rng.random()
        if mine and kind < 0.6:  # continue some earlier call (linear or branch)
            base = rng.choice(mine).full
            prompt = base + [rng.randrange(50) for _ in range(rng.randrange(0, 4))]
        elif mine and kind < 0.75:  # retry an earlier prompt
            prompt = list(rng.choice(mine).prompt_ids)
        elif mine and kind < 0.85:  # rewritten history: drop a generated token
            base = rng.choice(mine).full
            prompt = base[:-1] + [rng.randrange(50)] if len(base) > 1 else [1]
        else:
            prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 5))]
        completion = [rng.randrange(50) for _ in range(rng.randrange(0, 4))]
        calls.append(Call(agent, prompt, completion, [-(k + 1) - i / 10 for i in range(len(completion))], k))
    return calls


@given(call_trees())
@settings(max_examples=300, deadline=None)
def test_every_generated_token_trained_exactly_once(calls):
    segs = merge(calls)
    # (call, position) events covered by mask 1, recovered through logprobs which are unique per event
    trained = sorted(lp for s in segs for m, lp in zip(s.loss_mask, s.logprobs) if m)
    expected = sorted(lp for c in calls for lp in c.logprobs)
    assert trained == expected
    for s in segs:
        assert len(s.input_ids) == len(s.loss_mask) == len(s.logprobs)
        assert all(lp == 0.0 for m, lp in zip(s.loss_mask, s.logprobs) if not m)
        # every masked token sits where one of its own calls generated it, after that call's exact prompt
        for ci in s.calls:
            c = calls[ci]
            lo = len(c.prompt_ids)
            assert s.input_ids[: lo + len(c.completion_ids)] == c.full
            assert s.loss_mask[lo : lo + len(c.completion_ids)] == [1] * len(c.completion_ids)
            assert s.agent == c.agent


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 9), max_size=3), st.lists(st.integers(0, 9), min_size=1, max_size=3)),
        min_size=1,
        max_size=10,
    )
)
@settings(max_examples=200, deadline=None)
def test_linear_conversation_is_one_sample(turns):
    calls, history = [], [1]
    for user, reply in turns:
        prompt = history + user
        calls.append(Call("main", prompt, reply, [0.0] * len(reply)))
        history = prompt + reply
    segs = merge(calls)
    assert len(segs) == 1
    assert segs[0].input_ids == history
