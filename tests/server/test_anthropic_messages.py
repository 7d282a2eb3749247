"""`POST /v1/messages` driven by the official `anthropic` SDK against a real server on loopback.

The FakeEngine is scripted on the prompt: without a tool result yet it answers with a Hermes
tool call (the embedded template's format), after one it answers in text. A tool episode
(tool_use -> tool_result -> answer) must come back in Anthropic's shapes, streamed or not, and be
recorded so its turns merge into one training sample with every generated token trained once.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from swarm.client import SwarmClient
from swarm.engine.fake import FakeEngine, token_logprob
from swarm.testing import RunningServer
from swarm.timeline import Call, episode_samples

TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]
QUESTION = {"role": "user", "content": "What is 2+3? Use the tool."}
CALL_TEXT = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
ANSWER = "The sum is 5."


@pytest.fixture
def srv(make_server: Any, model_dir: Any) -> RunningServer:
    engine = FakeEngine(model_dir, chunk_tokens=2)

    def script(ids: list[int]) -> str:
        prompt = engine.tokenizer.decode(ids)
        return ANSWER if "<tool_response>" in prompt else CALL_TEXT

    engine.script = script
    return make_server(engine=engine, group_size=1, batch_groups=1)


def _client(srv: RunningServer, key: str, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0, timeout=30, **kw)


def _merged(srv: RunningServer, ep_id: str) -> tuple[list[dict], list]:
    """The episode's recorded calls (from the server's rollout log) and the samples they merge into."""
    records = [json.loads(line) for line in (srv.swarm.out_dir / "rollouts.jsonl").read_text().splitlines()]
    record = next(r for r in records if r["episode_id"] == ep_id)
    calls = [Call(c["agent"], c["prompt_ids"], c["completion_ids"], c["logprobs"]) for c in record["calls"]]
    return record["calls"], episode_samples(calls, ep_id, "g", 1.0)


def _check_one_sample(srv: RunningServer, ep_id: str, turns: int) -> None:
    calls, samples = _merged(srv, ep_id)
    assert len(calls) == turns and len(samples) == 1  # the tool turns merged into one sample
    s = samples[0]
    generated = [t for c in calls for t in c["completion_ids"]]
    assert sum(s.loss_mask) == len(generated)  # every generated token trained once, nothing else
    assert [t for t, m in zip(s.input_ids, s.loss_mask) if m] == generated
    assert [lp for lp, m in zip(s.rollout_logprobs, s.loss_mask) if m] == [token_logprob(t) for t in generated]
    assert s.input_ids == calls[-1]["prompt_ids"] + calls[-1]["completion_ids"]
    assert srv.swarm.counters["prompt_continued"] >= turns - 1


def test_tool_episode_non_streaming(srv: RunningServer) -> None:
    client = SwarmClient(srv.url, srv.token)
    with client.episode(task_id="t-tools") as ep:
        ac = _client(srv, ep.api_key)
        first = ac.messages.create(model=ep.model, max_tokens=256, tools=TOOLS, messages=[QUESTION])
        assert first.stop_reason == "tool_use" and first.id.startswith("msg_") and first.role == "assistant"
        text, use = first.content
        assert text.type == "text" and text.text == "Adding."
        assert use.type == "tool_use" and use.name == "add" and use.input == {"a": 2, "b": 3}
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
        history = [
            QUESTION,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]},
        ]
        second = ac.messages.create(model=ep.model, max_tokens=256, tools=TOOLS, messages=history)
        assert second.stop_reason == "end_turn" and second.stop_sequence is None
        assert [(b.type, b.text) for b in second.content] == [("text", ANSWER)]
        ep.finish(1.0)
    _check_one_sample(srv, ep.id, turns=2)
    assert srv.swarm.counters["prompt_drift"] == 0


def test_tool_episode_streaming(srv: RunningServer) -> None:
    client = SwarmClient(srv.url, srv.token)
    with client.episode(task_id="t-stream") as ep:
        ac = _client(srv, ep.api_key)
        with ac.messages.stream(model=ep.model, max_tokens=256, tools=TOOLS, messages=[QUESTION]) as stream:
            kinds = [e.type for e in stream]
            first = stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert first.stop_reason == "tool_use"
        assert [b.type for b in first.content] == ["text", "tool_use"]
        assert first.content[0].text == "Adding." and first.content[1].input == {"a": 2, "b": 3}
        use = first.content[1]
        history = [
            QUESTION,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "5"}]}],
            },
        ]
        with ac.messages.stream(model=ep.model, max_tokens=256, tools=TOOLS, messages=history) as stream:
            streamed = "".join(stream.text_stream)
            second = stream.get_final_message()
        assert streamed == ANSWER and second.content[0].text == ANSWER and second.stop_reason == "end_turn"
        assert second.usage.output_tokens == len(srv.swarm.registry.get(ep.id).calls[-1].completion_ids)
        ep.finish(1.0)
    _check_one_sample(srv, ep.id, turns=2)


def test_stop_sequence_agent_header_and_bearer(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t-stop")
    ac = _client(srv, ep.api_key, default_headers={"X-Roost-Agent": "coder"})
    msg = ac.messages.create(
        model=ep.model, max_tokens=256, messages=[QUESTION], stop_sequences=["<tool_call>"], system="You add numbers."
    )
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "<tool_call>"
    assert msg.content[0].text == "Adding.\n"
    assert srv.swarm.registry.get(ep.id).calls[-1].agent == "coder"
    r = httpx.post(
        f"{srv.url}/v1/messages",
        headers={"Authorization": f"Bearer {ep.api_key}"},
        json={"model": ep.model, "max_tokens": 8, "messages": [QUESTION]},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["type"] == "message", r.text
    assert len(srv.swarm.registry.get(ep.id).calls) == 2


def test_worker_token_is_an_evaluation_call(srv: RunningServer) -> None:
    before = srv.swarm.counters["calls"]
    msg = _client(srv, srv.token).messages.create(
        model=srv.swarm.model_name, max_tokens=256, tools=TOOLS, messages=[QUESTION]
    )
    assert msg.stop_reason == "tool_use"
    assert srv.swarm.counters["eval_calls"] == 1 and srv.swarm.counters["calls"] == before


def test_count_tokens_counts_what_a_call_would_send_and_records_nothing(srv: RunningServer) -> None:
    """`messages.count_tokens` (Claude Code asks it before compacting a conversation) was a 404."""
    client = SwarmClient(srv.url, srv.token)
    with client.episode(task_id="t-count") as ep:
        ac = _client(srv, ep.api_key)
        counted = ac.messages.count_tokens(model=ep.model, tools=TOOLS, system="Be brief.", messages=[QUESTION])
        assert srv.swarm.counters["calls"] == 0 and srv.swarm.counters["eval_calls"] == 0  # no call made
        sent = ac.messages.create(model=ep.model, max_tokens=256, tools=TOOLS, system="Be brief.", messages=[QUESTION])
        assert counted.input_tokens == sent.usage.input_tokens > 0
        ep.finish(1.0)
    _check_one_sample(srv, ep.id, turns=1)  # counting first left the episode's one call as it was
    plain = _client(srv, srv.token).messages.count_tokens(model=srv.swarm.model_name, messages=[QUESTION])
    assert 0 < plain.input_tokens < counted.input_tokens  # no tools, no system block
    with pytest.raises(anthropic.NotFoundError) as e:
        _client(srv, srv.token).messages.count_tokens(model="nope", messages=[QUESTION])
    assert _error(e.value)["type"] == "not_found_error"


def _error(exc: anthropic.APIStatusError) -> dict:
    body = exc.response.json()
    assert body["type"] == "error" and isinstance(body["error"]["message"], str)
    return body["error"]


def test_errors_in_anthropics_shape(srv: RunningServer) -> None:
    ep = SwarmClient(srv.url, srv.token).claim("t-errors")
    ac = _client(srv, ep.api_key)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    cases: list[tuple[dict, type, str, str]] = [
        (
            {"messages": [{"role": "user", "content": [image]}]},
            anthropic.BadRequestError,
            "invalid_request_error",
            "unsupported_content",
        ),
        (
            {"messages": [QUESTION], "extra_body": {"top_k": 5}},
            anthropic.BadRequestError,
            "invalid_request_error",
            "unsupported_top_k",
        ),
        (
            {"messages": [QUESTION], "extra_body": {"temperature": 3}},
            anthropic.BadRequestError,
            "invalid_request_error",
            "invalid_request",
        ),
        (
            {"messages": [QUESTION], "model": "claude-nope"},
            anthropic.NotFoundError,
            "not_found_error",
            "model_not_found",
        ),
        (
            {"messages": [QUESTION, {"role": "assistant", "content": "The"}]},
            anthropic.BadRequestError,
            "invalid_request_error",
            "unsupported_prefill",
        ),
    ]
    for kw, kind, etype, code in cases:
        with pytest.raises(kind) as exc:
            ac.messages.create(**{"model": ep.model, "max_tokens": 16, **kw})
        err = _error(exc.value)
        assert (err["type"], err["code"]) == (etype, code), err
        assert exc.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(anthropic.AuthenticationError) as exc:
        _client(srv, "not-a-key").messages.create(model=ep.model, max_tokens=8, messages=[QUESTION])
    assert _error(exc.value)["type"] == "authentication_error"
    r = httpx.post(
        f"{srv.url}/v1/messages",
        json={"model": ep.model, "messages": [QUESTION]},
        headers={"x-api-key": ep.api_key, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request" and "max_tokens" in r.text
    r = httpx.post(
        f"{srv.url}/v1/messages",
        content=b"{not json",
        headers={"x-api-key": ep.api_key, "content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(f"{srv.url}/v1/messages", json={})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    ep.abort()
    with pytest.raises(anthropic.ConflictError) as exc:
        ac.messages.create(model=ep.model, max_tokens=8, messages=[QUESTION])
    assert _error(exc.value)["code"] == "episode_aborted"
    assert srv.swarm.counters["http_5xx"] == 0


def test_timeout_after_headers_is_an_in_band_error(make_server: Any, model_dir: Any) -> None:
    engine = FakeEngine(model_dir, script=lambda ids: "word " * 200, token_delay_s=0.05, chunk_tokens=1)
    srv = make_server(engine=engine, generate_timeout_s=0.5)
    ep = SwarmClient(srv.url, srv.token).claim("t-slow")
    with pytest.raises(anthropic.APIStatusError) as exc:
        with _client(srv, ep.api_key).messages.stream(model=ep.model, max_tokens=400, messages=[QUESTION]) as stream:
            for _ in stream:
                pass
    assert exc.value.body["error"]["code"] == "generate_timeout"
    assert srv.swarm.registry.get(ep.id).calls == []  # nothing recorded of a failed stream


def test_auth_is_checked_before_the_body(server) -> None:
    """A stranger's malformed body gets Anthropic's 401, not a parse error: the key is looked at first."""
    r = httpx.post(
        f"{server.url}/v1/messages",
        headers={"x-api-key": "not-a-key", "content-type": "application/json"},
        content=b"{not json",
        timeout=10,
    )
    assert r.status_code == 401, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
