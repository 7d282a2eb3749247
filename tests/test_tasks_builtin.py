"""Built-in tasks: deterministic datasets, and workflows played against a scripted client."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.tasks import Task, get_task, list_tasks
from swarm.tasks import arith, guess
from swarm.tasks.testing import ScriptedEpisode


def test_registry_lists_builtins():
    assert {"arith", "guess"} <= set(list_tasks())
    for name in list_tasks():
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name and task.family


def test_unknown_task_names_known_ones():
    with pytest.raises(KeyError, match="arith"):
        get_task("nope")


@pytest.mark.parametrize("name", ["arith", "guess"])
def test_dataset_deterministic_unique_and_prefix_stable(name):
    task = get_task(name)
    a, b = task.dataset(3, 300), task.dataset(3, 300)
    assert a == b
    ids = [item["task_id"] for item in a]
    assert len(set(ids)) == len(ids) and all(isinstance(i, str) for i in ids)
    assert task.dataset(3, 50) == a[:50]
    assert task.dataset(4, 300) != a


@pytest.mark.parametrize("name", ["arith", "guess"])
def test_transcripts_deterministic(name):
    task = get_task(name)
    assert task.transcripts(1, 50) == task.transcripts(1, 50)
    assert task.transcripts(1, 50, noise=0.5) == task.transcripts(1, 50, noise=0.5)
    for conv in task.transcripts(1, 50):
        assert conv[0]["role"] == "user" and conv[-1]["role"] == "assistant"


# --- arith -------------------------------------------------------------------------------

def _solve(question: str) -> str:
    a, op, b = re.fullmatch(r"What is (\d+)([+-])(\d+)\?", question).groups()
    return str(int(a) + int(b) if op == "+" else int(a) - int(b))


def test_arith_dataset_answers_are_right():
    for item in arith.dataset(0, 200):
        assert item["answer"] == _solve(item["question"])
        assert int(item["answer"]) >= 0


def test_arith_ideal_transcripts_are_right():
    for user, assistant in arith.transcripts(0, 200):
        assert assistant["content"] == _solve(user["content"])


def test_arith_noisy_transcripts_are_mostly_near_misses():
    convs = arith.transcripts(0, 400, noise=0.5)
    wrong = [c for c in convs if c[1]["content"] != _solve(c[0]["content"])]
    assert 120 < len(wrong) < 280
    for user, assistant in wrong:
        assert abs(int(assistant["content"]) - int(_solve(user["content"]))) <= 10


def test_arith_correct_answer_scores_one():
    item = arith.dataset(0, 1)[0]
    episode = ScriptedEpisode(lambda messages: f" {_solve(messages[-1]['content'])}\n")
    assert arith.workflow(item, episode) == 1.0
    (request,) = episode.requests
    assert request["model"] == "scripted"
    assert request["messages"] == [{"role": "user", "content": item["question"]}]
    assert request["max_tokens"] <= 16 and request["temperature"] == 1.0


@pytest.mark.parametrize("reply", ["", "12345", "the answer", "55 apples"])
def test_arith_wrong_answer_scores_zero(reply):
    item = {"task_id": "t", "question": "What is 47+8?", "answer": "55"}
    assert arith.workflow(item, ScriptedEpisode(lambda m: reply)) == 0.0


# --- guess -------------------------------------------------------------------------------

def _bounds(messages: list[dict]) -> tuple[int, int]:
    """What a perfect player knows: the interval left by the feedback so far."""
    lo, hi = guess.LOW, guess.HIGH
    for said, heard in zip(messages[1::2], messages[2::2]):
        value = guess.parse_guess(said["content"])
        if value is None:
            continue
        if heard["content"] == "Higher.":
            lo = max(lo, value + 1)
        elif heard["content"] == "Lower.":
            hi = min(hi, value - 1)
    return lo, hi


def binary_search(messages: list[dict]) -> str:
    lo, hi = _bounds(messages)
    return str((lo + hi) // 2)


@pytest.mark.parametrize("secret", range(guess.LOW, guess.HIGH + 1))
def test_guess_binary_search_always_wins_full_reward(secret):
    episode = ScriptedEpisode(binary_search)
    assert guess.workflow({"task_id": "g", "secret": secret}, episode) == 1.0
    assert len(episode.requests) <= guess.OPT_TURNS


def test_guess_is_multi_turn_with_feedback_and_full_history():
    episode = ScriptedEpisode(binary_search)
    assert guess.workflow({"task_id": "g", "secret": 1}, episode) == 1.0  # 8, 4, 2, 1
    assert len(episode.requests) >= 4
    for k, request in enumerate(episode.requests):
        messages = request["messages"]
        assert len(messages) == 2 * k + 1
        assert messages[0] == {"role": "user", "content": guess.intro()}
        if k:  # each call re-sends the previous call's conversation plus two messages
            assert messages[:-2] == episode.requests[k - 1]["messages"]
            assert messages[-2]["role"] == "assistant"
            assert messages[-1] == {"role": "user", "content": "Lower."}


def test_guess_feedback_directions():
    seen = []
    replies = iter(["3", "12", "7"])
    episode = ScriptedEpisode(lambda m: (seen.append(m[-1]["content"]), next(replies))[1])
    assert guess.workflow({"task_id": "g", "secret": 7}, episode) == 1.0
    assert seen == [guess.intro(), "Higher.", "Lower."]


def test_guess_never_found_scores_zero_after_max_turns():
    episode = ScriptedEpisode(lambda m: "1")
    assert guess.workflow({"task_id": "g", "secret": 16}, episode) == 0.0
    assert len(episode.requests) == guess.MAX_TURNS


def test_guess_invalid_reply_wastes_a_turn():
    replies = iter(["banana", "99", "", "5"])
    episode = ScriptedEpisode(lambda m: next(replies))
    reward = guess.workflow({"task_id": "g", "secret": 5}, episode)
    assert reward == guess.turn_reward(4)
    assert [r["messages"][-1]["content"] for r in episode.requests[1:]] == [guess.INVALID] * 3


def test_guess_late_wins_are_worth_less_but_positive():
    rewards = [guess.turn_reward(t) for t in range(1, guess.MAX_TURNS + 1)]
    assert rewards[: guess.OPT_TURNS] == [1.0] * guess.OPT_TURNS
    assert all(a > b for a, b in zip(rewards[guess.OPT_TURNS - 1:], rewards[guess.OPT_TURNS:]))
    assert 0 < rewards[-1] < 1 and guess.turn_reward(guess.MAX_TURNS + 1) == 0.0


def test_guess_ideal_transcripts_follow_the_game():
    for conv in guess.transcripts(0, 100):
        secret = int(conv[-1]["content"])
        for said, heard in zip(conv[1::2], conv[2::2]):
            assert heard["content"] == guess.feedback(int(said["content"]), secret)
        assert len(conv[1::2]) <= guess.OPT_TURNS


@settings(max_examples=60, deadline=None)
@given(st.integers(guess.LOW, guess.HIGH), st.integers(0, 2**32 - 1))
def test_guess_reward_in_unit_interval_for_any_player(secret, seed):
    rng = random.Random(seed)
    pool = [str(i) for i in range(0, 20)] + ["", "x", " 7 ", "3.5"]
    episode = ScriptedEpisode(lambda m: rng.choice(pool))
    reward = guess.workflow({"task_id": "g", "secret": secret}, episode)
    assert 0.0 <= reward <= 1.0
    assert 1 <= len(episode.requests) <= guess.MAX_TURNS
