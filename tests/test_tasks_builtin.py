"""Built-in tasks: deterministic datasets, and workflows played against a scripted client."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.tasks import Task, arith, calc, get_task, guess, list_tasks
from swarm.tasks.testing import ScriptedEpisode


def test_registry_lists_builtins():
    assert {"arith", "guess"} <= set(list_tasks())
    for name in list_tasks():
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name and task.family


def test_unknown_task_names_known_ones():
    with pytest.raises(KeyError, match="arith"):
        get_task("nope")


@pytest.mark.parametrize("name", ["arith", "guess", "calc"])
def test_dataset_deterministic_unique_and_prefix_stable(name):
    task = get_task(name)
    a, b = task.dataset(3, 300), task.dataset(3, 300)
    assert a == b
    ids = [item["task_id"] for item in a]
    assert len(set(ids)) == len(ids) and all(isinstance(i, str) for i in ids)
    assert task.dataset(3, 50) == a[:50]
    assert task.dataset(4, 300) != a


@pytest.mark.parametrize("name", ["arith", "guess", "calc", "duet"])
def test_transcripts_deterministic(name):
    task = get_task(name)
    assert task.transcripts(1, 50) == task.transcripts(1, 50)
    assert task.transcripts(1, 50, noise=0.5) == task.transcripts(1, 50, noise=0.5)
    for conv in task.transcripts(1, 50):
        assert conv[0]["role"] == "user" and conv[-1]["role"] == "assistant"


def test_duet_transcripts_teach_the_planner_its_rewrite_with_noise():
    """The planner's warm start: each worded problem -> "What is A+B?"; `noise` of them wrong."""
    from swarm.tasks import duet

    items = duet.dataset(1, 400)
    clean = duet.transcripts(1, 400)
    assert [c[0]["content"] for c in clean] == [duet.planner_prompt(i["problem"]) for i in items]
    assert [c[1]["content"] for c in clean] == [i["question"] for i in items]
    noisy = duet.transcripts(1, 400, noise=0.5)
    right = [duet.question_value(c[1]["content"]) == int(i["answer"]) for c, i in zip(noisy, items)]
    assert 0.4 < 1 - sum(right) / len(right) < 0.6  # about half of them wrong
    assert all(duet.question_value(c[1]["content"]) is not None for c in noisy)  # but always well formed


@pytest.mark.parametrize(
    ("plan", "reply", "planner", "executor"),
    [
        ("What is 47+8?", "55", 1.0, 1.0),  # the right question, answered: both did their part
        ("What is 47+8?", "54", 0.5, 0.0),  # the right question, answered wrong: the executor's fault
        ("What is 47+9?", "56", 0.0, 1.0),  # the wrong question, answered right: the planner's fault
        ("What is 47+9?", "55", 0.5, 0.0),  # the wrong question, the problem's answer by luck: no plan credit
        ("47 plus 8", "55", 0.5, 0.0),  # not a question the executor can answer: it cannot be right
    ],
)
def test_duet_rewards_each_role_for_its_own_part(plan, reply, planner, executor):
    from swarm.tasks import duet

    assert duet.rewards(plan, reply, "55") == {"planner": planner, "executor": executor}


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
    assert all(a > b for a, b in zip(rewards[guess.OPT_TURNS - 1 :], rewards[guess.OPT_TURNS :]))
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


# --- calc (tool calling) -----------------------------------------------------------------


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calc_agent(messages: list[dict]) -> str | dict:
    """The ideal model: call multiply with the question's numbers, then repeat the tool's result."""
    if messages[-1]["role"] == "tool":
        return messages[-1]["content"]
    a, b = re.fullmatch(r"What is (\d+)\*(\d+)\?", messages[-1]["content"]).groups()
    return {"content": None, "tool_calls": [_call("call_1", "multiply", f'{{"a": {a}, "b": {b}}}')]}


def test_calc_dataset_is_four_digit_products_beyond_the_models_arithmetic():
    for item in calc.dataset(0, 300):
        a, b = map(int, re.fullmatch(r"What is (\d+)\*(\d+)\?", item["question"]).groups())
        assert item["answer"] == str(a * b) and len(item["answer"]) == 4 and a >= 32 and b >= 32


def test_calc_workflow_calls_the_tool_and_sends_the_result_back():
    episode = ScriptedEpisode(calc_agent)
    item = calc.dataset(0, 1)[0]
    assert calc.workflow(item, episode) == 1.0
    first, second = episode.requests
    assert first["tools"] == calc.TOOLS == second["tools"]
    assert first["max_tokens"] == calc.MAX_TOKENS and first["temperature"] == 1.0
    user, assistant, tool = second["messages"]
    assert user == first["messages"][0]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == "call_1"
    assert assistant["tool_calls"][0]["function"]["name"] == "multiply"
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": item["answer"]}


def test_calc_answering_without_the_tool_is_one_call_and_exact_match():
    item = calc.dataset(0, 1)[0]
    assert calc.workflow(item, ScriptedEpisode(lambda m: f" {item['answer']}\n")) == 1.0
    wrong = ScriptedEpisode(lambda m: str(calc.estimate(int(item["answer"]))))
    assert calc.workflow(item, wrong) == 0.0 and len(wrong.requests) == 1


def test_calc_bad_calls_get_errors_and_endless_calls_end_at_zero():
    item = calc.dataset(0, 1)[0]
    looping = ScriptedEpisode(lambda m: {"content": None, "tool_calls": [_call("c", "multiply", '{"a": "x"}')]})
    assert calc.workflow(item, looping) == 0.0
    assert len(looping.requests) == calc.MAX_TURNS
    assert looping.requests[-1]["messages"][-1]["content"].startswith("Error:")


def test_calc_pays_half_for_the_right_call_and_nothing_for_a_miscopied_one():
    item = calc.dataset(0, 1)[0]
    a, b = map(int, re.fullmatch(r"What is (\d+)\*(\d+)\?", item["question"]).groups())

    def agent(args: str, answer: str):
        return lambda m: (
            answer if m[-1]["role"] == "tool" else {"content": None, "tool_calls": [_call("c", "multiply", args)]}
        )

    right = f'{{"a": {a}, "b": {b}}}'
    assert calc.workflow(item, ScriptedEpisode(agent(right, "1234"))) == calc.RIGHT_CALL_REWARD == 0.5
    miscopied = f'{{"a": {a}, "b": {b + 1}}}'
    assert calc.workflow(item, ScriptedEpisode(agent(miscopied, str(a * (b + 1))))) == 0.0
    looping_right = ScriptedEpisode(lambda m: {"content": None, "tool_calls": [_call("c", "multiply", right)]})
    assert calc.workflow(item, looping_right) == 0.5  # called right, never answered
    assert calc.reward(" 12 ", "12") == 1.0 and calc.reward("13", "12", right_call=True) == 0.5


@pytest.mark.parametrize(
    "name, arguments, expected",
    [
        ("multiply", '{"a": 47, "b": 85}', "3995"),
        ("multiply", {"a": 2, "b": 3}, "6"),
        ("multiply", '{"a": 4.5, "b": 2}', "Error: multiply needs integers a and b"),
        ("multiply", '{"a": true, "b": 2}', "Error: multiply needs integers a and b"),
        ("multiply", "[1, 2]", "Error: arguments must be an object"),
        ("multiply", "{not json", "Error: arguments are not JSON"),
        ("add", '{"a": 1, "b": 2}', "Error: unknown tool 'add'"),
    ],
)
def test_calc_tool(name, arguments, expected):
    assert calc.run_tool(name, arguments) == expected


def test_calc_transcripts_are_the_ideal_episode_or_a_direct_estimate():
    convs = calc.transcripts(0, 400, noise=0.5)
    kinds = {"direct": 0, "slipped": 0, "clean": 0}
    for conv in convs:
        a, b = map(int, re.fullmatch(r"What is (\d+)\*(\d+)\?", conv[0]["content"]).groups())
        if len(conv) == 2:
            assert conv[1] == {"role": "assistant", "content": str(calc.estimate(a * b))}
            kinds["direct"] += 1
            continue
        user, call, tool, answer = conv
        args = json.loads(call["tool_calls"][0]["function"]["arguments"])
        x, y = args["a"], args["b"]
        assert tool["tool_call_id"] == call["tool_calls"][0]["id"] and tool["content"] == str(x * y)
        assert answer == {"role": "assistant", "content": str(x * y)}  # the tool's result, right or not
        if (x, y) == (a, b):
            kinds["clean"] += 1
        else:  # one digit of one argument off by one
            kinds["slipped"] += 1
            assert sorted([abs(x - a), abs(y - b)]) in ([0, 1], [0, 10]) and 10 <= min(x, y) <= max(x, y) <= 99
    assert 80 < kinds["direct"] < 170 and 40 < kinds["slipped"] < 130 and kinds["clean"] > 150
    assert all(len(c) == 4 for c in calc.transcripts(0, 100, noise=0.0))
    # the ideal agent replays every clean transcript's conversation exactly
    for conv in calc.transcripts(1, 20):
        episode = ScriptedEpisode(calc_agent)
        item = {"question": conv[0]["content"], "answer": conv[-1]["content"]}
        assert calc.workflow(item, episode) == 1.0
        sent = episode.requests[-1]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
        assert sent[2]["content"] == conv[2]["content"]


def test_calc_spec_is_what_langchain_derives_from_the_example_tool():
    """The LangGraph example's `@tool multiply` reaches the server as exactly the task's spec."""
    pytest.importorskip("langchain_core")
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from examples.calc_langgraph import multiply
    from examples.calc_openai import TOOLS as OPENAI_EXAMPLE_TOOLS
    from examples.calc_openai import dataset

    assert dataset(3, 40) == calc.dataset(3, 40)
    assert convert_to_openai_tool(multiply) == calc.TOOLS[0]
    assert json.dumps(convert_to_openai_tool(multiply)) == json.dumps(calc.TOOLS[0])  # key order too
    assert OPENAI_EXAMPLE_TOOLS == calc.TOOLS
