"""A scripted tool agent and the checks of its merged sample, shared by the tool-call tests of every route.

The model is a FakeEngine script keyed on the prompt: no tool response yet -> call `add`; one ->
call `mul`; two -> answer. It writes tool calls in the embedded template's Hermes format.
"""

from __future__ import annotations

import json
from typing import Any

from swarm.engine.fake import FakeEngine
from swarm.model.tokenizer import tool_call_text
from swarm.samples import Call, TrainSample
from swarm.testing import RunningServer


def agent_script(engine: FakeEngine) -> Any:
    def script(ids: list[int]) -> str:
        prompt = engine.tokenizer.decode(ids)
        if prompt.endswith('"arguments": '):  # a forced call (tool_choice names a function)
            return '{"a": 5, "b": 6}}\n</tool_call>'
        done = prompt.count("<tool_response>")
        if done == 0:
            return "I will add first.\n" + tool_call_text("add", '{"a": 12,  "b": 30}')
        if done == 1:
            return tool_call_text("mul", {"a": 42, "b": 2})
        return "The answer is 84."

    return script


def run_tool(name: str, arguments: str) -> str:
    args = json.loads(arguments)
    return str(args["a"] + args["b"] if name == "add" else args["a"] * args["b"])


def check_one_sample(srv: RunningServer, calls: list[Call], sample: TrainSample) -> None:
    """One merged sample; each call's completion trained once, at its place, nothing else trained."""
    assert sample.input_ids == calls[-1].full
    trained = [0] * len(sample.input_ids)
    for c in calls:
        lo, hi = len(c.prompt_ids), len(c.prompt_ids) + len(c.completion_ids)
        assert sample.input_ids[lo:hi] == c.completion_ids
        assert sample.loss_mask[lo:hi] == [1] * (hi - lo)
        assert sample.rollout_logprobs[lo:hi] == c.logprobs
        trained[lo:hi] = [1] * (hi - lo)
    assert sample.loss_mask == trained
    assert sum(sample.loss_mask) == sum(len(c.completion_ids) for c in calls)


def finish_and_sample(srv: RunningServer, ep: Any) -> tuple[list[Call], list[TrainSample]]:
    calls = list(srv.swarm.registry.get(ep.id).calls)
    ep.finish(1.0)
    return calls, srv.swarm.batcher.groups[ep.group_id].finished[0].samples
