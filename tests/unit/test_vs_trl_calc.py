"""bench/vs_trl.py --task calc: the parts that make the comparison fair, checked without training.

TRL's side must see what Roost's sees: the same prompt token for token (calc's tool spec rendered by
the embedded chat template), the same tool (`calc.run_tool`), the same reward for the same episode
(calc's workflow's, read back from TRL's conversation), the same turn and token limits, calls parsed
alike, and the same optimisation settings on both command lines.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarm.chat.tool_parsers import get_parser, parse
from swarm.config.run import RunConfig
from swarm.model.build import build_tokenizer, task_corpus
from swarm.model.tokenizer import render_chat
from swarm.tasks import calc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import _vs_trl_calc as calc_bench  # noqa: E402  (bench/ is not a package)
import vs_trl  # noqa: E402

QUESTION = [{"role": "user", "content": "What is 47*85?"}]


@pytest.fixture(scope="module")
def tokenizer():
    """The embedded recipe's tokenizer and chat template (trained on a small corpus: seconds)."""
    return calc_bench.prepare_tokenizer(build_tokenizer(task_corpus(seed=0, per_task=50), 512))


def test_trl_prompt_is_roosts(tokenizer) -> None:
    rendered = tokenizer.apply_chat_template(
        QUESTION, tools=[calc_bench.MultiplyTool()], add_generation_prompt=True, tokenize=False
    )
    assert rendered == render_chat(QUESTION, add_generation_prompt=True, tools=calc.TOOLS)


def test_tool_is_calcs() -> None:
    tool = calc_bench.MultiplyTool()
    assert tool == calc.TOOLS[0] and tool.__name__ == calc.TOOL_NAME  # how TRL finds it by the call's name
    assert callable(tool) and not inspect.iscoroutinefunction(tool)
    assert tool(a=47, b=85) == calc.run_tool("multiply", {"a": 47, "b": 85}) == "3995"
    for args in ({"a": "47", "b": 85}, {"a": 4}, {"x": 1, "y": 2}, {"a": True, "b": 3}, {"a": 1.5, "b": 2}):
        assert tool(**args) == calc.run_tool("multiply", args)
        assert tool(**args).startswith("Error")


class _Scripted:
    """An OpenAI client whose assistant turns are given: each a text answer or a list of calls."""

    def __init__(self, turns: list) -> None:
        self.turns = list(turns)
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **_: object) -> SimpleNamespace:
        turn = self.turns.pop(0)
        if isinstance(turn, str):
            message = SimpleNamespace(content=turn, tool_calls=None)
        else:
            calls = [
                SimpleNamespace(id=f"c{k}", function=SimpleNamespace(name="multiply", arguments=json.dumps(args)))
                for k, args in enumerate(turn)
            ]
            message = SimpleNamespace(content="", tool_calls=calls)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def _trl_conversation(turns: list) -> list[dict]:
    """The same turns as TRL's tool loop leaves them for the reward function: at most
    `max_tool_calling_iterations` tool rounds, the last turn's calls (if any) not run."""
    tool = calc_bench.MultiplyTool()
    rounds = calc_bench.config_kwargs()["max_tool_calling_iterations"]
    out: list[dict] = []
    for k, turn in enumerate(turns[: rounds + 1]):
        if isinstance(turn, str):
            out.append({"role": "assistant", "content": turn})
            break
        calls = [{"type": "function", "function": {"name": "multiply", "arguments": args}} for args in turn]
        out.append({"role": "assistant", "content": "", "tool_calls": calls})
        if k == rounds:
            break
        out += [{"role": "tool", "name": "multiply", "content": str(tool(**args))} for args in turn]
    return out


RIGHT, WRONG = {"a": 47, "b": 85}, {"a": 47, "b": 86}
EPISODES = {
    "call, answer": [[RIGHT], "3995"],
    "call, answer with spaces": [[RIGHT], " 3995\n"],
    "call, wrong answer": [[RIGHT], "3990"],
    "miscopied call, its result": [[WRONG], str(47 * 86)],
    "answer at once": ["3995"],
    "estimate at once": ["4000"],
    "bad call, retry, answer": [[{"a": "x", "b": 85}], [RIGHT], "3995"],
    "two calls in a turn": [[WRONG, RIGHT], "oops"],
    "three calls, no answer": [[WRONG], [WRONG], [RIGHT]],
    "three wrong calls": [[WRONG], [WRONG], [WRONG]],
    "right first, then calls": [[RIGHT], [WRONG], [WRONG]],
}


@pytest.mark.parametrize("name", list(EPISODES))
def test_reward_is_the_workflows(name: str) -> None:
    turns = EPISODES[name]
    episode = SimpleNamespace(openai=_Scripted(turns), model="m")
    roost = calc.workflow({"question": "What is 47*85?", "answer": "3995"}, episode)
    trl = calc_bench.episode_reward(_trl_conversation(turns), "3995")
    assert trl == roost
    assert calc_bench.reward([_trl_conversation(turns)], ["3995"]) == [roost]


def test_turn_limits_match() -> None:
    kwargs = calc_bench.config_kwargs()
    assert kwargs["generation_kwargs"]["max_new_tokens"] == calc.MAX_TOKENS  # a turn: one call's max_tokens
    assert kwargs["max_tool_calling_iterations"] + 1 == calc.MAX_TURNS  # model turns: the first + one per round
    assert kwargs["max_completion_length"] >= calc.MAX_TURNS * calc.MAX_TOKENS


def test_tool_turn_fits_its_budget(tokenizer) -> None:
    """TRL counts tool turns against `max_completion_length`: the longest result calc's tool gives
    (an error) must fit `TOOL_TURN_BUDGET`, so that the total never binds where Roost has none."""
    errors = [calc.run_tool("multiply", a) for a in ("{", "[]", {"a": "x", "b": 1})] + [calc.run_tool("add", {})]
    for content in [str(99 * 99), *errors]:
        call = {"type": "function", "function": {"name": "multiply", "arguments": RIGHT}}
        messages = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [call]}]
        before = render_chat(messages)
        after = render_chat([*messages, {"role": "tool", "content": content}], add_generation_prompt=True)
        suffix = after[before.rindex("<|im_end|>") :]
        assert len(tokenizer.encode(suffix, add_special_tokens=False)) <= calc_bench.TOOL_TURN_BUDGET


TEXTS = [
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 47, "b": 85}}\n</tool_call>',
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 47, "b": 85}}\n</tool_call>\n'
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 4, "b": 5}}\n</tool_call>',
    'sure <tool_call>\n{"name": "multiply", "arguments": {"a": 47, "b": 85}}\n</tool_call>',
    "3995",
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 47, "b": 8\n</tool_call>',  # malformed JSON
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 47, "b": 85}}',  # cut off before the close tag
]


@pytest.mark.parametrize("text", TEXTS)
def test_calls_parse_alike(tokenizer, text: str) -> None:
    """TRL's parse (its `parse_response` with our response template) against Roost's server parser."""
    trl_chat = pytest.importorskip("trl.chat_template_utils")
    prompt = tokenizer.apply_chat_template(
        QUESTION, tools=[calc_bench.MultiplyTool()], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ids = tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
    got = trl_chat.parse_response(tokenizer, ids, prefix=prompt, tools=[calc_bench.MultiplyTool()])
    roost = parse(get_parser("hermes"), text)
    trl_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in got.get("tool_calls") or []]
    assert trl_calls == [(c.name, json.loads(c.arguments)) for c in roost.calls]
    assert (got["content"] or "").strip() == (roost.content or "").strip()


def _flags(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(argv, [*argv[1:], ""]) if a.startswith("--")}


def test_both_command_lines_match(tmp_path: Path) -> None:
    trl = vs_trl.trl_settings(tmp_path, "calc")
    roost = _flags(vs_trl.roost_argv("calc", tmp_path / "model", tmp_path / "roost", 60.0))
    assert roost["--task"] == "calc" and "--no-group-call" in roost  # an episode per sample
    assert int(roost["--group-size"]) == trl["num_generations"]
    assert int(roost["--group-size"]) * int(roost["--batch-groups"]) == trl["per_device_train_batch_size"]
    assert int(roost["--concurrency"]) == trl["per_device_train_batch_size"]  # a whole step in flight
    assert float(roost["--lr"]) == trl["learning_rate"] and trl["lr_scheduler_type"] == "constant"
    assert float(roost["--clip-eps"]) == trl["epsilon"]
    assert float(roost["--kl-coef"]) == trl["beta"] == 0.0
    assert roost["--loss-agg"] == "token-mean" and trl["loss_type"] == "dapo"
    assert roost["--advantage"] == "grpo" and trl["scale_rewards"] == "group"
    assert trl["temperature"] == 1.0 and trl["num_iterations"] == 1 and trl["adam_beta2"] == 0.99
    assert trl["max_tool_calling_iterations"] == calc.MAX_TURNS - 1
    assert trl["generation_kwargs"] == {"max_new_tokens": calc.MAX_TOKENS}


def test_arith_command_lines_unchanged(tmp_path: Path) -> None:
    """--task arith (the default) keeps its settings: 8 tokens, groups in one call."""
    trl = vs_trl.trl_settings(tmp_path)
    assert trl["max_completion_length"] == 8 and "max_tool_calling_iterations" not in trl
    roost = vs_trl.roost_argv("arith", tmp_path / "model", tmp_path / "roost", 60.0)
    assert roost[roost.index("--concurrency") + 1] == "8" and "--group-call" in roost
    no_group = vs_trl.roost_argv("arith", tmp_path / "model", tmp_path / "roost", 60.0, group_call=False)
    assert no_group[no_group.index("--concurrency") + 1] == "64" and "--group-call" not in no_group
    # said, not left to the default: arith's default is a group in one call, and a bench that only
    # left the flag out ran --no-group-call as group calls (406 "one-call" steps/min against TRL's 289)
    assert "--no-group-call" in no_group and RunConfig(task="arith").grouped
