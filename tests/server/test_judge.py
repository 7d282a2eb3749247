"""`swarm.rewards.Judge`: the semantics against a scripted judge; the plumbing against a real server."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from swarm.rewards import Judge, JudgeError, judge_group
from swarm.rewards.judge import parse, prompt

GROUP = [
    "What is 2+2? 4",
    "What is 2+2? 5",
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
]


class Scripted:
    """An OpenAI-shaped client that answers each call with the next scripted text (or raises it)."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=answer))])


def test_scores_come_back_in_order_and_ties_stay_ties() -> None:
    client = Scripted('{"scores": [1, 0, 1]}')
    assert Judge(rubric="right answers", model="j", client=client).group(GROUP) == [1.0, 0.0, 1.0]
    (call,) = client.calls
    assert call["response_format"]["json_schema"]["schema"]["properties"]["scores"]["minItems"] == 3
    text = call["messages"][1]["content"]
    assert "### Trajectory 1\nWhat is 2+2? 4" in text and "### Trajectory 3\nuser: 2+2?\nassistant: 4" in text
    assert "Rubric: right answers" in call["messages"][0]["content"]


def test_a_nonsense_answer_is_asked_again_then_refused_with_what_it_said() -> None:
    client = Scripted("sure!", '{"scores": [0.5, 0.2]}', '{"scores": [0.5, 2, 0.1]}')
    with pytest.raises(JudgeError, match="3 tries") as info:
        Judge(rubric="r", model="j", client=client, retries=2).group(GROUP)
    assert info.value.answers == ["sure!", '{"scores": [0.5, 0.2]}', '{"scores": [0.5, 2, 0.1]}']
    assert "not JSON" in str(info.value) and "2 scores for 3" in str(info.value) and "score 2" in str(info.value)


def test_a_failed_call_is_retried_and_a_fallback_is_explicit() -> None:
    # the request a timed-out call carries (openai 3.x reads its headers when the error is made: None fails)
    timed_out = openai.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))
    client = Scripted(timed_out, '{"scores": [0.25, 0.75, 0.5]}')
    assert Judge(rubric="r", model="j", client=client, retries=1).group(GROUP) == [0.25, 0.75, 0.5]
    down = Scripted(*[ConnectionError("refused")] * 3)
    assert Judge(rubric="r", model="j", client=down, retries=2, fallback=0.5).group(GROUP) == [0.5] * 3
    with pytest.raises(ValueError, match="fallback"):
        Judge(rubric="r", model="j", client=down, fallback=2.0)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 0]", 'no "scores" list'),
        ('{"scores": [true, 0]}', "score True"),
        ('{"scores": [NaN, 0]}', "score nan"),
        ('{"scores": ["1", 0]}', "score '1'"),
        ('{"scores": [-0.1, 0]}', "score -0.1"),
    ],
)
def test_parse_names_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        parse(text, 2)


def test_long_trajectories_are_cut_so_every_one_is_seen() -> None:
    messages = prompt("r", ["x" * 10_000, "short"], max_chars=100)
    assert "short" in messages[1]["content"] and "…[truncated]" in messages[1]["content"]
    assert len(messages[1]["content"]) < 400


@pytest.mark.slow
def test_a_real_server_judges_under_its_json_schema(make_server, model_dir: Path) -> None:
    """The plumbing: the worker token's evaluation call on the torch engine, constrained by the schema, always
    parses (the tiny model's opinions are noise; its answers' shape is the server's guarantee)."""
    pytest.importorskip("torch")
    from swarm.engine.torch_engine import TorchEngine

    srv = make_server(engine=TorchEngine(model_dir, seed=0, device="cpu"))
    for n in (2, 4):
        rewards = judge_group(
            [f"attempt {i}" for i in range(n)],
            "right answers",
            model=srv.swarm.model_name,
            base_url=f"{srv.url}/v1",
            api_key=srv.token,
            max_tokens=96,
            retries=0,
        )
        assert len(rewards) == n and all(0 <= r <= 1 for r in rewards)
