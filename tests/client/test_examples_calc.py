"""The calc tool-calling examples (plain OpenAI client, LangGraph ReAct agent) and the built-in
`calc` workflow, run as written against a real swarm server on loopback.

A FakeEngine script plays the ideal model (a `multiply` call with the question's numbers, then
the tool's result), so the runs are deterministic: every episode earns 1.0, its calls continue
each other's exact ids (no drift), and the call -> tool -> answer turns train as one sample.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from swarm.client import SwarmClient, run_fleet
from swarm.engine.fake import FakeEngine
from swarm.model.tokenizer import tool_call_text
from swarm.tasks import calc
from swarm.testing import RunningServer, wait_until

ITEMS = calc.dataset(0, 2)  # x 2 attempts = one step of the fixture's 2 groups of 2


def ideal_model(model_dir: Path) -> Callable[[list[int]], str]:
    """Script: answer the newest tool response, else call multiply with the question's numbers."""
    tok = AutoTokenizer.from_pretrained(model_dir)

    def script(prompt_ids: list[int]) -> str:
        turn = tok.decode(prompt_ids).rsplit("<|im_start|>user\n", 1)[-1]
        result = re.search(r"<tool_response>\n(.*?)\n</tool_response>", turn)
        if result:
            return result.group(1)
        a, b = re.search(r"What is (\d+)\*(\d+)\?", turn).groups()
        return tool_call_text("multiply", {"a": int(a), "b": int(b)})

    return script


def _workflow(name: str) -> Callable:
    if name == "langgraph":
        pytest.importorskip("langgraph.prebuilt")
        pytest.importorskip("langchain_openai")
        from examples.calc_langgraph import workflow
    elif name == "openai":
        from examples.calc_openai import workflow
    else:
        workflow = calc.workflow
    return workflow


@pytest.mark.parametrize("name", ["openai", "langgraph", "builtin"])
def test_calc_workflow_through_a_real_server(
    name: str, make_server: Callable[..., RunningServer], model_dir: Path
) -> None:
    workflow = _workflow(name)
    server = make_server(engine=FakeEngine(model_dir, script=ideal_model(model_dir)))
    with SwarmClient(server.url, server.token) as client:
        stats = run_fleet(client, workflow, ITEMS, n=2, concurrency=4, epochs=1, task_family="calc")
    assert stats.failed == 0 and stats.rewards == [1.0] * 4, stats.errors
    counters = server.swarm.counters
    assert counters["calls"] == 8  # call, then answer, per episode
    assert counters["prompt_continued"] == 4 and counters["prompt_drift"] == 0
    wait_until(lambda: server.engine.batches, timeout=20.0)
    samples = server.engine.batches[0].samples
    assert len(samples) == 4  # one merged sample per episode
    tok = AutoTokenizer.from_pretrained(model_dir)
    for sample in samples:
        trained = tok.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])
        assert trained.startswith('<tool_call>\n{"name": "multiply"') and "</tool_call><|im_end|>" in trained
