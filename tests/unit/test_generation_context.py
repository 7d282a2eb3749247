"""The generation core runs on a `GenerationContext` alone: an engine, a gate, a renderer, limits
and counters, with no `Swarm` (no batcher, registry, leases or config file) behind it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from swarm.engine.fake import FakeEngine
from swarm.samples import Call
from swarm.server.counters import Counters
from swarm.server.episodes import Episode
from swarm.server.events import StepTopic
from swarm.server.exceptions import InvalidRequest
from swarm.server.generation import ChatTurn, GenerationCore, Sampling, Started, TextDelta
from swarm.server.generation_context import GenerationContext, GenerationLimits
from swarm.server.render import ChatRenderer
from swarm.server.trainer import GenerationGate
from swarm.testing import tiny_model_dir

LIMITS = GenerationLimits(
    max_prompt_chars=1000,
    max_tokens_limit=64,
    default_max_tokens=16,
    default_temperature=1.0,
    temperature=None,
    generate_timeout_s=None,
    tool_parser="hermes",
    continuity="exact",
)
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> FakeEngine:
    return FakeEngine(tiny_model_dir(tmp_path_factory.mktemp("genctx")), seed=0, script=lambda ids: "hello there")


@pytest.fixture
def made(engine: FakeEngine) -> Iterator[tuple[GenerationCore, list[tuple[Episode, Call]]]]:
    recorded: list[tuple[Episode, Call]] = []
    ctx = GenerationContext(
        engine,
        GenerationGate(),
        ChatRenderer(engine.tokenizer),
        limits=lambda: LIMITS,
        counters=Counters(),
        record=lambda ep, call: recorded.append((ep, call)),
    )
    core = GenerationCore(ctx)
    yield core, recorded
    core.pool.shutdown()


def _episode() -> Episode:
    return Episode("ep-1", "task", "family", "group", {}, 0, created_at=0.0, lease_expires_at=1e18)


def test_an_evaluation_turn_runs_and_is_counted(made: Any) -> None:
    core, recorded = made

    async def go() -> Any:
        prepared = await core.prepare_chat(ChatTurn(messages=[{"role": "user", "content": "hi"}]))
        return await prepared.run()

    result = asyncio.run(go())
    assert result.choices[0].text == "hello there" and result.choices[0].finish_reason == "stop"
    assert result.usage.completion_tokens == len(result.choices[0].ids) > 0
    assert recorded == []  # no episode: generated, never recorded
    assert core.ctx.counters.snapshot() == {
        "eval_calls": 1,
        "eval_completion_tokens": result.usage.completion_tokens,
        "prompt_continued": 0,
        "prompt_drift": 0,
    }


def test_an_episode_turn_streams_records_and_remembers_its_tool_calls(made: Any, engine: FakeEngine) -> None:
    core, recorded = made
    ep = _episode()
    engine.script = lambda ids: CALL

    async def go() -> list[Any]:
        prepared = await core.prepare_chat(
            ChatTurn(
                messages=[{"role": "user", "content": "1+2?"}],
                tools=TOOLS,
                sampling=Sampling(max_tokens=64),
                episode=ep,
                agent="solver",
            )
        )
        return [e async for e in prepared.stream()]

    try:
        events = asyncio.run(go())
    finally:
        engine.script = lambda ids: "hello there"
    assert isinstance(events[0], Started) and any(isinstance(e, TextDelta) for e in events)
    [(got_ep, call)] = recorded
    assert got_ep is ep and call.agent == "solver" and call.completion_ids
    [choice] = [e.choice for e in events if type(e).__name__ == "Finished"]
    assert choice.finish_reason == "tool_calls" and choice.tool_calls[0].name == "add"
    # the next turn's assistant message is rendered from the exact text generated
    later = core.exact_history(ep, [{"role": "assistant", "tool_calls": [{"id": choice.tool_calls[0].id}]}])
    assert later == [{"role": "assistant", "content": CALL}]
    assert "eval_calls" not in core.ctx.counters


def test_limits_are_read_live(made: Any) -> None:
    core, _ = made
    limits = {"now": LIMITS}
    core.ctx.limits = lambda: limits["now"]
    assert core.params(Sampling(), 5).max_tokens == 16
    limits["now"] = GenerationLimits(**{**LIMITS.__dict__, "temperature": 0.25, "max_tokens_limit": 8})
    params = core.params(Sampling(temperature=1.0), 5)
    assert params.max_tokens == 8 and params.temperature == 0.25
    with pytest.raises(InvalidRequest) as err:
        core.params(Sampling(max_tokens=9), 5)
    assert err.value.code == "max_tokens_too_large"


def test_rows_get_the_eval_counters_when_a_step_topic_is_given(engine: FakeEngine) -> None:
    topic: StepTopic[[int, dict[str, Any]]] = StepTopic("step done")
    counters = Counters()
    core = GenerationCore(
        GenerationContext(
            engine,
            GenerationGate(),
            ChatRenderer(engine.tokenizer),
            limits=lambda: LIMITS,
            counters=counters,
            step_done=topic,
        )
    )
    counters.add("eval_calls", 3)
    row: dict[str, Any] = {}
    asyncio.run(topic.publish(1, row))
    core.pool.shutdown()
    assert row == {"eval_calls": 3, "eval_completion_tokens": 0}


def test_without_a_recorder_an_episode_call_is_refused_loudly(engine: FakeEngine) -> None:
    core = GenerationCore(
        GenerationContext(
            engine, GenerationGate(), ChatRenderer(engine.tokenizer), limits=lambda: LIMITS, counters=Counters()
        )
    )

    async def go() -> Any:
        prepared = await core.prepare_chat(ChatTurn(messages=[{"role": "user", "content": "hi"}], episode=_episode()))
        return await prepared.run()

    with pytest.raises(RuntimeError, match="records no episodes"):
        asyncio.run(go())
    core.pool.shutdown()
